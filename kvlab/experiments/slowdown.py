"""The slowdown: without a KV cache every new token costs more than the one before.

``run_slowdown`` generates the same prompt with cache "none" (the whole sequence is recomputed at every step) and cache
"dynamic" (only the new token is computed), and returns the time of every step. ``slowdown_summary`` turns the claim
"token 200 costs more than token 20" into two numbers per cache: the measured ratio of a late step to an early one, next
to the ratio of work (tokens pushed through the model) that explains it.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from kvlab.cache import CACHE_NAMES
from kvlab.generate import GenerationConfig, check_generation, generate
from kvlab.model.decoder import Decoder
# this experiment's names for the lesson model
from kvlab.model.lessons import lesson_config as slowdown_config, lesson_model as slowdown_model, lesson_scale
from kvlab.progress import Progress, no_progress
from kvlab.threads import LESSON_THREADS, torch_threads


def prompt_ids(model: Decoder, prompt_tokens: int, seed: int = 0) -> list[int]:
    """``prompt_tokens`` seeded random byte ids: a prompt of an exact length, the same on every run."""
    gen = torch.Generator().manual_seed(seed)
    high = min(256, model.config.vocab_size)
    return torch.randint(0, high, (prompt_tokens,), generator=gen).tolist()


def tokens_processed(cache: str, prompt_tokens: int, token: int) -> int:
    """Tokens pushed through the model in the step that produces generated token ``token``.

    Step 0 is the prefill (the whole prompt). After it, "none" recomputes the prompt plus every token generated so far;
    every real cache computes just the one new token.
    """
    return prompt_tokens + token if token == 0 or cache == "none" else 1


def check_slowdown_args(model: Decoder, prompt_tokens: int, max_new_tokens: int, caches: Sequence[str],
                        repeats: int) -> None:
    """Every check that can fail, before any token is generated."""
    if not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be a positive integer, got {prompt_tokens!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 2:
        raise ValueError(f"max_new_tokens must be at least 2 (a prefill and one decode step), got {max_new_tokens!r}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be a positive integer, got {repeats!r}")
    if not caches:
        raise ValueError(f"caches is empty; give at least one of {', '.join(CACHE_NAMES)}")
    ids = [0] * prompt_tokens
    for cache in caches:
        check_generation(model, ids, cache, GenerationConfig(max_new_tokens=max_new_tokens))


def run_slowdown(model: Decoder | None = None, prompt_tokens: int | None = None, max_new_tokens: int | None = None,
                 caches: Sequence[str] = ("none", "dynamic"), repeats: int = 1, seed: int = 0,
                 warmup: bool = True, threads: int | None = LESSON_THREADS, progress: Progress = no_progress) -> pd.DataFrame:
    """Time every generated token, for each cache strategy, on the same prompt.

    Returns one row per (repeat, cache, token) with columns cache, repeat, token (0 = the first generated token,
    produced by the prefill), position, phase, tokens_processed, step_ms, time_s (since generation started),
    cache_bytes. Runs alternate between caches so a change in machine load hits every cache alike. A short warm-up run
    per cache (not recorded) pays one-time costs. ``prompt_tokens`` and ``max_new_tokens`` default to the device's
    lesson sizes (``lesson_scale``).
    """
    model = slowdown_model(seed) if model is None else model
    scale = lesson_scale(model.device)
    prompt_tokens = scale.prompt_tokens if prompt_tokens is None else prompt_tokens
    max_new_tokens = scale.max_new_tokens if max_new_tokens is None else max_new_tokens
    caches = tuple(caches)
    check_slowdown_args(model, prompt_tokens, max_new_tokens, caches, repeats)
    ids = prompt_ids(model, prompt_tokens, seed)
    plan = [(r, cache) for r in range(repeats) for cache in caches]
    frames = []
    with torch_threads(threads) as used_threads:
        if warmup:
            for cache in caches:
                generate(model, ids, cache=cache, max_new_tokens=2)
        for r, cache in progress(plan, total=len(plan), desc="generating", unit="run"):
            result = generate(model, ids, cache=cache, max_new_tokens=max_new_tokens)
            frame = result.timeline.to_frame()
            frame.insert(0, "cache", cache)
            frame.insert(1, "repeat", r)
            frame.insert(4, "tokens_processed", [tokens_processed(cache, prompt_tokens, t) for t in frame["token"]])
            frames.append(frame.drop(columns="bytes_moved"))
    out = pd.concat(frames, ignore_index=True)
    out.attrs.update(model=model.config.name, parameters=model.num_parameters(), device=str(model.device),
                     threads=used_threads, prompt_tokens=prompt_tokens,
                     max_new_tokens=max_new_tokens, repeats=repeats)
    return out


def step_curves(frame: pd.DataFrame) -> pd.DataFrame:
    """One curve per cache from the repeats: the fastest step_ms and the median time_s per token.

    Other programs on the machine can only ever add time to a step, so the fastest of the repeats is the best estimate
    of what the step itself costs (the rule ``timeit`` follows). The cumulative time stays the median run's: that is the
    wait a user would typically see.
    """
    return (frame.groupby(["cache", "token"], sort=False)
            .agg(position=("position", "first"), tokens_processed=("tokens_processed", "first"),
                 step_ms=("step_ms", "min"), time_s=("time_s", "median"))
            .reset_index())


def slowdown_summary(frame: pd.DataFrame, early: int | None = None, late: int | None = None,
                     window: int = 5) -> pd.DataFrame:
    """Per cache: step time at an early and a late token, their ratio, and the ratio of work.

    Each step time is the median over ``window`` tokens either side of the fastest-of-repeats curve (``step_curves``),
    so a step delayed by another program does not decide the ratio. ``early`` defaults to the token 10% into the run,
    ``late`` to the last token whose window fits in the run (token 194 of 200). ``work_ratio`` is what the ratio would
    be if time were proportional to tokens processed: (prompt + late) / (prompt + early) without a cache, 1 with one.
    The measured ratio is the work ratio times late / early of the cost per token processed
    (``*_ms_per_token_processed``), so it falls short of the work ratio exactly when a pass over more tokens costs less
    per token (``per_token_costs``).
    """
    n = int(frame["token"].max()) + 1  # tokens per run; decode tokens are 1 .. n-1
    early = max(window + 1, round(0.1 * n)) if early is None else early
    late = n - 1 - window if late is None else late
    if not (1 <= early - window and early < late and late + window <= n - 1):
        raise ValueError(f"early={early} and late={late} with window={window} need window+1 <= early < late <= "
                         f"{n - 1 - window} for a run of {n} tokens; generate more tokens, or pick a smaller "
                         "window or tokens further inside the run")
    med = step_curves(frame)
    rows = []
    for cache, curve in med.groupby("cache", sort=False):
        curve = curve.set_index("token")

        def around(t: int) -> float:
            return float(curve.loc[t - window:t + window, "step_ms"].median())

        e_ms, l_ms = around(early), around(late)
        e_work, l_work = curve.at[early, "tokens_processed"], curve.at[late, "tokens_processed"]
        rows.append(dict(cache=cache, early_token=early, late_token=late,
                         early_step_ms=e_ms, late_step_ms=l_ms, measured_ratio=l_ms / e_ms,
                         early_tokens_processed=int(e_work), late_tokens_processed=int(l_work),
                         work_ratio=l_work / e_work, total_s=float(curve["time_s"].iloc[-1]),
                         early_ms_per_token_processed=e_ms / e_work, late_ms_per_token_processed=l_ms / l_work))
    return pd.DataFrame(rows)


def per_token_costs(frame: pd.DataFrame, **summary_options) -> pd.DataFrame:
    """What one processed token cost in a step: step time / tokens that step pushed through the model.

    One row per (cache, early or late token of ``slowdown_summary``). The rows show why the measured slowdown falls
    short of the work ratio: the matrix products of a pass read every weight once for all its tokens, and each operation
    starts once per pass, so a pass over many tokens costs far less per token than a pass over one (the same reason a
    prefill takes far less than one decode step per prompt token).
    """
    rows = []
    for r in slowdown_summary(frame, **summary_options).itertuples():
        for which in ("early", "late"):
            step, work = getattr(r, f"{which}_step_ms"), getattr(r, f"{which}_tokens_processed")
            rows.append(dict(cache=r.cache, token=getattr(r, f"{which}_token"), tokens_processed=work,
                             step_ms=step, ms_per_token_processed=step / work))
    return pd.DataFrame(rows)


def _theil_sen(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(slope, intercept) of the Theil-Sen line: the median of pairwise slopes, then the median intercept."""
    i, j = np.triu_indices(len(x), k=1)
    keep = x[j] != x[i]  # a resample may hold one step twice
    slope = float(np.median((y[j] - y[i])[keep] / (x[j] - x[i])[keep]))
    return slope, float(np.median(y - slope * x))


