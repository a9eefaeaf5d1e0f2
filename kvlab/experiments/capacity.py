"""Memory is capacity: how many sequences a KV budget holds, and what the engine does when it runs out.

The lessons of notebooks 07 (counting) and 08 (running).

Counting (exact, no model runs; notebook 07):
- ``paged_vs_reserved``: the same budget either reserves each request's maximum length up front,
  or hands out fixed-size blocks as tokens arrive (PagedAttention). Sequences that fit and the
  waste of each: reserved-but-unused slots vs the unfilled tail of each last block.
- ``block_size_table``: larger blocks waste more per sequence (about half a block on average).
- ``capacity_levers``: max context and max new tokens bound each sequence, hence concurrency.
Running (the real decoder, wall clock; notebook 08):
- ``preemption_runs``: a budget too small for every running sequence to grow; preemption by
  recompute and its cost in recomputed tokens.
- ``prefix_caching_runs``: a shared system prompt computed once and reused (hit rate, TTFT).
- ``chunked_prefill_runs``: a long prompt arriving among running decodes, whole or in chunks.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from ..model.config import ModelConfig
from ..model.decoder import Decoder
from ..serving.block_manager import BlockManager, bytes_per_block
from ..serving.executor import Executor
from ..serving.scheduler import SchedulerConfig
from ..serving.sequence import SamplingParams, Sequence as EngineSequence
from ..threads import check_threads
from ..workload import Request, make_workload
from .progress import Progress, no_progress
from .serving_run import (ServingRun, check_positive_int, resolve_model, runs_table, seeded_prompt,
                          serve, warm_up)


# -- counting --------------------------------------------------------------------------------------
def bytes_per_token(config: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """K and V of one token over all layers at ``dtype``."""
    return bytes_per_block(config, 1, dtype)


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


def fit_in_order(costs: Sequence[int], capacity: int) -> int:
    """How many of ``costs``, taken in order (first come, first served), fit in ``capacity``."""
    total = np.cumsum(np.asarray(costs, dtype=np.int64))
    return int(np.searchsorted(total, capacity, side="right"))


def block_manager_fit(lengths: Sequence[int], num_blocks: int, block_size: int) -> int:
    """The same count from the engine's BlockManager: allocate sequences of ``lengths`` tokens until one fails."""
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
    for i, n in enumerate(lengths):
        seq = EngineSequence(i, [0] * int(n), 1, SamplingParams(), record=None, arrival_s=0.0)
        if not bm.can_allocate(seq):
            return i
        bm.allocate(seq)
    return len(lengths)


def paged_vs_reserved(config: ModelConfig, requests: Sequence[Request], kv_budget_bytes: int, block_size: int = 16,
                      max_model_len: int | None = None, max_new_tokens: int | None = None,
                      dtype: torch.dtype = torch.float32) -> pd.DataFrame:
    """Sequences of the workload that fit in one budget, reserving their maximum length vs paging blocks.

    One row per scheme; token columns add up to the budget's capacity: tokens_held (K/V of real
    tokens) + in_block_waste_tokens (unfilled tails of last blocks) + reserved_unused_tokens (set
    aside, never used) + free_tokens. ``formula_fit`` is the hand count (reserved with every
    reservation = C: floor(capacity / C); paged: the first k sequences with sum of ceil(n_i /
    block_size) <= blocks), ``block_manager_fit`` the BlockManager's own count (paged only).
    """
    check_positive_int("block_size", block_size)
    if not requests:
        raise ValueError("requests is empty; give the workload whose sequences should fit")
    peak, reserve = sequence_lengths(requests, max_model_len, max_new_tokens)
    per_token = bytes_per_token(config, dtype)
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
             formula_fit=k_pag, block_manager_fit=block_manager_fit(peak, int(num_blocks), block_size),
             tokens_held=held_pag, in_block_waste_tokens=in_blocks - held_pag, reserved_unused_tokens=0,
             free_tokens=int(num_blocks * block_size - in_blocks)),
    ]
    out = pd.DataFrame(rows)
    waste = out["in_block_waste_tokens"] + out["reserved_unused_tokens"]
    out["waste_share"] = waste / (out["tokens_held"] + waste)
    out.attrs.update(block_size=block_size, max_model_len=C, kv_budget_bytes=kv_budget_bytes,
                     bytes_per_token=per_token, requests=len(requests))
    return out


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


