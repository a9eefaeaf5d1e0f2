"""Cached decode at long context: every step still reads all the stored keys and values.

With a KV cache a decode step computes one new token, but its attention reads the K and V of every earlier position, in
every layer. At a short context that read is small next to the rest of the step (weights, per-operation overhead), so
step time looks flat; at a context of a thousand tokens or more it shows. ``run_context_steps`` prefills prompts of a
few lengths and times the cached decode steps after each; ``context_step_summary`` gives one row per context: step time,
its ratio to the shortest context's, and the K/V bytes the step read (measured from the cache, and equal to the memory
formula ``kv_cache_bytes``).
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from kvlab.generate import generate
from kvlab.model.decoder import Decoder
from kvlab.model.lessons import lesson_model
from kvlab.threads import LESSON_THREADS, check_threads, torch_threads
from kvlab.progress import Progress, no_progress
from kvlab.experiments.slowdown import prompt_ids


def default_contexts(model: Decoder, steps: int = 8) -> tuple[int, ...]:
    """Four prompt lengths from short to the longest that leaves room for ``steps`` decode steps."""
    longest = model.config.max_position_embeddings - steps - 1
    return tuple(sorted({32, longest // 4, longest // 2, longest}))


def check_contexts(model: Decoder, contexts: Sequence[int], steps: int, repeats: int) -> tuple[int, ...]:
    """Every check that can fail, before any token is generated; returns the contexts sorted."""
    if not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an integer >= 2 (decode steps timed per context), got {steps!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    contexts = tuple(contexts)
    if len(contexts) < 2:
        raise ValueError(f"contexts needs at least two prompt lengths to compare, got {contexts!r}")
    limit = model.config.max_position_embeddings
    for n in contexts:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"every context must be a positive integer number of tokens, got {n!r}")
        if n + steps + 1 > limit:
            raise ValueError(f"context {n} + {steps + 1} generated tokens exceeds the model's context of {limit} "
                             f"tokens; use contexts up to {limit - steps - 1} or fewer steps")
    if len(set(contexts)) != len(contexts):
        raise ValueError(f"contexts has repeated lengths: {contexts!r}")
    return tuple(sorted(contexts))


def run_context_steps(model: Decoder | None = None, contexts: Sequence[int] | None = None, steps: int = 8,
                      repeats: int = 3, seed: int = 0, threads: int | None = LESSON_THREADS,
                      progress: Progress = no_progress) -> pd.DataFrame:
    """Prefill a prompt of each length in ``contexts``, then time ``steps`` cached ("dynamic") decode steps.

    Returns one row per (repeat, context, decode step); ``position`` counts the tokens the step attends over, its own
    included, and ``kv_bytes_read`` is the cache's bytes after the step (every stored K and V, which its attention
    read). Repeats interleave the contexts, so a change of machine load hits each alike.
    """
    model = lesson_model(seed) if model is None else model
    contexts = check_contexts(model, default_contexts(model, steps) if contexts is None else contexts, steps, repeats)
    check_threads(threads)
    plan = [(r, n) for r in range(repeats) for n in contexts]
    rows = []
    with torch_threads(threads) as used_threads:
        generate(model, prompt_ids(model, contexts[0], seed), cache="dynamic", max_new_tokens=2)  # warm-up
        for r, n in progress(plan, total=len(plan), desc="prefill + decode", unit="run"):
            frame = generate(model, prompt_ids(model, n, seed), cache="dynamic",
                             max_new_tokens=steps + 1).timeline.to_frame()
            rows += [dict(repeat=r, context=n, token=int(t.token), position=int(t.position),
                          step_ms=float(t.step_ms), kv_bytes_read=int(t.cache_bytes))
                     for t in frame[frame["token"] >= 1].itertuples()]
    out = pd.DataFrame(rows)
    out.attrs.update(model=model.config.name, device=str(model.device), threads=used_threads, steps=steps,
                     repeats=repeats, kv_bytes_per_token=model.config.kv_bytes_per_token())
    return out


def context_step_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per context: step_ms (median over the steps of the fastest of the repeats), vs_shortest, K/V read.

    The fastest of the repeats is the step's own cost (other programs only add time); the median over the steps keeps
    one odd step from deciding. ``kv_mb_read`` is the mean K/V read per step in MB (1e6 bytes); ``extra_ms`` the time a
    step takes beyond the shortest context's.
    """
    if frame.empty:
        raise ValueError("the frame holds no decode steps; run run_context_steps first")
    fastest = frame.groupby(["context", "token"]).agg(step_ms=("step_ms", "min"),
                                                     kv_bytes_read=("kv_bytes_read", "first")).reset_index()
    out = (fastest.groupby("context").agg(step_ms=("step_ms", "median"), kv_bytes_read=("kv_bytes_read", "mean"))
           .reset_index().sort_values("context", ignore_index=True))
    out["kv_mb_read"] = out.pop("kv_bytes_read") / 1e6
    out["vs_shortest"] = out["step_ms"] / out["step_ms"].iloc[0]
    out["extra_ms"] = out["step_ms"] - out["step_ms"].iloc[0]
    return out
