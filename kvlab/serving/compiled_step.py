"""A serving engine's other steps compiled too: prompt chunks and decodes packed together, attention one opaque operator.

``CompiledDecode`` serves the steps in which every sequence decodes. The others hold a prompt chunk: their token count
changes every step and each sequence attends over its own blocks with its own causal offset, work a Python loop over
the step's sequences does (``PagedKVCache.attend``) and no compiled graph can hold. ``CompiledStep`` compiles the
decoder's forward once for every token count (dynamic shapes) with attention left as one operator the compiler calls
but does not look into (``kvlab_serving::packed_attention``): what it fuses is everything between the attention calls
(norms, RoPE, SwiGLU, the residual adds), run eagerly as dozens of small operations per layer otherwise. The operator
finds the step's cache and metadata in a forward context the executor sets around the call (``forward_context``).

This is vLLM's design (https://docs.vllm.ai/en/latest/design/torch_compile/): its model is compiled once for a symbolic
number of tokens, split at the attention operator (``unified_attention``, which reads the step's metadata from
``vllm.forward_context``), and the pieces between compiled. kvlab compiles the whole forward as one graph with the
operator inside it, which ``torch.compile`` calls in place.
"""
from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator

import torch

from kvlab.cache.paged import PagedAttentionMetadata, PagedKVCache
from kvlab.compiled import run_compiled, short_reason
from kvlab.model.decoder import Decoder
from kvlab.model.matvec import SPLIT_MAX_ROWS, prepare_compile

_CONTEXT: list[PagedKVCache] = []  # the cache of the step being run (its metadata set), innermost last


@contextlib.contextmanager
def forward_context(cache: PagedKVCache) -> Iterator[None]:
    """Within it, ``packed_attention`` attends with ``cache`` and the metadata set on it (vLLM's forward context)."""
    _CONTEXT.append(cache)
    try:
        yield
    finally:
        _CONTEXT.pop()


@torch.library.custom_op("kvlab_serving::packed_attention", mutates_args=())
def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> torch.Tensor:
    """``PagedKVCache.attend`` of the forward context's cache as one operator: q (1, nh, N, hs), k, v (1, nkv, N, hs)
    -> (1, nh, N, hs), contiguous. Writes k, v into the cache's pool (which no other operator of the graph reads)."""
    if not _CONTEXT:
        raise RuntimeError("packed_attention runs inside forward_context(cache): the executor sets it around a step")
    return _CONTEXT[-1].attend(layer_idx, q, k, v).contiguous()


@packed_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> torch.Tensor:
    return q.new_empty(q.shape)


class PackedBatch:
    """The cache as the compiled forward sees it: attention is the operator, the rest of the cache out of sight."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return packed_attention(q, k, v, layer_idx)


class CompiledStep:
    """``torch.compile`` of the decoder's forward over a packed step of any number of tokens (two programs: up to
    ``SPLIT_MAX_ROWS`` tokens and more, where ``matvec`` chooses its product by the number of rows).

    ``compile_all()`` builds them when the engine starts (seconds, said on stderr); ``__call__`` runs a step whose
    cache metadata is set, or returns None where no program fits (fewer than 2 tokens: the executor runs it
    eagerly). Where the compiler fails, ``fallback`` says why and every step returns None (same tokens, eagerly).
    """

    def __init__(self, model: Decoder, cache: PagedKVCache, backend: str | Callable = "inductor") -> None:
        self.model, self.cache, self.batch = model, cache, PackedBatch()
        prepare_compile()
        self.compiled = torch.compile(self.step, backend=backend, dynamic=False)  # the token count marked dynamic
        self.compile_s: float | None = None  # seconds compile_all took
        self.num_steps = 0  # steps run by a compiled program
        self.num_eager_steps = 0  # steps no program fitted, run eagerly
        self.fallback: str | None = None
        self.compiling = False  # True during compile_all only

    def step(self, input_ids: torch.Tensor, positions: torch.Tensor, logits_index: torch.Tensor) -> torch.Tensor:
        """input_ids, positions (1, N); logits_index (K,) -> logits (K, V) of those tokens."""
        return self.model(input_ids, self.batch, positions=positions, logits_index=logits_index)[0]

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor,
                 logits_index: torch.Tensor) -> torch.Tensor | None:
        """Logits (K, V) of the packed step's ``logits_index`` tokens, or None where no program fits (run it eagerly).
        The cache's metadata must be set for this step."""
        n, rows = input_ids.size(1), logits_index.size(0)
        if self.fallback is not None or n < 2:  # a size of 1 would be a program of its own (dynamic sizes start at 2)
            self.num_eager_steps += 1
            return None
        index = logits_index if rows >= 2 else torch.cat([logits_index, logits_index.new_zeros(2 - rows)])  # (>= 2,)
        for t, dim in ((input_ids, 1), (positions, 1), (index, 0)):
            torch._dynamo.mark_dynamic(t, dim)
        with forward_context(self.cache):
            if self.compiling:
                return self.compiled(input_ids, positions, index)[:rows]
            logits = run_compiled(self.compiled, input_ids, positions, index)  # (>= 2, V); None: no program
        if logits is None:
            self.num_eager_steps += 1
            return None
        self.num_steps += 1
        return logits[:rows]

    def compile_all(self) -> None:
        """Build the programs now (one with one thread; two with more, where ``matvec`` splits a product of up to
        ``SPLIT_MAX_ROWS`` rows), on steps that write into the pool's first blocks (then zeroed again)."""
        print("kvlab: compiling the prompt-chunk step for any token count with torch.compile...", file=sys.stderr,
              flush=True)
        cache, t0 = self.cache, time.perf_counter()
        self.compiling = True
        for n in (2, SPLIT_MAX_ROWS + 1):
            n = min(n, cache.block_size * cache.num_blocks)
            cache.metadata = PagedAttentionMetadata.build(cache, [n], [n], [list(range(-(-n // cache.block_size)))])
            try:
                with torch.inference_mode():
                    self(torch.zeros(1, n, dtype=torch.long, device=cache.device),
                         torch.arange(n, device=cache.device)[None], torch.tensor([n - 1], device=cache.device))
            except Exception as e:  # no compiler here, or one that fails: these steps run eagerly (same tokens)
                self.fallback = short_reason(e)
                print(f"kvlab: torch.compile failed ({self.fallback}); prompt-chunk steps run uncompiled",
                      file=sys.stderr, flush=True)
                break
            finally:
                cache.metadata = None
        self.compiling = False
        self.num_steps = self.num_eager_steps = 0
        if self.fallback is None:
            self.compile_s = time.perf_counter() - t0
            print(f"kvlab: compiled in {self.compile_s:.1f} s", file=sys.stderr, flush=True)
        assert cache.key_cache is not None and cache.value_cache is not None
        for pool in (*cache.key_cache, *cache.value_cache):
            pool[: -(-(SPLIT_MAX_ROWS + 1) // cache.block_size)].zero_()


__all__ = ["CompiledStep", "PackedBatch", "forward_context", "packed_attention"]
