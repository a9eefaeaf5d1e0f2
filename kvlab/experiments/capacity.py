"""Memory is capacity: how many sequences a KV budget holds, counted exactly, no model runs.

- ``paged_vs_reserved``: the same budget either reserves each request's maximum length up front,
  or hands out fixed-size blocks as tokens arrive (PagedAttention). Sequences that fit and the
  waste of each: reserved-but-unused slots vs the unfilled tail of each last block.
- ``block_size_table``: larger blocks waste more per sequence (about half a block on average).
- ``capacity_levers``: max context and max new tokens bound each sequence, hence concurrency.

What the engine does when the budget runs out (preemption), and prefix caching and chunked
prefill, are run in ``kvlab/experiments/prefix_and_chunks.py``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from kvlab.clocks import RequestRecord
from kvlab.model.config import ModelConfig
from kvlab.serving.block_manager import BlockManager
from kvlab.serving.config import EngineSpec
from kvlab.serving.sequence import SamplingParams, Sequence as EngineSequence
from kvlab.workload import Request, make_workload
from kvlab.experiments.serving_run import check_positive_int
from kvlab.provenance import experiment


# -- counting --------------------------------------------------------------------------------------
def bytes_per_token(config: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """K and V of one token over all layers at ``dtype``."""
    return config.kv_bytes_per_token(torch.tensor([], dtype=dtype).element_size())


def budget_for_tokens(config: ModelConfig, tokens: int, dtype: torch.dtype = torch.float32) -> int:
    """The KV budget in bytes that holds ``tokens`` tokens of ``config``."""
    return tokens * bytes_per_token(config, dtype)


def capacity_workload(config: ModelConfig, n: int = 64, profile: str = "mixture", seed: int = 0,
                      max_context: int | None = None) -> list[Request]:
    """``n`` requests of ``profile`` arriving together, lengths clipped to the model's context."""
    return make_workload(profile, n, arrival="all_at_once", seed=seed, vocab_size=config.vocab_size,
                         max_context=max_context or config.max_position_embeddings)


