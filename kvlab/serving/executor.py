"""Executors: run one scheduled step and say which token each sequence got and how long it took.

The scheduler decides *what* runs; an executor runs it: ``ModelExecutor`` the real decoder, a cost model's executor
(``kvlab.serving.cost_model``) prices the same ``SchedulerOutput`` with no model, behind the same interface.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import NamedTuple

import torch

from kvlab.cache.paged import PagedAttentionMetadata, PagedKVCache
from kvlab.device import now
from kvlab.model.decoder import Decoder
from kvlab.sampling import NonFiniteLogits, nonfinite_rows, sample
from kvlab.serving.block_manager import BlockManager
from kvlab.serving.compiled_decode import CompiledDecode
from kvlab.serving.compiled_step import CompiledStep
from kvlab.serving.scheduler import SchedulerOutput, StepShape


class StepResult(NamedTuple):
    """``token_ids[i]``: the token sampled for ``out.seqs[i]`` (None where ``out.do_sample[i]`` is False).

    ``failed``: {i: why} for the sequences no token could be sampled for (NaN logits, say); the
    engine fails those requests alone and keeps the rest of the batch. ``nonfinite``: those of them whose
    logits were not finite; when that is every sequence sampled, the model itself failed the step.
    """

    token_ids: list[int | None]
    duration_s: float  # how long the step took (measured, or predicted by a cost model)
    failed: dict[int, str] | None = None
    nonfinite: tuple[int, ...] = ()  # the sequences (indices into out.seqs) whose logits held NaN or inf


class Executor(ABC):
    """Runs a ``SchedulerOutput``; the engine's virtual clock advances by the returned duration."""

    name: str = "executor"

    def initialize_cache(self, pool: BlockManager) -> None:
        """Called once by the engine with the pool's allocator: an executor with real KV allocates
        ``pool.num_blocks`` blocks of ``pool.block_size`` slots (vLLM's ``initialize_cache``)."""

    def set_kv_usage(self, num_tokens: int, num_blocks: int) -> None:
        """Called by the engine after every step with the tokens and blocks the pool holds."""

    @abstractmethod
    def execute(self, out: SchedulerOutput) -> StepResult:
        """Compute ``out.num_new_tokens[i]`` tokens of each ``out.seqs[i]`` and sample where asked."""


