"""Offloading under load: the same concurrent requests served with the KV pool on the device and in a slower tier.

``offload_under_load`` serves one workload twice through the engine on the real decoder: with the
paged pool on the compute device (``ModelExecutor``) and with the pool in a slower tier behind a
modelled link (``OffloadedModelExecutor``, see ``kvlab.cache.paged_offloaded``). Every request
arrives at once and more requests than batch slots wait, so batches stay full and their make-up
changes as requests finish and new ones join. The schedule does not depend on timing, so both
runs execute exactly the same steps with the same batches and produce the same tokens (checked):
any difference in their clocks is the offloading (and the machine's noise).

What it returns, per run: every step's time (with the bytes the offloaded pool moved in it) and
every time between tokens (TBT: the gap between two consecutive tokens of one request), to compare
as distributions with ``distribution_table`` (n, p50, p95, IQR).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

from kvlab.clocks import quantiles
from kvlab.model.decoder import Decoder
from kvlab.serving.config import EngineSpec
from kvlab.serving.engine import Engine
from kvlab.serving.offloaded_executor import OffloadedModelExecutor
from kvlab.serving.scheduler import MAX_BATCH_TOKENS, SchedulerConfig
from kvlab.threads import LESSON_THREADS, check_threads, torch_threads
from kvlab.workload import policy_workload
from kvlab.experiments.serving_run import ServingRun, check_positive_int, resolve_model, warm_up

ON_DEVICE, OFFLOADED = "on device", "offloaded"
# The modelled link to the slower tier on a CPU-only machine (GB/s): about a hundredth of what RAM delivers, as a
# host link is next to a GPU's own memory, and slow enough that its time stands out of a busy machine's noise.
# On CUDA the tier is pinned host memory behind the real host-to-GPU link: no model needed (None).
CPU_LINK_GBPS = 0.25


def default_link_gbps(model: Decoder) -> float | None:
    """``CPU_LINK_GBPS`` for a model on the CPU (RAM to RAM needs a modelled link), None on CUDA (the real one)."""
    return None if model.device.type == "cuda" else CPU_LINK_GBPS


@dataclass
class OffloadUnderLoad:
    """Both runs of ``offload_under_load`` and the tables read from them.

    - ``steps``: one row per (run, step): ``duration_s``, the batch (``num_seqs``, ``num_prefill_tokens``,
      ``kv_tokens_read``) and, for the offloaded run, ``bytes_read``/``bytes_written``/``bytes_moved`` and
      ``copy_s``; the on-device run moves no bytes between tiers (0).
    - ``gaps``: one row per (run, request, token after the first): ``gap_s``, the time between tokens.
    - ``same_tokens``: both runs produced exactly the same token ids for every request;
      ``same_schedule``: they ran the same steps with the same sequences and token counts.
    """

    runs: list[ServingRun]
    steps: pd.DataFrame
    gaps: pd.DataFrame
    same_tokens: bool
    same_schedule: bool
    settings: dict = field(default_factory=dict)

    def run(self, label: str) -> ServingRun:
        return next(r for r in self.runs if r.label == label)


def _serve(model: Decoder, requests, label: str, executor, sched: SchedulerConfig) -> tuple[ServingRun, dict]:
    """One run through a fresh engine: the ServingRun and every request's output token ids."""
    engine = Engine(model, EngineSpec(scheduler=sched), executor=executor)
    start = time.perf_counter()
    records = engine.run(requests, clock="wall")
    run = ServingRun.from_engine(label, engine, records, time.perf_counter() - start)
    return run, {rid: list(seq.output_token_ids) for rid, seq in engine.sequences.items()}


