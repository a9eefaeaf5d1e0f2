"""Claims of notebook 01 (the slowdown), checked on the learner's run of ``run_slowdown``.

Every claim here rests on wall-clock time, so each states a qualitative fact with a margin:
uncached steps grow and cached ones stay nearly flat; the gap between the two arrivals widens;
the measured slowdown stays below the work ratio, because a pass over many tokens costs far less
per token than a pass over one; and a line through the uncached steps splits each into a part
every pass pays whatever it holds (of the order of a whole cached step) and a small part per token.
At a long context (``run_context_steps``) the cached steps are no longer flat: each reads every
stored K/V, and that read grows with the context.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import pandas as pd

from ..experiments.long_context import context_step_summary, run_context_steps
from ..experiments.slowdown import run_slowdown, slowdown_fit, slowdown_model, slowdown_summary, step_curves
from ..model.lessons import LessonScale, lesson_scale
from .framework import claim, frame_of

NOTEBOOK = "01_the_slowdown.ipynb"


EXAMPLE_NEW_TOKENS_CPU = 80  # on CPU the example is shorter than the lesson's run (seconds, not a minute)


def example_sizes(scale: LessonScale | None = None) -> dict:
    """The example run's prompt and new tokens, from the lesson sizes of this device (``lesson_scale()``).

    On CPU: the lesson's prompt and 80 new tokens. On a GPU: the lesson's own sizes (512 + 400 on the
    90M model), since short steps there cost their kernel launches whatever they hold, and uncached
    tokens would not slow down.
    """
    scale = lesson_scale() if scale is None else scale
    new = min(scale.max_new_tokens, EXAMPLE_NEW_TOKENS_CPU) if scale.device == "cpu" else scale.max_new_tokens
    return dict(prompt_tokens=scale.prompt_tokens, max_new_tokens=new)


@functools.lru_cache(maxsize=1)
def _example() -> pd.DataFrame:
    return run_slowdown(slowdown_model(), **example_sizes(), repeats=2)


def steps_by_hand(step_ms: dict[str, Callable[[int, int], float]], prompt_tokens: int = 32,
                  new_tokens: int = 80) -> pd.DataFrame:
    """A ``run_slowdown`` frame built by hand (one repeat): each cache's step time in ms, a function of
    (token, tokens that step pushes through the model). For the counter-examples of the claims."""
    rows = []
    for cache, ms_of in step_ms.items():
        t = 0.0
        for token in range(new_tokens):
            processed = prompt_tokens if token == 0 else (prompt_tokens + token if cache == "none" else 1)
            ms = float(ms_of(token, processed))
            t += ms / 1e3
            rows.append(dict(cache=cache, repeat=0, token=token, position=prompt_tokens + token,
                             tokens_processed=processed, time_s=t, step_ms=ms,
                             phase="prefill" if token == 0 else "decode", cache_bytes=0))
    frame = pd.DataFrame(rows)
    frame.attrs.update(prompt_tokens=prompt_tokens, max_new_tokens=new_tokens, repeats=1)
    return frame


# Counter-examples: runs on which each sentence below is false (tests/test_claims.py checks they are marked ✗).
def _flat_uncached(_example: Any) -> pd.DataFrame:  # uncached steps that do not grow
    return steps_by_hand({"none": lambda token, n: 1.0 + 0.01 * (token % 2), "dynamic": lambda token, n: 1.0})


def _growing_cached(_example: Any) -> pd.DataFrame:  # cached steps that double over the run
    return steps_by_hand({"none": lambda token, n: 0.05 * n, "dynamic": lambda token, n: 1.0 + 0.02 * token})


def _gap_stops_growing(_example: Any) -> pd.DataFrame:  # uncached as fast as cached in the second half
    return steps_by_hand({"none": lambda token, n: 2.0 if token < 40 else 1.0, "dynamic": lambda token, n: 1.0})


def _time_follows_work(_example: Any) -> pd.DataFrame:  # each uncached step costs its tokens times a rate (and a bit)
    return steps_by_hand({"none": lambda token, n: 0.05 * n ** 1.05, "dynamic": lambda token, n: 1.0})


def _no_fixed_part(_example: Any) -> pd.DataFrame:  # an uncached pass costs per token exactly a cached step
    return steps_by_hand({"none": lambda token, n: 1.0 * n, "dynamic": lambda token, n: 1.0})


def _line_through_zero(_example: Any) -> pd.DataFrame:  # uncached steps proportional to their context
    return steps_by_hand({"none": lambda token, n: 0.05 * (32 + token), "dynamic": lambda token, n: 1.0})


def _row(result: Any, cache: str) -> pd.Series:
    summary = slowdown_summary(frame_of(result)).set_index("cache")
    return summary.loc[cache]


@claim(NOTEBOOK, clock="wall", counterexample=_flat_uncached, example=_example,
       says="without a cache, token {late} took {ratio:.1f}× as long as token {early} (the work grew {work:.1f}×)",
       otherwise="the late steps were not clearly slower than the early ones. With a short prompt and few tokens "
                 "the growing part is small; generate more tokens, and set repeats to 3 so that steps slowed by "
                 "other programs are filtered out. On a GPU a model this small can take about as long for a "
                 "few hundred tokens as for one: the GPU is waiting for Python, not computing.")
def uncached_tokens_slow_down(result: Any) -> dict:
    r = _row(result, "none")
    return dict(late=int(r.late_token), early=int(r.early_token), ratio=r.measured_ratio, work=r.work_ratio,
                holds=r.measured_ratio > 1.2)


@claim(NOTEBOOK, clock="wall", counterexample=_growing_cached, example=_example,
       says="with a cache, token {late} took {ratio:.2f}× as long as token {early}: nearly flat at this short "
            "context (at most {context} tokens)",
       otherwise="the cached steps at the early and late tokens differ by more than half. That is usually "
                 "another program on the machine during part of the run: press Run again with repeats at 3.")
def cached_steps_stay_flat(result: Any) -> dict:
    r = _row(result, "dynamic")
    frame = frame_of(result)
    context = int(frame.loc[frame["token"] == r.late_token, "position"].max())  # keys its attention read
    return dict(late=int(r.late_token), early=int(r.early_token), ratio=r.measured_ratio, context=context,
                holds=1 / 1.5 < r.measured_ratio < 1.5)


@claim(NOTEBOOK, clock="wall", counterexample=_gap_stops_growing, example=_example,
       says="the last token arrived after {none_s:.2f} s without a cache and {dynamic_s:.2f} s with one; the gap "
            "between them grew from {gap_mid:.2f} s at token {mid} to {gap_end:.2f} s at token {last}",
       otherwise="the gap did not keep widening: the uncached steps were not clearly slower than the cached "
                 "ones for the whole run. Look at the left panel: where the red line sits on the blue one, "
                 "the gap stops growing. A run slowed by other programs in its second half can also do this; "
                 "press Run again.")
def uncached_wait_gap_widens(result: Any) -> dict:
    curves = step_curves(frame_of(result))
    arrival = curves.pivot(index="token", columns="cache", values="time_s")  # median run's arrival times
    last = int(arrival.index.max())
    mid = last // 2
    gap = arrival["none"] - arrival["dynamic"]
    gap_mid, gap_end = float(gap.loc[mid]), float(gap.loc[last])
    return dict(none_s=float(arrival.at[last, "none"]), dynamic_s=float(arrival.at[last, "dynamic"]),
                gap_mid=gap_mid, gap_end=gap_end, mid=mid, last=last,
                holds=gap_mid > 0 and gap_end > 1.5 * gap_mid)


@claim(NOTEBOOK, clock="wall", counterexample=_time_follows_work, example=_example,
       says="the measured slowdown ({ratio:.1f}×) stays below the work ratio ({work:.1f}×): per token processed, "
            "the uncached step of token {late} ({late_n} tokens) cost {late_pp:.3f} ms, less than the step of "
            "token {early} ({early_n} tokens) at {early_pp:.3f} ms",
       otherwise="here the measured ratio reached the work ratio: the late steps cost as much per token as the "
                 "early ones. That happens once a pass holds enough tokens to keep the machine busy (a long "
                 "prompt, a larger model), or when other programs slowed the late steps; press Run again.")
def measured_slowdown_below_work(result: Any) -> dict:
    r = _row(result, "none")
    return dict(ratio=r.measured_ratio, work=r.work_ratio, late=int(r.late_token), early=int(r.early_token),
                late_n=int(r.late_tokens_processed), early_n=int(r.early_tokens_processed),
                late_pp=r.late_ms_per_token_processed, early_pp=r.early_ms_per_token_processed,
                holds=r.measured_ratio < r.work_ratio)


@claim(NOTEBOOK, clock="wall", counterexample=_no_fixed_part, example=_example,
       says="a cached step, which pushes one token through the model, cost {cached:.2f} ms per token; the "
            "uncached steps of tokens {early} and {late}, with {early_n} and {late_n} tokens in one pass, cost "
            "{early_pp:.3f} and {late_pp:.3f} ms per token: at least {times:.0f}× less",
       otherwise="here a pass over many tokens did not cost clearly less per token than a pass over one. "
                 "That is unusual; check that the run used one thread (frame.attrs) and press Run again.")
def many_tokens_per_pass_cost_less_each(result: Any) -> dict:
    none, cached = _row(result, "none"), _row(result, "dynamic")
    one = float(cached.early_ms_per_token_processed)
    worst = max(none.early_ms_per_token_processed, none.late_ms_per_token_processed)
    return dict(cached=one, early=int(none.early_token), late=int(none.late_token),
                early_n=int(none.early_tokens_processed), late_n=int(none.late_tokens_processed),
                early_pp=none.early_ms_per_token_processed, late_pp=none.late_ms_per_token_processed,
                times=one / worst, holds=one > 2 * worst)


@claim(NOTEBOOK, clock="wall", counterexample=_line_through_zero, example=_example,
       says="the line through the uncached steps meets zero context at {fixed:.1f} ms ({times:.1f}× a whole cached "
            "step of {cached:.2f} ms), and each token of context adds {slope:.3f} ms: what every pass pays, "
            "whatever it holds, weighs as much as {worth} tokens of context",
       otherwise="here the line's fixed part is well below a whole cached step. With a long prompt, attention "
                 "over every pair of tokens in a pass makes the curve bend upwards and the line meets zero low; "
                 "more often, the load of the machine changed during the run, and the line, which extends the "
                 "measured steps down to zero context, tilted with it (press Run again with repeats at 3). "
                 "The cost per token processed, above, does not depend on a line.")
def uncached_steps_share_a_per_pass_cost(result: Any) -> dict:
    frame = frame_of(result)
    fit = slowdown_fit(frame).set_index("cache")
    cached = float(_row(result, "dynamic").early_step_ms)
    fixed = float(fit.loc["none", "fixed_ms"])
    slope = float(fit.loc["none", "us_per_context_token"]) / 1e3
    if fixed <= 0:
        worth = "no"
    else:  # steps that do not grow at all: the whole step is paid per pass
        worth = f"{fixed / slope:.0f}" if slope > 0 else "any number of"
    return dict(fixed=fixed, cached=cached, times=fixed / cached, slope=slope, worth=worth,
                holds=fixed > 0.5 * cached)


# -- with a cache, at long context (run_context_steps) --------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _long_context_example() -> pd.DataFrame:
    return run_context_steps(slowdown_model(), repeats=2)


def _flat_long_context(frame: pd.DataFrame) -> pd.DataFrame:
    """The example with every step at every context as fast as the shortest context's: no growth to see."""
    frame = frame.copy()
    frame["step_ms"] = float(frame.loc[frame["context"] == frame["context"].min(), "step_ms"].min())
    return frame


@claim(NOTEBOOK, clock="wall", example=_long_context_example, counterexample=_flat_long_context,
       says="with a cache, a step at a context of {long} tokens took {ratio:.2f}× a step at {short} tokens "
            "({short_ms:.2f} → {long_ms:.2f} ms): the K/V the step reads grew from {short_mb:.2f} to "
            "{long_mb:.2f} MB",
       otherwise="here the cached steps at long context were not clearly slower than at short context. On a GPU "
                 "a model this small waits for Python and kernel launches, and reading a few MB of K/V takes "
                 "microseconds; on a CPU, other programs slowing the short-context steps can hide it (raise "
                 "repeats and run again).")
def cached_steps_grow_at_long_context(result: Any) -> dict:
    """With a cache, attention still reads every stored K/V each step: at a long context it shows in step time."""
    s = context_step_summary(frame_of(result))
    short, long = s.iloc[0], s.iloc[-1]
    return dict(short=int(short.context), long=int(long.context), ratio=float(long.vs_shortest),
                short_ms=float(short.step_ms), long_ms=float(long.step_ms), short_mb=float(short.kv_mb_read),
                long_mb=float(long.kv_mb_read), holds=long.vs_shortest > 1.15)