def capacity_levers(config: ModelConfig, requests: Sequence[Request], kv_budget_bytes: int,
                    max_model_lens: Sequence[int] = (256, 512, 1024),
                    max_new_tokens: Sequence[int] = (16, 32, 64, 128, 256), block_size: int = 16,
                    dtype: torch.dtype = torch.float32) -> pd.DataFrame:
    """Sequences of the workload that fit, per (max context C, max new tokens M), reserved and paged.

    Each cell applies ``sequence_lengths``' caps. Reserved: each sequence sets aside p' + M
    (capped at C); paged: blocks for the p' + o' tokens it really reaches. ``worst_case_fit``
    is what a server that promises every request its full context can admit: capacity // C.
    """
    per_token = bytes_per_token(config, dtype)
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


# -- running out of blocks: preemption --------------------------------------------------------------
def preemption_workload(vocab_size: int, n: int = 12, prompt_tokens: tuple[int, int] = (16, 48),
                        max_new_tokens: tuple[int, int] = (64, 128), seed: int = 0) -> list[Request]:
    """``n`` requests at once with short prompts and long outputs: they grow after admission."""
    rng = np.random.default_rng(seed)
    p = rng.integers(prompt_tokens[0], prompt_tokens[1], endpoint=True, size=n)
    o = rng.integers(max_new_tokens[0], max_new_tokens[1], endpoint=True, size=n)
    return [Request(i, int(a), int(b), 0.0, "grows", prompt=seeded_prompt(vocab_size, int(a), (seed, i)))
            for i, (a, b) in enumerate(zip(p, o))]


def recomputed_tokens(run: ServingRun) -> int:
    """Tokens computed beyond what serving every request once needs: the price of preemption by recompute.

    Without preemption every token but each request's last is computed exactly once:
    sum(prompt + output - 1) (prefix-cache hits excluded); anything above that was recomputed.
    """
    done = run.requests
    once = int((done["prompt_tokens"] + done["output_tokens"] - 1).clip(lower=0).sum())
    cached = int(done["cached_tokens"].sum()) if "cached_tokens" in done.columns else 0
    return int(run.trace["num_tokens"].sum()) - (once - cached)


def preemption_runs(model: Decoder | None = None, kv_blocks: Sequence[int | None] = (None, 40), n: int = 12,
                    max_seqs: int = 12, block_size: int = 16, max_model_len: int = 256, clock: str = "wall",
                    executor: Executor | None = None, seed: int = 0, threads: int | None = 1,
                    progress: Progress = no_progress) -> list[ServingRun]:
    """The same growing requests under each KV budget (in blocks; None: room for max_seqs at max_model_len).

    Prefix caching is off so a recompute really recomputes. ``run.extra`` keeps ``kv_blocks`` and
    ``recomputed_tokens``.
    """
    model = resolve_model(model)
    check_threads(threads)
    requests = preemption_workload(model.config.vocab_size, n, seed=seed)
    per_block = bytes_per_block(model.config, block_size, model.dtype)
    blocks_per_seq = -(-max_model_len // block_size)
    plan = [max_seqs * blocks_per_seq if b is None else b for b in kv_blocks]
    for b in plan:
        check_positive_int("kv_blocks", b, blocks_per_seq)
    if executor is None:
        warm_up(model, threads)
    runs = []
    for b in progress(plan, total=len(plan), desc="KV budgets", unit="run"):
        sched = SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=512, max_model_len=max_model_len)
        run = serve(model.config if executor is not None else model, requests, label=f"{b} blocks",
                    clock=clock, executor=executor, block_size=block_size, kv_budget_bytes=b * per_block,
                    scheduler=sched, enable_prefix_caching=False, threads=threads)
        run.extra.update(kv_blocks=b, recomputed_tokens=recomputed_tokens(run))
        runs.append(run)
    return runs


