"""KVCache: the small interface every cache strategy shares, and its memory accounting."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from typing import overload

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class CacheMemory:
    """Honest accounting of a cache's bytes.

    allocated_bytes = used_bytes + reserved_bytes: what the cache holds in memory, split into
    bytes that hold tokens and bytes reserved but still empty. device_bytes is the part on the
    compute device; offloaded_bytes the part kept in a slower tier (0 unless offloaded).
    """

    allocated_bytes: int
    used_bytes: int
    reserved_bytes: int
    device_bytes: int
    offloaded_bytes: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@overload
def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, tokens: int,
                   batch: int = 1, bytes_per_element: int = 4) -> int: ...
@overload
def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, tokens: int,
                   batch: int, bytes_per_element: float) -> float: ...
def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, tokens: int,
                   batch: int = 1, bytes_per_element: float = 4) -> float:
    """The memory formula: 2 (K and V) x layers x kv_heads x head_dim x tokens x batch x bytes (an int for whole
    bytes per element; 0.5 for a 4-bit cache gives a float)."""
    return 2 * num_layers * num_kv_heads * head_dim * tokens * batch * bytes_per_element


def check_fits(cache: str, max_len: int, tokens: int) -> None:
    """Raise before any work if ``tokens`` would not fit in a ``cache`` preallocated to ``max_len`` tokens."""
    if tokens > max_len:
        raise ValueError(f"{cache} cache holds {max_len} tokens but {tokens} are needed; "
                         "raise max_len or shorten the prompt / lower max_new_tokens")


def tensor_bytes(*tensors: torch.Tensor | None) -> int:
    """Bytes of the storage behind the given tensors (None counts 0)."""
    return sum(t.nbytes for t in tensors if t is not None)


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention of the last T queries over S >= T keys, causally.

    q: (B, nh, T, hs); k, v: (B, nkv, S, hs) with nh a multiple of nkv (grouped-query attention).
    The T queries sit at positions S-T .. S-1, so query i may see keys 0 .. S-T+i.
    """
    (B, nh, T, hs), (nkv, S) = q.shape, k.shape[1:3]
    gqa = nh != nkv
    if T == 1:  # one new token sees everything stored: no mask needed
        if gqa:  # the nh/nkv query heads sharing a K/V head become rows of one query: each K/V head is read once
            y = F.scaled_dot_product_attention(q.reshape(B, nkv, nh // nkv, hs), k, v)  # (B, nkv, nh/nkv, hs)
            return y.reshape(B, nh, 1, hs)
        return F.scaled_dot_product_attention(q, k, v)  # (B, nh, 1, hs)
    if T == S:  # prefill from an empty cache
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    keep = torch.arange(S, device=q.device)[None, :] <= (S - T + torch.arange(T, device=q.device))[:, None]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=gqa)  # (B, nh, T, hs)


class KVCache(ABC):
    """Per-layer store of keys and values, passed explicitly into the decoder's forward.

    The contract follows transformers' caches: ``update(layer_idx, k, v)`` stores the new keys/values of one layer and
    returns everything to attend over, shaped (batch, kv_heads, seq, head_dim). ``seq_len`` is the number of tokens
    stored (it advances when the last layer has been updated).
    """

    name: str = "base"

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.batch, self.dtype, self.device = batch, dtype, torch.device(device)

    @abstractmethod
    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (B, nkv, T_new, hs) of one layer; return all K, V (B, nkv, S, hs) to attend over."""

    @property
    @abstractmethod
    def seq_len(self) -> int:
        """Tokens stored so far (the position the next token gets)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget every token (memory of preallocated caches stays reserved)."""

    @abstractmethod
    def memory(self) -> CacheMemory:
        """Bytes allocated, holding tokens, and reserved but empty."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Store this layer's new k, v and attend the queries q over every stored token.

        q: (B, nh, T, hs) -> (B, nh, T, hs). Caches with a non-contiguous layout (paged) override this.
        """
        keys, values = self.update(layer_idx, k, v)  # (B, nkv, S, hs)
        return causal_attention(q, keys, values)

    def bytes_per_token(self) -> int:
        """Bytes one token's K and V take across all layers and the batch at full precision."""
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, 1, self.batch,
                              torch.tensor([], dtype=self.dtype).element_size())

    def __repr__(self) -> str:
        m = self.memory()
        return (f"{type(self).__name__}(seq_len={self.seq_len}, allocated={m.allocated_bytes:,} B, "
                f"used={m.used_bytes:,} B, reserved={m.reserved_bytes:,} B)")