def offload_under_load(model: Decoder | None = None, n: int = 16, max_seqs: int = 4, prompt_tokens: int = 192,
                       max_new_tokens: int = 32, spread: float = 0.8, link_gbps: float | Literal["auto"] | None = "auto",
                       max_batch_tokens: int = MAX_BATCH_TOKENS, seed: int = 0, threads: int | None = LESSON_THREADS) -> OffloadUnderLoad:
    """Serve ``n`` requests (mixed lengths around ``prompt_tokens`` / ``max_new_tokens``, all at t = 0) with
    ``max_seqs`` batch slots, once with the KV pool on the device and once offloaded behind ``link_gbps``
    ("auto": ``default_link_gbps``; None: the tier's own speed)."""
    model = resolve_model(model)
    if link_gbps == "auto":
        link_gbps = default_link_gbps(model)
    check_threads(threads)
    check_positive_int("n", n)
    check_positive_int("max_seqs", max_seqs)
    requests = policy_workload(model.config.vocab_size, "mixed", n, prompt_tokens, max_new_tokens, spread=spread,
                               seed=seed)
    sched = SchedulerConfig(policy="continuous", max_seqs=max_seqs, max_batch_tokens=max_batch_tokens)
    warm_up(model, threads)
    offloaded = OffloadedModelExecutor(model, link_gbps=link_gbps)
    try:
        with torch_threads(threads):
            dev, dev_tokens = _serve(model, requests, ON_DEVICE, None, sched)
            off, off_tokens = _serve(model, requests, OFFLOADED, offloaded, sched)
        log = offloaded.step_frame()
        assert offloaded.cache is not None  # the engine built it
        tier = offloaded.cache.memory()
    finally:
        offloaded.close()
    steps = []
    for run, moved in ((dev, None), (off, log)):
        t = run.trace[["run", "step", "duration_s", "num_seqs", "num_prefill_tokens", "num_decode_seqs",
                       "kv_tokens_read"]].copy()
        if moved is None:
            for col in ("bytes_read", "bytes_written", "bytes_moved", "copy_s"):
                t[col] = 0.0 if col == "copy_s" else 0
        else:
            t = t.merge(moved[["step", "bytes_read", "bytes_written", "bytes_moved", "copy_s"]], on="step",
                        how="left", validate="one_to_one")
        steps.append(t)
    gaps = pd.concat([r.tokens() for r in (dev, off)], ignore_index=True).dropna(subset=["gap_s"])
    cols = ["request_ids", "num_new_tokens"]
    same_schedule = dev.trace[cols].astype(str).equals(off.trace[cols].astype(str))
    settings = dict(model=model.config.name, n=n, max_seqs=max_seqs, prompt_tokens=prompt_tokens,
                    max_new_tokens=max_new_tokens, spread=spread, link_gbps=link_gbps, threads=threads,
                    max_batch_tokens=max_batch_tokens, seed=seed, device=str(model.device),
                    tier="pinned host memory" if model.device.type == "cuda" else "a memory-mapped file",
                    tier_bytes=tier.offloaded_bytes, working_bytes=tier.device_bytes,
                    bytes_per_token=model.config.kv_bytes_per_token(model.dtype.itemsize))
    return OffloadUnderLoad([dev, off], pd.concat(steps, ignore_index=True), gaps.reset_index(drop=True),
                            same_tokens=dev_tokens == off_tokens, same_schedule=bool(same_schedule), settings=settings)


def spread_stats(values) -> dict:
    """n, mean, p25, p50, p75, p95 and IQR (p75 - p25) of ``values`` (NaN ignored)."""
    q = quantiles(values, (0.25, 0.5, 0.75, 0.95))
    q["iqr"] = q["p75"] - q["p25"]
    return q


def distribution_table(result: OffloadUnderLoad, ms: bool = False) -> pd.DataFrame:
    """One row per (run, measure): step time and time between tokens, with n, p50, p95, IQR.

    Seconds; with ``ms`` milliseconds, the columns named ``p50_ms`` and so on.
    """
    rows = [{"run": label, "measure": measure, **spread_stats(values)} for label in (ON_DEVICE, OFFLOADED)
            for measure, values in (("step time", result.steps.loc[result.steps["run"] == label, "duration_s"]),
                                    ("time between tokens", result.gaps.loc[result.gaps["run"] == label, "gap_s"]))]
    stats = ["mean", "p25", "p50", "p75", "p95", "iqr"]
    table = pd.DataFrame(rows)[["run", "measure", "n", *stats]]
    if ms:
        table[stats] = table[stats] * 1e3
        table = table.rename(columns={c: f"{c}_ms" for c in stats})
    return table


def paired_steps(result: OffloadUnderLoad) -> pd.DataFrame:
    """The same step in both runs side by side: ``extra_s`` = offloaded - on-device time, with the bytes moved."""
    s = result.steps
    dev = s[s["run"] == ON_DEVICE].set_index("step")
    off = s[s["run"] == OFFLOADED].set_index("step")
    out = off[["num_seqs", "num_prefill_tokens", "kv_tokens_read", "bytes_moved", "copy_s"]].copy()
    out["on_device_s"], out["offloaded_s"] = dev["duration_s"], off["duration_s"]
    out["extra_s"] = out["offloaded_s"] - out["on_device_s"]
    return out.reset_index()


def bytes_by_hand(run: ServingRun, bytes_per_token: int) -> pd.DataFrame:
    """The bytes an offloaded pool must move in each step of ``run``, counted from its trace alone.

    A sequence that had ``stored`` tokens in its blocks before the step reads ceil(stored / block_size) (the
    run's engine's) whole blocks of every layer (K and V: ``bytes_per_token`` per token slot), and writes its new
    tokens back. ``stored`` starts at the prompt tokens found in the prefix cache and grows by the tokens each step
    fed it. Assumes no preemption and no block shared between the sequences of a step (each counted apart).
    """
    if run.stats.get("preemptions"):
        raise ValueError(f"run {run.label!r} preempted sequences; this count does not follow recomputation")
    stored = {r.request_id: int(c) for r, c in zip(run.requests.itertuples(), run.requests["cached_tokens"])}
    block_size, rows = int(run.settings["block_size"]), []
    for step in run.trace.itertuples():
        read = written = 0
        for rid, n in zip(step.request_ids, step.num_new_tokens):
            s = stored[rid]
            read += -(-s // block_size) * block_size * bytes_per_token
            written += n * bytes_per_token
            stored[rid] = s + n
        rows.append((step.step, read, written, read + written))
    return pd.DataFrame(rows, columns=["step", "bytes_read", "bytes_written", "bytes_moved"])


__all__ = ["CPU_LINK_GBPS", "OFFLOADED", "ON_DEVICE", "OffloadUnderLoad", "bytes_by_hand", "default_link_gbps",
           "distribution_table", "offload_under_load", "paired_steps", "spread_stats"]
