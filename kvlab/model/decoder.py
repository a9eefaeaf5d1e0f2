"""Decoder: a minimal Llama / GPT-2 Transformer whose KV cache is an explicit argument of forward."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from kvlab.cache.base import KVCache
from kvlab.model.config import ModelConfig
from kvlab.model.matvec import matvec
from kvlab.model.tokenizer import Tokenizer

# Weights are stored as [in, out] and applied as x @ W. A single row times a contiguous [in, out] matrix streams memory
# markedly faster on CPU than F.linear's x @ W.T over an [out, in] matrix, and batch-1 decoding is bound by how fast the
# weights stream. q/k/v are fused into one matrix and gate/up into another, so a Llama layer does four matrix products,
# each through ``matvec`` (matvec.py: split across threads by the inner dimension for a decode step's few rows).


def _param(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape))


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary angles for integer positions (B, T) -> cos, sin of shape (B, 1, T, hs), in ``dtype``.

    The angles are computed in fp32 whatever ``dtype`` is: bf16 keeps 8 significant bits, so from
    position 256 on, position x frequency would round to steps of 2 radians (4 from 512: positions
    512, 513 and 514 would share one angle). Only cos and sin are cast, as transformers' Llama does.
    """
    freqs = positions[..., None].float() * inv_freq.float()  # (B, T, hs/2), fp32
    emb = torch.cat([freqs, freqs], dim=-1)[:, None]  # (B, 1, T, hs)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + hs/2) of x (B, h, T, hs) by the position's angle (Llama's convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    """Multi-head attention with grouped K/V heads; the cache decides what the queries see."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.nh, self.nkv, self.hs = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        C, qkv = cfg.hidden_size, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim
        gpt2 = cfg.arch == "gpt2"
        self.w_qkv = _param(C, qkv)
        self.b_qkv = _param(qkv) if (cfg.qkv_bias or gpt2) else None
        self.w_o = _param(self.nh * self.hs, C)
        self.b_o = _param(C) if gpt2 else None

    def forward(self, x: torch.Tensor, layer_idx: int, cache: KVCache,
                rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = matvec(x, self.w_qkv)  # (B, T, (nh + 2 nkv) hs)
        if self.b_qkv is not None:
            qkv = qkv + self.b_qkv
        heads = qkv.view(B, T, self.nh + 2 * self.nkv, self.hs).transpose(1, 2)  # (B, nh + 2 nkv, T, hs)
        qk, v = heads.split([self.nh + self.nkv, self.nkv], dim=1)  # (B, nh + nkv, T, hs), (B, nkv, T, hs)
        if rope is not None:
            qk = apply_rope(qk, *rope)  # queries and keys rotate alike: one rotation for both
        q, k = qk.split([self.nh, self.nkv], dim=1)  # (B, nh, T, hs), (B, nkv, T, hs)
        y = cache.attend(layer_idx, q, k, v)  # (B, nh, T, hs): stores k, v, attends over all stored
        y = matvec(y.transpose(1, 2).reshape(B, T, self.nh * self.hs), self.w_o)  # (B, T, C)
        return y if self.b_o is None else y + self.b_o


class MLP(nn.Module):
    """SwiGLU (Llama) or GELU (GPT-2) feed-forward."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        C, I = cfg.hidden_size, cfg.intermediate_size
        self.swiglu = cfg.arch == "llama"
        if self.swiglu:
            self.w_gate_up = _param(C, 2 * I)  # gate and up fused: one product instead of two
            self.w_down = _param(I, C)
        else:
            self.w_fc, self.b_fc = _param(C, I), _param(I)
            self.w_proj, self.b_proj = _param(I, C), _param(C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, up = matvec(x, self.w_gate_up).chunk(2, dim=-1)  # (B, T, I) each
            return matvec(F.silu(gate) * up, self.w_down)  # (B, T, C)
        h = F.gelu(matvec(x, self.w_fc) + self.b_fc, approximate="tanh")  # (B, T, I)
        return matvec(h, self.w_proj) + self.b_proj  # (B, T, C)


class Norm(nn.Module):
    """RMSNorm (Llama) or LayerNorm (GPT-2)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.rms, self.eps = cfg.arch == "llama", cfg.norm_eps
        self.weight = nn.Parameter(torch.ones(cfg.hidden_size))
        self.bias = None if self.rms else nn.Parameter(torch.zeros(cfg.hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.rms:
            return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)
        return F.layer_norm(x, (x.size(-1),), self.weight, self.bias, self.eps)


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm, self.attn = Norm(cfg), Attention(cfg)
        self.mlp_norm, self.mlp = Norm(cfg), MLP(cfg)

    def forward(self, x: torch.Tensor, layer_idx: int, cache: KVCache,
                rope: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), layer_idx, cache, rope)  # (B, T, C)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """Decoder-only Transformer. ``forward(input_ids, cache)`` returns next-token logits.

    The cache is passed in, never kept on the module: the same model serves a cached run, an
    uncached run and many sequences of a serving engine at once.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = cfg = config
        self.embed = _param(cfg.vocab_size, cfg.hidden_size)  # token embeddings (V, C)
        if cfg.arch == "gpt2":
            self.pos_embed: nn.Parameter | None = _param(cfg.max_position_embeddings, cfg.hidden_size)  # learned (P, C)
        else:
            self.pos_embed = None
            inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2).float() / cfg.head_dim))
            self.register_buffer("inv_freq", inv_freq, persistent=False)  # (hs/2,), fp32 always (see _apply)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.final_norm = Norm(cfg)
        # Untied: lm_head stored [in, out] = (C, V). Tied: reuse the embedding (V, C).
        self.lm_head = None if cfg.tie_word_embeddings else _param(cfg.hidden_size, cfg.vocab_size)
        self.tokenizer: Tokenizer | None = None  # set by the loaders; a ByteTokenizer or the checkpoint's own

    def _apply(self, fn, recurse=True):
        """``.to()``, ``.half()``, ``.cuda()`` ... move ``inv_freq`` with the weights but never change its
        dtype: ``Module.to(dtype)`` casts floating buffers, and RoPE's frequencies must stay fp32."""
        inv_freq = getattr(self, "inv_freq", None)
        super()._apply(fn, recurse)
        if inv_freq is not None and self.inv_freq.dtype != torch.float32:
            self.inv_freq = inv_freq.to(device=self.inv_freq.device)  # the fp32 values, on the new device
        return self

    @property
    def device(self) -> torch.device:
        return self.embed.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    def init_weights(self, seed: int = 0, std: float = 0.02) -> "Decoder":
        """Random weights (normal, std 0.02; norms at 1) from a seed: the tiny models of the tests."""
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:  # matrices, embeddings and biases alike
                    p.copy_(torch.randn(p.shape, generator=gen) * std)
        return self

    def forward(self, input_ids: torch.Tensor, cache: KVCache, positions: torch.Tensor | None = None,
                last_only: bool = False, logits_index: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids (B, T) -> logits (B, T, V), or (B, 1, V) with last_only, or (B, K, V) for the K
        positions in ``logits_index`` (a packed serving batch needs one row per sequence, not per token).

        positions (B, T) default to cache.seq_len + 0..T-1: the new tokens follow what is stored.
        """
        B, T = input_ids.shape
        if positions is None:
            positions = torch.arange(cache.seq_len, cache.seq_len + T, device=input_ids.device).expand(B, T)
        x = F.embedding(input_ids, self.embed)  # (B, T, C)
        if self.pos_embed is not None:
            x = x + F.embedding(positions, self.pos_embed)  # learned absolute positions
            rope = None
        else:
            rope = rope_cos_sin(positions, self.inv_freq, x.dtype)  # (B, 1, T, hs) each, angles in fp32
        for i, block in enumerate(self.blocks):
            x = block(x, i, cache, rope)  # (B, T, C)
        if last_only:
            x = x[:, -1:]  # (B, 1, C): prefill only needs the last position's logits
        elif logits_index is not None:
            x = x[:, logits_index]  # (B, K, C)
        x = self.final_norm(x)
        if self.lm_head is None:
            return F.linear(x, self.embed)  # (B, T, V), tied to the embeddings
        return matvec(x, self.lm_head)  # (B, T, V)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def weight_bytes(self) -> int:
        """Bytes of all weights: what one decode step must stream through memory at least once."""
        return sum(p.numel() * p.element_size() for p in self.parameters())


def build_model(config: ModelConfig, seed: int = 0, device: torch.device | str | None = None,
                dtype: torch.dtype = torch.float32) -> Decoder:
    """A decoder with seeded random weights and the built-in byte tokenizer (for tests and demos)."""
    from kvlab.device import pick_device
    from kvlab.model.tokenizer import ByteTokenizer

    model = Decoder(config).init_weights(seed)
    model.tokenizer = ByteTokenizer()
    return model.to(device=pick_device(device), dtype=dtype).eval()