def slowdown_fit(frame: pd.DataFrame, level: float = 0.95, resamples: int = 200, seed: int = 0) -> pd.DataFrame:
    """Per cache, a line through decode step time vs context length: step_ms ≈ fixed_ms + slope × position.

    ``us_per_context_token`` is what one more token of context adds to every step within the measured range: without a
    cache, the cost of recomputing that token; with one, the cost of reading its stored K/V. ``fixed_ms`` is where the
    line meets zero context: an extrapolated estimate of what every uncached pass pays whatever it holds (where the cost
    per token still falls across the range the curve bends and the line meets zero higher; ``per_token_costs`` needs no
    line). A Theil-Sen fit (median of pairwise slopes), so steps slowed by other programs barely move it;
    ``fixed_low_ms`` and ``fixed_high_ms`` bound ``fixed_ms`` at ``level`` over ``resamples`` seeded bootstrap resamples
    of the steps.
    """
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"level={level} must lie in (0, 1) and resamples={resamples} be at least 1")
    med = step_curves(frame)
    rng = np.random.default_rng(seed)
    rows = []
    for cache, curve in med.groupby("cache", sort=False):
        d = curve[curve["token"] >= 1]
        x, y = d["position"].to_numpy(dtype=float), d["step_ms"].to_numpy(dtype=float)
        if len(x) < 2:
            raise ValueError(f"cache {cache!r} has {len(x)} decode step(s); a line needs 2, generate more tokens")
        slope, intercept = _theil_sen(x, y)
        picks = (rng.integers(0, len(x), len(x)) for _ in range(resamples))
        fixed = [_theil_sen(x[k], y[k])[1] for k in picks if len(np.unique(x[k])) > 1]
        low, high = np.quantile(fixed, [(1 - level) / 2, (1 + level) / 2])
        rows.append(dict(cache=cache, fixed_ms=intercept, fixed_low_ms=float(low), fixed_high_ms=float(high),
                         us_per_context_token=slope * 1e3, first_position=int(x[0]), last_position=int(x[-1])))
    return pd.DataFrame(rows)


