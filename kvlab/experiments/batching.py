"""Batching policies on the same requests: static vs continuous, equal vs mixed lengths, and waiting for a fuller batch.

- ``compare_policies``: every request arrives at once; a static batch runs until its longest
  member finishes and only then admits the next group, continuous batching refills a slot as
  soon as a sequence finishes. With equal lengths the two barely differ; with mixed lengths the
  static batch idles on its finished members.
- ``batch_wait_runs``: requests trickle in; a static batch may wait up to ``batch_wait_s`` for
  more members. Fuller batches do more work per step (more tokens per second of compute), and
  the first request of each batch waits longer for its first token.
All on the real decoder with the engine's wall clock, unless an ``executor`` is given.
"""
from __future__ import annotations

from typing import Sequence, cast

import pandas as pd

from kvlab.model.decoder import Decoder
from kvlab.serving.executor import Executor
from kvlab.serving.config import EngineSpec
from kvlab.serving.scheduler import MAX_BATCH_TOKENS, POLICIES, Policy, SchedulerConfig
from kvlab.threads import LESSON_THREADS, check_threads
from kvlab.workload import LENGTHS, arrival_times, policy_workload
from kvlab.progress import Progress, no_progress
from kvlab.experiments.serving_run import ServingRun, check_positive_int, resolve_model, runs_table, serve_plan

# The default requests: 16 at once, mixed outputs long-tailed, in the shuffle whose longest answer arrives early
# (shuffle 0 puts it last, where it runs alone at the end under either rule and the gap shrinks: a lesson of its own).
LESSON_REQUESTS = 16
LESSON_SHUFFLE = 3


def compare_policies(model: Decoder | None = None, lengths: Sequence[str] = LENGTHS,
                     policies: Sequence[str] = POLICIES, n: int = LESSON_REQUESTS, max_seqs: int = 4, prompt_tokens: int = 64,
                     max_new_tokens: int = 48, max_batch_tokens: int = MAX_BATCH_TOKENS, clock: str = "wall",
                     executor: Executor | None = None, seed: int = LESSON_SHUFFLE,
                     threads: int | None = LESSON_THREADS, progress: Progress = no_progress,
                     outputs: str = "long_tail") -> list[ServingRun]:
    """Serve the same all-at-once requests under each policy, for each length mix (mixed outputs long-tailed,
    as chat answers are, unless ``outputs="even"``: ``policy_workload``).

    Runs are labelled "<policy>, <lengths> lengths" and keep ``policy`` and ``lengths`` in ``run.extra``. Both policies
    get the same ``max_seqs`` and token budget.
    """
    model = resolve_model(model)
    check_threads(threads)
    for p in policies:
        if p not in POLICIES:
            raise ValueError(f"unknown policy {p!r}; choose from {', '.join(POLICIES)}")
    workloads = {ls: policy_workload(model.config.vocab_size, ls, n, prompt_tokens, max_new_tokens, seed=seed,
                                     outputs=outputs) for ls in lengths}
    plan = [(f"{p}, {ls} lengths", workloads[ls],
             EngineSpec(scheduler=SchedulerConfig(policy=cast(Policy, p), max_seqs=max_seqs,  # checked above
                                                  max_batch_tokens=max_batch_tokens)),
             dict(policy=p, lengths=ls)) for ls in lengths for p in policies]
    return serve_plan(model, plan, "policies", clock=clock, executor=executor, threads=threads, progress=progress)


def policy_rounds(model: Decoder | None = None, rounds: int = 3, lengths: Sequence[str] = LENGTHS,
                  n: int = LESSON_REQUESTS, max_seqs: int = 4, prompt_tokens: int = 64, max_new_tokens: int = 48,
                  seed: int = LESSON_SHUFFLE,
                  threads: int | None = LESSON_THREADS, progress: Progress = no_progress,
                  outputs: str = "long_tail") -> list[ServingRun]:
    """``compare_policies`` on the real model ``rounds`` times, as paired rounds: each round serves the same requests
    under both policies, back to back, the policy that goes first alternating from round to round (so a machine
    slowing down or speeding up during the cell favours neither). ``run.extra["round"]`` numbers the rounds.

    The equal-length pair of a round, whose schedules are identical, says how far apart the machine alone put two runs
    in that round.
    """
    check_positive_int("rounds", rounds)
    model = resolve_model(model)
    runs: list[ServingRun] = []
    for r in progress(range(rounds), total=rounds, desc="paired rounds", unit="round"):
        order = POLICIES if r % 2 == 0 else tuple(reversed(POLICIES))
        for ls in lengths:
            for p in order:
                run = compare_policies(model, lengths=(ls,), policies=(p,), n=n, max_seqs=max_seqs,
                                       prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, seed=seed,
                                       threads=threads, outputs=outputs)[0]
                run.extra["round"] = r
                runs.append(run)
    return runs