def sequence_lengths(requests: Sequence[Request], max_model_len: int | None = None,
                     max_new_tokens: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(peak tokens each sequence holds, tokens a reservation sets aside for it) under the server's caps.

    Output is capped at ``max_new_tokens`` (M), then the prompt is cut to leave room in
    ``max_model_len`` (C): o' = min(o, M, C - 1), p' = min(p, C - o'). A sequence holds p' + o'
    tokens at its peak (counting the last token, whose K/V the last step writes); a reservation
    must cover the worst case, p' + M, capped at C (with no M: the whole context C).
    """
    C = max_model_len if max_model_len is not None else max(r.prompt_tokens + r.max_new_tokens for r in requests)
    check_positive_int("max_model_len", C, 2)
    if max_new_tokens is not None:
        check_positive_int("max_new_tokens", max_new_tokens)
    M = C if max_new_tokens is None else max_new_tokens
    o = np.array([min(r.max_new_tokens, M, C - 1) for r in requests])
    p = np.minimum(np.array([r.prompt_tokens for r in requests]), C - o)
    return p + o, np.minimum(C, p + M)


def fit_in_order(costs: Sequence[int] | np.ndarray, capacity: int) -> int:
    """How many of ``costs``, taken in order (first come, first served), fit in ``capacity``."""
    total = np.cumsum(np.asarray(costs, dtype=np.int64))
    return int(np.searchsorted(total, capacity, side="right"))


def block_manager_fit(lengths: Sequence[int] | np.ndarray, bm: BlockManager) -> int:
    """The same count from the engine's BlockManager: allocate sequences of ``lengths`` tokens into ``bm`` (an
    empty pool, prefix caching off) until one fails."""
    for i, n in enumerate(lengths):
        record = RequestRecord(i, int(n), 1, scheduled_s=0.0)  # the engine's timestamps: unused here
        seq = EngineSequence(i, [0] * int(n), 1, SamplingParams(), record=record, arrival_s=0.0)
        if not bm.can_allocate(seq):
            return i
        bm.allocate(seq)
    return len(lengths)


def pool_of(config: ModelConfig, spec: EngineSpec) -> tuple[int, int, int]:
    """(KV budget in bytes, block size, bytes per token at its KV dtype) of ``spec``'s pool for ``config``; the
    budget must be set."""
    if spec.kv_budget_bytes is None:
        raise ValueError("the spec has no KV budget to fill: give one, e.g. "
                         "LESSON_SPEC.replace(kv_budget_bytes=budget_for_tokens(config, 8192))")
    return spec.kv_budget_bytes, spec.block_size, bytes_per_token(config, spec.kv_dtype or torch.float32)


@experiment
def paged_vs_reserved(config: ModelConfig, requests: Sequence[Request], spec: EngineSpec,
                      max_new_tokens: int | None = None) -> pd.DataFrame:
    """Sequences of the workload that fit in ``spec``'s KV budget (its blocks, its ``max_model_len``; None: the
    longest request), reserving their maximum length vs paging blocks.

    One row per scheme; token columns add up to the budget's capacity: tokens_held (K/V of real
    tokens) + in_block_waste_tokens (unfilled tails of last blocks) + reserved_unused_tokens (set
    aside, never used) + free_tokens. ``formula_fit`` is the hand count (reserved with every
    reservation = C: floor(capacity / C); paged: the first k sequences with sum of ceil(n_i /
    block_size) <= blocks), ``block_manager_fit`` the BlockManager's own count (paged only).
    """
    if not requests:
        raise ValueError("requests is empty; give the workload whose sequences should fit")
    kv_budget_bytes, block_size, per_token = pool_of(config, spec)
    peak, reserve = sequence_lengths(requests, spec.scheduler.max_model_len, max_new_tokens)
    capacity = kv_budget_bytes // per_token
    num_blocks = kv_budget_bytes // (per_token * block_size)
    if capacity < 1 or num_blocks < 1:
        raise ValueError(f"kv_budget_bytes={kv_budget_bytes:,} holds {capacity} tokens ({num_blocks} blocks of "
                         f"{block_size}); raise it to at least {per_token * block_size:,} bytes")
    C = int(reserve.max())
    k_res = fit_in_order(reserve, capacity)
    held_res = int(peak[:k_res].sum())
    blocks = -(-peak // block_size)
    k_pag = fit_in_order(blocks, num_blocks)
    held_pag = int(peak[:k_pag].sum())
    in_blocks = int(blocks[:k_pag].sum()) * block_size
    rows = [
        dict(scheme="reserve max length", capacity_tokens=int(capacity), sequences_fit=k_res,
             formula_fit=int(capacity // C) if (reserve == C).all() else k_res, block_manager_fit=np.nan,
             tokens_held=held_res, in_block_waste_tokens=0,
             reserved_unused_tokens=int(reserve[:k_res].sum()) - held_res,
             free_tokens=int(capacity - reserve[:k_res].sum())),
        dict(scheme="paged blocks", capacity_tokens=int(num_blocks * block_size), sequences_fit=k_pag,
             formula_fit=k_pag,
             block_manager_fit=block_manager_fit(peak, BlockManager(int(num_blocks), block_size, False)),
             tokens_held=held_pag, in_block_waste_tokens=in_blocks - held_pag, reserved_unused_tokens=0,
             free_tokens=int(num_blocks * block_size - in_blocks)),
    ]
    out = pd.DataFrame(rows)
    waste = out["in_block_waste_tokens"] + out["reserved_unused_tokens"]
    out["waste_share"] = waste / (out["tokens_held"] + waste)
    out.attrs.update(block_size=block_size, max_model_len=C, kv_budget_bytes=kv_budget_bytes,
                     bytes_per_token=per_token, requests=len(requests))
    return out


def paged_fit(table: pd.DataFrame) -> tuple[int, dict[str, int]]:
    """The sequences paged blocks fit, with what that count is computed from: the pool's blocks (the measure of
    a prediction, ``guess.against(table, paged_fit)``)."""
    pag = table.set_index("scheme").loc["paged blocks"]
    blocks = int(pag.capacity_tokens) // int(table.attrs["block_size"])
    return int(pag.sequences_fit), {"blocks in the pool": blocks, "token slots in the pool": int(pag.capacity_tokens)}


def block_size_table(config: ModelConfig, requests: Sequence[Request], kv_budget_bytes: int,
                     block_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128), max_model_len: int | None = None,
                     dtype: torch.dtype = torch.float32) -> pd.DataFrame:
    """Per block size: in-block waste over the workload (per sequence, vs the rule of thumb), and sequences that fit.

    ``waste_per_sequence`` is exact: the mean of (-n_i mod block_size); ``rule_of_thumb`` is
    (block_size - 1) / 2, what it averages to when lengths fall anywhere within a block.
    """
    peak, _ = sequence_lengths(requests, max_model_len)
    per_token = bytes_per_token(config, dtype)
    rows = []
    for bs in block_sizes:
        check_positive_int("block_size", bs)
        blocks = -(-peak // bs)
        waste = blocks * bs - peak
        num_blocks = kv_budget_bytes // (per_token * bs)
        rows.append(dict(block_size=bs, num_blocks=int(num_blocks), waste_per_sequence=float(waste.mean()),
                         rule_of_thumb=(bs - 1) / 2, waste_share=float(waste.sum() / (blocks * bs).sum()),
                         sequences_fit=fit_in_order(blocks, num_blocks)))
    return pd.DataFrame(rows)


def capacity_levers(config: ModelConfig, requests: Sequence[Request], spec: EngineSpec,
                    max_model_lens: Sequence[int] = (256, 512, 1024),
                    max_new_tokens: Sequence[int] = (16, 32, 64, 128, 256)) -> pd.DataFrame:
    """Sequences of the workload that fit ``spec``'s KV budget and blocks, per (max context C, max new tokens M),
    reserved and paged.

    Each cell applies ``sequence_lengths``' caps. Reserved: each sequence sets aside p' + M
    (capped at C); paged: blocks for the p' + o' tokens it really reaches. ``worst_case_fit``
    is what a server that promises every request its full context can admit: capacity // C.
    """
    kv_budget_bytes, block_size, per_token = pool_of(config, spec)
    capacity = kv_budget_bytes // per_token
    num_blocks = kv_budget_bytes // (per_token * block_size)
    rows = []
    for C in max_model_lens:
        for M in max_new_tokens:
            if M >= C:
                continue
            peak, reserve = sequence_lengths(requests, C, M)
            rows.append(dict(max_model_len=C, max_new_tokens=M, worst_case_fit=int(capacity // C),
                             reserved_fit=fit_in_order(reserve, capacity),
                             paged_fit=fit_in_order(-(-peak // block_size), num_blocks),
                             mean_tokens=float(peak.mean()), prompts_cut=int(sum(
                                 min(r.prompt_tokens, C - min(r.max_new_tokens, M, C - 1)) < r.prompt_tokens
                                 for r in requests))))
    out = pd.DataFrame(rows)
    out.attrs.update(requests=len(requests), block_size=block_size, kv_budget_bytes=kv_budget_bytes)
    return out


__all__ = ["block_manager_fit", "block_size_table", "budget_for_tokens", "bytes_per_token", "capacity_levers",
           "capacity_workload", "fit_in_order", "paged_fit", "paged_vs_reserved", "pool_of", "sequence_lengths"]