def prefill_vs_decode(frame: pd.DataFrame) -> pd.Series:
    """The prefill step against a typical decode step: prompt_tokens, prefill_ms, decode_ms and ratio.

    The prefill (token 0) pushes the whole prompt through the model in one pass; a cached decode step pushes one token.
    ``decode_ms`` is the median of the decode steps, each the fastest of the repeats (``step_curves``). Read from the
    "dynamic" cache's steps when the run has them, else the first's.
    """
    cache = "dynamic" if "dynamic" in set(frame["cache"]) else frame["cache"].iloc[0]
    curve = step_curves(frame[frame["cache"] == cache]).set_index("token")
    if len(curve) < 2:
        raise ValueError(f"cache {cache!r} has no decode step after the prefill; generate at least 2 tokens")
    prefill = float(curve.at[0, "step_ms"])
    decode = float(curve.loc[1:, "step_ms"].median())
    return pd.Series(dict(cache=cache, prompt_tokens=int(curve.at[0, "tokens_processed"]), prefill_ms=prefill,
                          decode_ms=decode, ratio=prefill / decode))


# -- what a prediction is compared with (``guess.against(result, measure)``): the ratio of two fresh clock readings,
# which no earlier output can state, so no input is listed for the search (``Comparison.inputs``) ----------------
def prefill_over_decode(result: Any) -> tuple[float, dict]:
    """The prefill's time over a decode step's, from a run (a panel's result or its frame; ``prefill_vs_decode``)."""
    r = prefill_vs_decode(getattr(result, "frame", result))
    return float(r.ratio), {}


def late_over_early(result: Any) -> tuple[float, dict]:
    """The slowdown from a run: without a cache, the late step's time over the early step's (``slowdown_summary``)."""
    r = slowdown_summary(getattr(result, "frame", result)).set_index("cache").loc["none"]
    return float(r.measured_ratio), {}