def preemption_table(runs: Sequence[ServingRun]) -> pd.DataFrame:
    """Per budget: preemptions, tokens recomputed, peak running sequences, throughput and tail latency.

    ``mean_batch`` is the mean number of sequences per step; ``ttft_n`` the completed requests
    behind the TTFT and E2E quantiles.
    """
    t = runs_table(runs)
    t.insert(1, "kv_blocks", [r.extra.get("kv_blocks") for r in runs])
    t.insert(2, "recomputed_tokens", [r.extra.get("recomputed_tokens") for r in runs])
    return t[["run", "kv_blocks", "preemptions", "recomputed_tokens", "peak_running", "peak_blocks_used", "steps",
              "mean_batch", "completed", "output_tokens_per_s", "ttft_n", "ttft_p95_s", "e2e_p95_s", "wall_s"]]


# -- prefix caching ----------------------------------------------------------------------------------
def prefix_caching_runs(model: Decoder | None = None, n: int = 10, system_prompt_tokens: int = 256,
                        rate: float = 8.0, block_size: int = 16, clock: str = "wall",
                        executor: Executor | None = None, seed: int = 0, threads: int | None = 1,
                        progress: Progress = no_progress) -> list[ServingRun]:
    """Chat requests sharing a system prompt, arriving every 1/``rate`` s, with prefix caching off and on.

    ``run.extra`` keeps ``prefix_caching`` and ``expected_hit_tokens``: what is reused if every
    request after the first finds the system prompt's full blocks cached,
    (n - 1) x floor(system_prompt_tokens / block_size) x block_size.
    """
    model = resolve_model(model)
    check_threads(threads)
    check_positive_int("system_prompt_tokens", system_prompt_tokens)
    requests = make_workload("short_short", n, arrival="constant", rate=rate, seed=seed,
                             vocab_size=model.config.vocab_size, shared_prefix_tokens=system_prompt_tokens,
                             max_context=model.config.max_position_embeddings)
    expected = (n - 1) * (system_prompt_tokens // block_size) * block_size
    if executor is None:
        warm_up(model, threads)
    runs = []
    for on in progress([False, True], total=2, desc="prefix caching", unit="run"):
        run = serve(model.config if executor is not None else model, requests,
                    label=f"prefix caching {'on' if on else 'off'}", clock=clock, executor=executor,
                    block_size=block_size, enable_prefix_caching=on, threads=threads,
                    scheduler=SchedulerConfig(max_seqs=8, max_batch_tokens=512))
        run.extra.update(prefix_caching=on, expected_hit_tokens=expected if on else 0)
        runs.append(run)
    return runs


def prefix_caching_table(runs: Sequence[ServingRun]) -> pd.DataFrame:
    """Per run: prompt tokens found in the cache (measured vs expected), prompt tokens computed, TTFT."""
    rows = []
    for r in runs:
        s = r.summary().latency["ttft"]
        rows.append(dict(run=r.label, hit_tokens=r.stats["prefix_hit_tokens"],
                         expected_hit_tokens=r.extra.get("expected_hit_tokens"),
                         hit_rate=r.stats["prefix_hit_rate"],
                         prompt_tokens=int(r.requests["prompt_tokens"].sum()),
                         prompt_tokens_computed=int(r.trace["num_prefill_tokens"].sum()),
                         ttft_n=s["n"], ttft_mean_s=s["mean"], ttft_p50_s=s["p50"], ttft_p95_s=s["p95"]))
    out = pd.DataFrame(rows)
    out["ttft_p50_saved_s"] = out["ttft_p50_s"].iloc[0] - out["ttft_p50_s"]
    return out


# -- chunked prefill ---------------------------------------------------------------------------------
def chunked_prefill_workload(vocab_size: int, n_decoding: int = 4, decode_tokens: int = 120,
                             long_prompt_tokens: int = 768, long_arrival_s: float = 0.08,
                             seed: int = 0) -> list[Request]:
    """``n_decoding`` short prompts with long outputs at t = 0, then a long prompt (id n_decoding) later."""
    check_positive_int("n_decoding", n_decoding)
    check_positive_int("long_prompt_tokens", long_prompt_tokens, 2)
    decoders = [Request(i, 16, decode_tokens, 0.0, "decoding", prompt=seeded_prompt(vocab_size, 16, (seed, i)))
                for i in range(n_decoding)]
    long = Request(n_decoding, long_prompt_tokens, 8, float(long_arrival_s), "long prompt",
                   prompt=seeded_prompt(vocab_size, long_prompt_tokens, (seed, n_decoding)))
    return [*decoders, long]


def chunked_prefill_runs(model: Decoder | None = None, chunk_tokens: int = 64, n_decoding: int = 4,
                         decode_tokens: int = 120, long_prompt_tokens: int = 768, long_arrival_s: float = 0.08,
                         clock: str = "wall", executor: Executor | None = None, seed: int = 0,
                         threads: int | None = 1, progress: Progress = no_progress) -> list[ServingRun]:
    """The same requests with the long prompt computed in one step, then in chunks under a ``chunk_tokens`` budget.

    Both runs use decode-first scheduling: running decodes are never left out of a step; what
    differs is how much prompt work shares their step.
    """
    model = resolve_model(model)
    check_threads(threads)
    check_positive_int("chunk_tokens", chunk_tokens, n_decoding + 1)
    context = model.config.max_position_embeddings
    if long_prompt_tokens + 8 > context:
        raise ValueError(f"long_prompt_tokens={long_prompt_tokens} + 8 new tokens exceeds the model's context of "
                         f"{context}; lower long_prompt_tokens to <= {context - 8}")
    requests = chunked_prefill_workload(model.config.vocab_size, n_decoding, decode_tokens, long_prompt_tokens,
                                        long_arrival_s, seed)
    plans = [("whole prompt in one step", SchedulerConfig(max_seqs=8, max_batch_tokens=context, chunked_prefill=False)),
             (f"chunks (budget {chunk_tokens} tokens/step)",
              SchedulerConfig(max_seqs=8, max_batch_tokens=chunk_tokens, chunked_prefill=True))]
    if executor is None:
        warm_up(model, threads)
    runs = []
    for label, sched in progress(plans, total=len(plans), desc="prefill", unit="run"):
        run = serve(model.config if executor is not None else model, requests, label=label, clock=clock,
                    executor=executor, scheduler=sched, threads=threads)
        run.extra.update(chunked=sched.chunked_prefill, long_id=n_decoding, long_arrival_s=long_arrival_s)
        runs.append(run)
    return runs


def chunked_prefill_table(runs: Sequence[ServingRun]) -> pd.DataFrame:
    """Per run: the gaps between tokens of the running decodes (median, max) and the long prompt's TTFT."""
    rows = []
    for r in runs:
        long_id = r.extra["long_id"]
        decoders = [rec for rec in r.records if rec.request_id != long_id and rec.status == "completed"]
        gaps = np.array([g for rec in decoders for g in rec.itl_s()])
        long = r.record(long_id).clocks()
        rows.append(dict(run=r.label, decode_gaps_n=len(gaps),
                         decode_gap_p50_s=float(np.median(gaps)) if len(gaps) else np.nan,
                         decode_gap_max_s=float(gaps.max()) if len(gaps) else np.nan,
                         long_prompt_ttft_s=long["ttft_s"], steps=len(r.trace),
                         max_step_tokens=int(r.trace["num_tokens"].max())))
    out = pd.DataFrame(rows)
    out["max_over_p50"] = out["decode_gap_max_s"] / out["decode_gap_p50_s"]
    return out


__all__ = ["block_manager_fit", "block_size_table", "budget_for_tokens", "bytes_per_token", "capacity_levers",
           "capacity_workload", "chunked_prefill_runs", "chunked_prefill_table", "fit_in_order",
           "paged_vs_reserved", "preemption_runs", "preemption_table", "prefix_caching_runs",
           "prefix_caching_table", "recomputed_tokens", "sequence_lengths"]
