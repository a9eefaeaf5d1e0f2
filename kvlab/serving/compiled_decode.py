"""A serving engine's decode step compiled once per batch size: the small operations of a step fused, as vLLM does.

A step in which every sequence decodes one token (no prompt chunk) has few shapes: the batch and the longest block
table. ``CompiledDecode`` pads the batch up to the next of a few sizes (``sizes``, vLLM's capture sizes), compiles the
decoder's forward for each size with ``torch.compile`` when the engine starts (the block-table width left dynamic), and
replays it for such a step while its padding stays small (``accepts``); other steps run eagerly. On a CPU with a small
model the gain is the dozens of small operations per layer (norms, RoPE, the cache write, the mask) fused into a few
loops: the weight products and attention stay the same calls. Padding rows repeat the first row (same token, same slot):
they write what it writes.

Real engines do the same: vLLM compiles its model at start-up for a list of batch sizes and, on a GPU, captures each as
a CUDA graph (https://docs.vllm.ai/en/latest/design/torch_compile/), replayed only for steps that decode and fit the
largest size and context it captured (``_use_captured_graph`` in
https://github.com/vllm-project/vllm/blob/v0.6.0/vllm/worker/model_runner.py). kvlab's bound is its padded attention
(``accepts``): every row attends over the longest row's blocks, which on a mixed batch costs more than it saves.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence as Seq

import torch
import torch.nn.functional as F

from kvlab.cache import in_place_attention
from kvlab.cache.paged import DECODE_BATCH_MAX_SLOTS, PagedKVCache
from kvlab.compiled import run_compiled, short_reason
from kvlab.model.decoder import Decoder
from kvlab.model.matvec import prepare_compile

COMPILE_SIZES = (1, 2, 4, 8, 16)  # decode batches compiled at start (a batch pads up to the next one)


class DecodeBatch:
    """The cache as one padded decode batch sees it: where each row's new K/V goes and which blocks it attends over."""

    def __init__(self, cache: PagedKVCache, slots: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor) -> None:
        self.cache = cache
        self.slots = slots  # (b,) pool slot of each row's new token
        self.block_tables = block_tables  # (b, W) blocks of each row, padded with block 0
        self.context_lens = context_lens  # (b,) tokens each row attends over, its new one included

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (b, nh, 1, hs), k, v (b, nkv, 1, hs) -> (b, nh, 1, hs): write k, v into their slots, attend each row
        over its own blocks (the padded keys masked)."""
        c = self.cache
        assert c.key_cache is not None and c.value_cache is not None
        b, nh, _, hs = q.shape
        nkv, width = c.num_kv_heads, self.block_tables.size(1)
        k_pool, v_pool = c.key_cache[layer_idx], c.value_cache[layer_idx]  # (num_blocks, bs, nkv, hs)
        k_pool.view(-1, nkv, hs).index_copy_(0, self.slots, k[:, :, 0])  # (b, nkv, hs) into their slots
        v_pool.view(-1, nkv, hs).index_copy_(0, self.slots, v[:, :, 0])
        if c.in_place:  # every row read in the pool, to its own length (kvlab.cache.in_place_attention)
            y = in_place_attention.paged_decode_attention(q.view(b, nh, hs), k_pool, v_pool, self.block_tables,
                                                          self.context_lens)  # (b, nh, hs)
            return y.view(b, nh, 1, hs)
        shape = (b, width * c.block_size, nkv, hs)
        keys = k_pool.view(c.num_blocks, -1)[self.block_tables].view(shape).transpose(1, 2)  # (b, nkv, L, hs)
        values = v_pool.view(c.num_blocks, -1)[self.block_tables].view(shape).transpose(1, 2)
        mask = torch.arange(width * c.block_size, device=q.device)[None, :] < self.context_lens[:, None]  # (b, L)
        y = F.scaled_dot_product_attention(q.view(b, nkv, nh // nkv, hs), keys, values,
                                           attn_mask=mask[:, None, None, :])  # (b, nkv, nh/nkv, hs)
        return y.reshape(b, nh, 1, hs)


class CompiledDecode:
    """``torch.compile`` of the decoder's one-token step over a ``DecodeBatch``, one program per size in ``sizes``.

    ``compile_all()`` builds every size (the engine's start-up: seconds each, said on stderr); ``__call__`` runs a
    decode step of up to ``max(sizes)`` sequences. Where the compiler fails, ``fallback`` says why and ``accepts``
    refuses every step (the engine's eager path runs them: same tokens).
    """

    def __init__(self, model: Decoder, cache: PagedKVCache, sizes: Seq[int] = COMPILE_SIZES,
                 backend: str | Callable = "inductor") -> None:
        if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
            raise ValueError(f"sizes must be positive whole batch sizes, got {sizes!r}")
        self.model, self.cache, self.sizes = model, cache, tuple(sorted(set(sizes)))
        prepare_compile()
        self.compiled = torch.compile(self.step, backend=backend, dynamic=False)
        self.compile_s: dict[int, float] = {}  # size -> seconds its first call took
        self.num_steps = 0  # decode steps run by a compiled program
        self.num_eager_steps = 0  # steps accepted whose shapes had no program: run eagerly rather than compiled then
        self.fallback: str | None = None
        self.compiling = False  # True during compile_all only

    def step(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: DecodeBatch) -> torch.Tensor:
        """input_ids, positions (b, 1) -> logits (b, V)."""
        return self.model(input_ids, batch, positions=positions, last_only=True)[:, -1]

    def accepts(self, num_seqs: int, num_blocks: int) -> bool:
        """Whether a step of ``num_seqs`` decodes, the longest over ``num_blocks`` blocks, runs compiled: only while
        its padded attention stays as small as the eager path's batched decodes (``DECODE_BATCH_MAX_SLOTS``); past it,
        attending every row over the longest row's blocks costs more than the fused operations save. A cache that
        attends in place reads each row to its own length only: every such step runs compiled."""
        if self.fallback is not None or num_seqs > self.sizes[-1]:
            return False
        size = next(s for s in self.sizes if s >= num_seqs)
        return self.cache.in_place or size * max(2, num_blocks) * self.cache.block_size <= DECODE_BATCH_MAX_SLOTS

    def __call__(self, token_ids: list[int], positions: list[int], block_tables: list[list[int]]) -> torch.Tensor:
        """One decode step of len(token_ids) sequences, each at ``positions[i]`` with its ``block_tables[i]``
        (covering that position) -> logits (len(token_ids), V)."""
        n, size = len(token_ids), next(s for s in self.sizes if s >= len(token_ids))
        bs, device = self.cache.block_size, self.cache.device
        pad = size - n  # padding rows repeat row 0: the same token written to the same slot
        token_ids, positions, block_tables = token_ids + token_ids[:1] * pad, positions + positions[:1] * pad, \
            block_tables + block_tables[:1] * pad
        width = max(2, max(p // bs + 1 for p in positions))  # 2 at least: width 1 would compile a program of its own
        tables = torch.tensor([t[:width] + [0] * (width - len(t[:width])) for t in block_tables], device=device)
        torch._dynamo.mark_dynamic(tables, 1)  # one program for every width
        slots = torch.tensor([t[p // bs] * bs + p % bs for t, p in zip(block_tables, positions)], device=device)
        pos = torch.tensor(positions, device=device)  # (b,)
        batch = DecodeBatch(self.cache, slots, tables, pos + 1)
        ids = torch.tensor(token_ids, device=device)[:, None]  # (b, 1)
        if self.compiling:  # compile_all's calls: compiling is what they are for
            return self.compiled(ids, pos[:, None], batch)[:n]
        logits = run_compiled(self.compiled, ids, pos[:, None], batch)  # (b, V); None: no program for it
        if logits is None:
            self.num_eager_steps += 1  # a shape no program was built for: this step runs eagerly
            return self.step(ids, pos[:, None], batch)[:n]
        self.num_steps += 1
        return logits[:n]

    def compile_all(self) -> None:
        """Compile every size now, on a batch that writes into block 0 of an empty pool (then zeroed again)."""
        self.compiling = True
        for size in self.sizes:
            print(f"kvlab: compiling the decode step for batches of {size} with torch.compile...",
                  file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            try:
                with torch.inference_mode():
                    self([0] * size, [0] * size, [[0]] * size)
            except Exception as e:  # no compiler here, or one that fails: every step runs eagerly (same tokens)
                self.fallback = short_reason(e)
                print(f"kvlab: torch.compile failed ({self.fallback}); decode steps run uncompiled",
                      file=sys.stderr, flush=True)
                break
            seconds = time.perf_counter() - t0
            self.compile_s[size] = seconds
            print(f"kvlab: compiled in {seconds:.1f} s", file=sys.stderr, flush=True)
        self.compiling = False
        assert self.cache.key_cache is not None and self.cache.value_cache is not None
        for pool in (*self.cache.key_cache, *self.cache.value_cache):
            pool[0].zero_()


__all__ = ["COMPILE_SIZES", "CompiledDecode", "DecodeBatch"]