class ModelExecutor(Executor):
    """The model runner: one packed forward of the real decoder per step.

    All scheduled tokens — prompt chunks and single decode tokens of different sequences — go into one (1, N) batch with
    their own positions (RoPE or learned positions need no padding); the paged cache's metadata tells each layer which
    slots to write and which blocks each sequence attends over. Logits of the last token of each sequence that is due a
    token are sampled with that sequence's own settings (greedy rows together in one argmax).

    ``compile_sizes``: where given, a step in which every sequence decodes (up to the largest size) runs a program
    ``torch.compile`` built for its padded batch size when the cache is made (``kvlab.serving.compiled_decode``).
    ``attention``: how the other steps' decodes attend (``PagedKVCache``'s, "gather" or "in_place").
    ``compile_mixed``: the other steps (those holding a prompt chunk) run one program ``torch.compile`` built for any
    token count when the cache is made (``kvlab.serving.compiled_step``).
    """

    name = "model"

    def __init__(self, model: Decoder, compile_sizes: Sequence[int] = (), attention: str = "gather",
                 compile_mixed: bool = False) -> None:
        if not isinstance(model, Decoder):
            raise TypeError(f"ModelExecutor runs a kvlab Decoder, got {type(model).__name__}; "
                            "load one with kvlab.build_model or kvlab.from_pretrained")
        self.model, self.compile_sizes, self.attention = model, tuple(compile_sizes), attention
        self.compile_mixed = compile_mixed
        self.cache: PagedKVCache | None = None
        self.compiled: CompiledDecode | None = None
        self.compiled_step: CompiledStep | None = None

    def initialize_cache(self, pool: BlockManager) -> None:
        cfg, cache = self.model.config, self.cache
        if cache is None or (cache.num_blocks, cache.block_size) != (pool.num_blocks, pool.block_size):  # else reuse
            cache = self.cache = PagedKVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype=self.model.dtype,
                                              device=self.model.device, num_blocks=pool.num_blocks,
                                              block_size=pool.block_size, attention=self.attention)
            self.compiled = self.compiled_step = None
        cache.reset()
        if self.compile_sizes and self.compiled is None:
            self.compiled = CompiledDecode(self.model, cache, self.compile_sizes)
            self.compiled.compile_all()
        if self.compile_mixed and self.compiled_step is None:
            self.compiled_step = CompiledStep(self.model, cache)
            self.compiled_step.compile_all()

    def _paged_cache(self) -> PagedKVCache:
        if self.cache is None:
            raise RuntimeError("call initialize_cache(pool) first (the Engine does)")
        return self.cache

    def set_kv_usage(self, num_tokens: int, num_blocks: int) -> None:
        self._paged_cache().set_usage(num_tokens, num_blocks)

    def prepare_inputs(self, out: SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor, PagedAttentionMetadata]:
        """Packed input ids and positions (1, N), and the attention metadata of the step."""
        positions: list[int] = []
        ids, query_lens, context_lens = [], [], []
        for seq, n in zip(out.seqs, out.num_new_tokens):
            start = seq.num_computed_tokens
            ids.extend(seq.token_ids[start:start + n])
            positions.extend(range(start, start + n))
            query_lens.append(n)
            context_lens.append(start + n)
        device = self.model.device
        metadata = PagedAttentionMetadata.build(self._paged_cache(), query_lens, context_lens,
                                                [s.block_table for s in out.seqs])
        return (torch.tensor([ids], device=device), torch.tensor([positions], device=device),  # (1, N) each
                metadata)

    def compute_logits(self, out: SchedulerOutput, rows: list[int]) -> torch.Tensor:
        """One packed forward of the step; logits (len(rows), V) of the last token of each ``out.seqs[rows[j]]``."""
        seqs = out.seqs
        if (self.compiled is not None and len(rows) == len(seqs) and set(out.num_new_tokens) == {1}  # all decode
                and self.compiled.accepts(len(seqs), max(s.num_computed_tokens // self.compiled.cache.block_size + 1
                                                         for s in seqs))):
            return self.compiled([s.token_ids[s.num_computed_tokens] for s in seqs],
                                 [s.num_computed_tokens for s in seqs], [s.block_table for s in seqs])
        device = self.model.device
        input_ids, positions, metadata = self.prepare_inputs(out)
        cache = self._paged_cache()
        cache.metadata = metadata
        try:
            index = torch.tensor([metadata.query_start_loc[i + 1] - 1 for i in rows], dtype=torch.long, device=device)
            # logits only where a token is sampled: each such sequence's last token (a prompt's other rows need none)
            logits = self.compiled_step(input_ids, positions, index) if self.compiled_step is not None else None
            if logits is None:  # not compiled, or no program for this step: eagerly
                logits = self.model(input_ids, cache, positions=positions, logits_index=index)[0]
            return logits  # (S', V)
        finally:
            cache.metadata = None

    def sample_rows(self, out: SchedulerOutput, rows: list[int], last: torch.Tensor) -> StepResult:
        """Each row's token by its own settings; a row with non-finite logits fails alone (``StepResult.failed``)."""
        tokens: list[int | None] = [None] * len(out.seqs)
        # every row checked at once: one sync per step
        failed = {rows[j]: str(NonFiniteLogits([j])) for j in nonfinite_rows(last)}
        nonfinite = tuple(failed)
        greedy = [j for j, i in enumerate(rows) if out.seqs[i].sampling.greedy and i not in failed]
        if greedy:
            for j, t in zip(greedy, last[greedy].argmax(dim=-1).tolist()):
                tokens[rows[j]] = t
        for j, i in enumerate(rows):
            sp = out.seqs[i].sampling
            if sp.greedy or i in failed:
                continue
            try:
                tokens[i] = int(sample(last[j:j + 1], sp.temperature, sp.top_k, sp.top_p, out.seqs[i].generator).item())
            except (ValueError, RuntimeError) as e:  # this row's distribution cannot be sampled: fail it alone
                failed[i] = f"{type(e).__name__}: {e}"
        return StepResult(tokens, 0.0, failed or None, nonfinite)

    @torch.inference_mode()
    def execute(self, out: SchedulerOutput) -> StepResult:
        device = self.model.device
        start = now(device)
        rows = [i for i, s in enumerate(out.do_sample) if s]
        result = self.sample_rows(out, rows, self.compute_logits(out, rows))
        return result._replace(duration_s=now(device) - start)

__all__ = ["Executor", "ModelExecutor", "StepResult", "StepShape"]