def rounds_summary(table: pd.DataFrame) -> pd.DataFrame:
    """``batching_table(policy_rounds(...))`` with one row per run label: the median of its rounds, and ``rounds``."""
    numeric = [c for c in table.columns if c not in ("run", "policy", "lengths", "round")
               and pd.api.types.is_numeric_dtype(table[c])]
    grouped = table.groupby("run", sort=False)
    out = grouped[numeric].median()
    for key in ("policy", "lengths"):
        if key in table.columns:
            out.insert(0, key, grouped[key].first())
    out.insert(0, "rounds", grouped.size())
    return out.reset_index()


def batch_wait_runs(model: Decoder | None = None, waits: Sequence[float] = (0.0, 0.1, 0.2, 0.4),
                    rate: float = 15.0, n: int = 12, max_seqs: int = 4, prompt_tokens: int = 64,
                    max_new_tokens: int = 32, include_continuous: bool = True, clock: str = "wall",
                    executor: Executor | None = None, seed: int = 0, threads: int | None = LESSON_THREADS,
                    progress: Progress = no_progress) -> list[ServingRun]:
    """Static batching under a trickle (one request every 1/``rate`` s), waiting up to each of ``waits`` to fill.

    A batch starts as soon as it holds ``max_seqs`` requests or its first member has waited ``batch_wait_s``. With
    ``include_continuous`` a continuous-batching run on the same requests is added for reference. ``run.extra`` keeps
    ``policy`` and ``batch_wait_s``.
    """
    model = resolve_model(model)
    check_threads(threads)
    waits = [float(w) for w in waits]
    if not waits or any(not w >= 0 for w in waits):
        raise ValueError(f"waits must be a non-empty list of seconds >= 0, got {waits!r}")
    requests = policy_workload(model.config.vocab_size, "equal", n, prompt_tokens, max_new_tokens,
                               arrivals=arrival_times("constant", n, rate), seed=seed)
    policies: list[tuple[Policy, float]] = [("static", w) for w in waits] + \
        ([("continuous", 0.0)] if include_continuous else [])
    plan = [(f"static, wait {w * 1e3:.0f} ms" if policy == "static" else "continuous (no wait)", requests,
             EngineSpec(scheduler=SchedulerConfig(policy=policy, max_seqs=max_seqs, max_batch_tokens=MAX_BATCH_TOKENS,
                                                  batch_wait_s=w)), dict(policy=policy, batch_wait_s=w))
            for policy, w in policies]
    return serve_plan(model, plan, "batch wait", clock=clock, executor=executor, threads=threads, progress=progress)


def batching_table(runs: Sequence[ServingRun]) -> pd.DataFrame:
    """``runs_table`` with the run's policy, length mix and batch wait in front."""
    table = runs_table(runs)
    for i, key in enumerate(("policy", "lengths", "batch_wait_s", "round")):
        if any(key in r.extra for r in runs):
            table.insert(1 + i, key, [r.extra.get(key) for r in runs])
    return table


def idle_slots(max_new_tokens: Sequence[int], max_seqs: int) -> dict:
    """Decode slots of static batches: how many steps x slots ran, and how many sat idle (ignoring prefill).

    The requests are batched in order, ``max_seqs`` at a time; each batch lasts as long as its longest member, and a
    finished member's slot stays empty until the batch ends.
    """
    check_positive_int("max_seqs", max_seqs)
    lengths = [int(x) for x in max_new_tokens]
    slots = sum(len(b) * max(b) for b in (lengths[i:i + max_seqs] for i in range(0, len(lengths), max_seqs)))
    used = sum(lengths)
    return {"slots": slots, "used": used, "idle": slots - used, "idle_share": (slots - used) / slots if slots else 0.0}
