"""Preemption, prefixes and chunks: the real engine when its KV budget runs out or can be reused.

Each function runs the real decoder (wall clock) or a cost model (virtual clock) on the same requests:
- ``preemption_runs``: a budget too small for every running sequence to grow; preemption by
  recompute and its cost in recomputed tokens.
- ``prefix_caching_runs``: a shared system prompt computed once and reused (hit rate, TTFT).
- ``chunked_prefill_runs``: a long prompt arriving among running decodes, whole or in chunks.

How many sequences a budget holds, counted without running anything: ``kvlab/experiments/capacity.py``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from kvlab.model.decoder import Decoder
from kvlab.serving.executor import Executor
from kvlab.serving.config import EngineSpec
from kvlab.serving.scheduler import MAX_BATCH_TOKENS, SchedulerConfig
from kvlab.threads import LESSON_THREADS, check_threads
from kvlab.workload import Request, make_workload, seeded_prompt
from kvlab.progress import Progress, no_progress
from kvlab.experiments.serving_run import ServingRun, check_positive_int, resolve_model, runs_table, serve_plan
from kvlab.experiments.presets import LESSON_SPEC


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
                    max_seqs: int = 12, max_model_len: int = 256, clock: str = "wall",
                    executor: Executor | None = None, seed: int = 0, threads: int | None = LESSON_THREADS,
                    progress: Progress = no_progress) -> list[ServingRun]:
    """The same growing requests under each KV budget (in blocks of the lessons' size; None: room for max_seqs
    at max_model_len).

    Prefix caching is off so a recompute really recomputes. ``run.extra`` keeps ``kv_blocks`` and
    ``recomputed_tokens``.
    """
    model = resolve_model(model)
    check_threads(threads)
    requests = preemption_workload(model.config.vocab_size, n, seed=seed)
    blocks_per_seq = -(-max_model_len // LESSON_SPEC.block_size)
    budgets = [max_seqs * blocks_per_seq if b is None else b for b in kv_blocks]
    for b in budgets:
        check_positive_int("kv_blocks", b, blocks_per_seq)
    sched = SchedulerConfig(max_seqs=max_seqs, max_batch_tokens=MAX_BATCH_TOKENS, max_model_len=max_model_len)
    spec = EngineSpec(block_size=LESSON_SPEC.block_size, enable_prefix_caching=False, scheduler=sched)
    plan = [(f"{b} blocks", requests, spec.with_blocks(model.config, b, model.dtype), dict(kv_blocks=b))
            for b in budgets]
    runs = serve_plan(model, plan, "KV budgets", clock=clock, executor=executor, threads=threads, progress=progress)
    for run in runs:
        run.extra["recomputed_tokens"] = recomputed_tokens(run)
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
def prefix_caching_runs(model: Decoder | None = None, n: int = 10, system_prompt_tokens: int = 512,
                        rate: float = 8.0, clock: str = "wall", executor: Executor | None = None, seed: int = 0,
                        threads: int | None = LESSON_THREADS, progress: Progress = no_progress) -> list[ServingRun]:
    """Chat requests sharing a system prompt, arriving every 1/``rate`` s, with prefix caching off and on.

    ``run.extra`` keeps ``prefix_caching`` and ``expected_hit_tokens``: what is reused if every
    request after the first finds the system prompt's full blocks cached,
    (n - 1) x floor(system_prompt_tokens / block_size) x block_size (the lessons' blocks).
    """
    block_size = LESSON_SPEC.block_size
    model = resolve_model(model)
    check_threads(threads)
    check_positive_int("system_prompt_tokens", system_prompt_tokens)
    requests = make_workload("short_short", n, arrival="constant", rate=rate, seed=seed,
                             vocab_size=model.config.vocab_size, shared_prefix_tokens=system_prompt_tokens,
                             max_context=model.config.max_position_embeddings)
    expected = (n - 1) * (system_prompt_tokens // block_size) * block_size
    sched = SchedulerConfig(max_seqs=8, max_batch_tokens=MAX_BATCH_TOKENS)
    plan = [(f"prefix caching {'on' if on else 'off'}", requests,
             EngineSpec(block_size=block_size, enable_prefix_caching=on, scheduler=sched),
             dict(prefix_caching=on, expected_hit_tokens=expected if on else 0)) for on in (False, True)]
    return serve_plan(model, plan, "prefix caching", clock=clock, executor=executor, threads=threads,
                      progress=progress)


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
                         threads: int | None = LESSON_THREADS, progress: Progress = no_progress) -> list[ServingRun]:
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
    plan = [(label, requests, EngineSpec(scheduler=sched),
             dict(chunked=sched.chunked_prefill, long_id=n_decoding, long_arrival_s=long_arrival_s))
            for label, sched in plans]
    return serve_plan(model, plan, "prefill", clock=clock, executor=executor, threads=threads, progress=progress)


def _steps_to_first_token(run: ServingRun, record) -> int:
    """How many engine steps carried ``record``'s request up to its first token (its prompt's steps)."""
    if record.first_token_s is None or run.trace.empty:
        return 0
    t = run.trace
    carried = t["request_ids"].apply(lambda ids: record.request_id in ids)
    return int((carried & (t["end_s"] <= record.first_token_s + 1e-9)).sum())


def chunked_prefill_table(runs: Sequence[ServingRun]) -> pd.DataFrame:
    """Per run: the gaps between tokens of the running decodes (median, max), the long prompt's TTFT and the number
    of steps its prompt took (``long_prompt_steps``: 1 in one step, about prompt / chunk budget in chunks)."""
    rows = []
    for r in runs:
        long_id = r.extra["long_id"]
        decoders = [rec for rec in r.records if rec.request_id != long_id and rec.status == "completed"]
        gaps = np.array([g for rec in decoders for g in rec.itl_s()])
        long_rec = r.record(long_id)
        long = long_rec.clocks()
        rows.append(dict(run=r.label, decode_gaps_n=len(gaps),
                         decode_gap_p50_s=float(np.median(gaps)) if len(gaps) else np.nan,
                         decode_gap_max_s=float(gaps.max()) if len(gaps) else np.nan,
                         long_prompt_ttft_s=long["ttft_s"], long_prompt_steps=_steps_to_first_token(r, long_rec),
                         steps=len(r.trace),
                         max_step_tokens=int(r.trace["num_tokens"].max())))
    out = pd.DataFrame(rows)
    out["max_over_p50"] = out["decode_gap_max_s"] / out["decode_gap_p50_s"]
    return out


__all__ = ["chunked_prefill_runs", "chunked_prefill_table", "chunked_prefill_workload", "preemption_runs",
           "preemption_table", "preemption_workload", "prefix_caching_runs", "prefix_caching_table",
           "recomputed_tokens"]
