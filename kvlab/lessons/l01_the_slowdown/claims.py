"""Claims of notebook 01 (the slowdown), checked on the learner's run of ``run_slowdown``.

Every claim here rests on wall-clock time, so each states a qualitative fact with a margin.
"""
from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pandas as pd

from kvlab.experiments.long_context import context_step_summary
from kvlab.experiments.slowdown import slowdown_fit, slowdown_summary, step_curves
from kvlab.lessons.common.claims import claim, frame_of

NOTEBOOK = "01_the_slowdown.ipynb"


def _row(result: Any, cache: str) -> pd.Series:
    return slowdown_summary(frame_of(result)).set_index("cache").loc[cache]


# One boundary between "flat" and "grows": a late/early step ratio is one or the other, never both (uncached steps
# that slow down and cached ones that stay flat, at short context; cached steps that grow, at long context). A fixed
# line of the course, not a margin from the run's noise: every sentence that uses it states it.
FLAT_WITHIN = 1.3
# slowdown_summary's default window: each early and late step is the median of 2 × window + 1 steps
SUMMARY_WINDOW = int(inspect.signature(slowdown_summary).parameters["window"].default)


@claim(NOTEBOOK, clock="wall",
       says="""
           without a cache, token {late} took {ratio:.1f}× as long as token {early} (the work grew {work:.1f}×):
           slower by at least {flat:g}×, the course's line between a flat step and a growing one""",
       otherwise="""
           the late steps were not clearly slower than the early ones. With a short prompt and few tokens the
           growing part is small; generate more tokens, and set repeats to 3 so that steps slowed by other
           programs are filtered out. On a GPU a model this small can take about as long for a few hundred tokens
           as for one: the GPU is waiting for Python, not computing.""")
def uncached_tokens_slow_down(result: Any) -> dict:
    r = _row(result, "none")
    return dict(late=int(r.late_token), early=int(r.early_token), ratio=r.measured_ratio, work=r.work_ratio,
                flat=FLAT_WITHIN, holds=r.measured_ratio >= FLAT_WITHIN)


@claim(NOTEBOOK, clock="wall",
       says="""
           with a cache, token {late} took {ratio:.2f}× as long as token {early}: nearly flat at this short
           context (at most {context} tokens), within {flat:g}× either way, the course's line between a flat step
           and a growing one""",
       otherwise=f"""
           the cached steps at the early and late tokens differ by a factor of {FLAT_WITHIN:g} or more. That is usually
           another program on the machine during part of the run: press Run again with repeats at 3.""")
def cached_steps_stay_flat(result: Any) -> dict:
    r = _row(result, "dynamic")
    frame = frame_of(result)
    context = int(frame.loc[frame["token"] == r.late_token, "position"].max())  # keys its attention read
    return dict(late=int(r.late_token), early=int(r.early_token), ratio=r.measured_ratio, context=context,
                flat=FLAT_WITHIN, holds=1 / FLAT_WITHIN < r.measured_ratio < FLAT_WITHIN)


# How far the per-step difference between the two paths must move, in standard errors of its halves' means,
# before the gap between arrivals counts as widening faster than a constant difference per step would widen it.
GAP_MARGIN_SE = 2.0


@claim(NOTEBOOK, clock="wall",
       says="""
           the gap between the arrivals without and with a cache ({gap_end:.2f} s at token {last}) widened
           faster as the run went on: an uncached step fell on average {late_ms:.2f} ms behind a cached one per
           step over tokens {mid_next} to {last}, against {early_ms:.2f} ms per step over tokens 1 to {mid}
           ({times:.1f}×; a constant
           difference per step would give 1×, and this run's step-to-step scatter allows ±{margin:.2f} ms)""",
       otherwise="""
           the uncached steps did not fall further behind the cached ones late in the run than early: the gap
           grew by about the same each token, which a constant difference per step does without any slowdown.
           Look at the left panel: where the red line runs parallel to the blue one, the uncached steps are not
           slowing down. A run slowed by other programs in its first half can also do this; press Run again.""")
def uncached_wait_gap_widens(result: Any) -> dict:
    """Decided on the per-step difference (fastest of the repeats), whose sum is the gap: its mean over the second
    half of the decode steps exceeds its mean over the first half by more than ``GAP_MARGIN_SE`` standard errors of
    that difference, the standard error from the run's own step-to-step scatter. A constant difference per step
    (the gap then grows linearly, doubling from the middle to the end) does not hold."""
    curves = step_curves(frame_of(result))
    steps = curves.pivot(index="token", columns="cache", values="step_ms")
    arrival = curves.pivot(index="token", columns="cache", values="time_s")  # median run's arrival times
    last = int(steps.index.max())
    mid = max(1, last // 2)
    behind = (steps["none"] - steps["dynamic"]).loc[1:]  # each decode step: how far the uncached one falls behind
    early, late = behind.loc[1:mid].to_numpy(), behind.loc[mid + 1:].to_numpy()
    # the step-to-step scatter, a trend left out: median |X - Y| of neighbours = 0.954 sd for X, Y independent normal
    d = np.abs(np.diff(behind.to_numpy()))
    sd = float(np.median(d)) / 0.954 if len(d) > 1 else float("nan")
    se = sd * float(np.sqrt(1 / max(len(early), 1) + 1 / max(len(late), 1)))
    early_ms = float(early.mean()) if len(early) else float("nan")
    late_ms = float(late.mean()) if len(late) else float("nan")
    return dict(gap_end=float(arrival.at[last, "none"] - arrival.at[last, "dynamic"]), last=last, mid=mid,
                mid_next=mid + 1, early_ms=early_ms, late_ms=late_ms,
                times=late_ms / early_ms if early_ms > 0 else float("nan"), margin=GAP_MARGIN_SE * se,
                holds=bool(early_ms > 0 and late_ms - early_ms > GAP_MARGIN_SE * se))


# How many standard errors of the measured ratio, from the run's own step-to-step scatter, it must stay below the
# work ratio by.
BELOW_WORK_SE = 2.0


def _median_step_se(steps: np.ndarray, at: float, window: int) -> float:
    """The standard error of one windowed median step of ``slowdown_summary`` (``2 * window + 1`` steps around a
    token), as a share of that step: the uncached steps' own step-to-step scatter, their trend left out (the
    differences of neighbours, less their median, scaled to a normal sd), times sqrt(pi / 2) / sqrt(steps)."""
    d = np.diff(steps)
    if len(d) < 2:
        return float("nan")
    sd = float(np.median(np.abs(d - np.median(d)))) / 0.954
    return sd * float(np.sqrt(np.pi / 2 / (2 * window + 1))) / at


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           the measured slowdown ({ratio:.1f}×) stays below the work ratio ({work:.1f}×) by more than {margin:.1%},
           twice the standard error this run's step-to-step scatter gives the ratio: per token processed, the
           uncached step of token {late} ({late_n} tokens) cost {late_pp:.3f} ms, less than the step of token
           {early} ({early_n} tokens) at {early_pp:.3f} ms""",
       otherwise="""
           here the measured ratio reached the work ratio, or came within this run's own scatter of it: the late
           steps cost about as much per token as the early ones. That happens once a pass holds enough tokens to
           keep the machine busy (a long prompt, a larger model), or when other programs slowed the late steps;
           press Run again.""")
def measured_slowdown_below_work(result: Any) -> dict:
    """The ratio times (1 + BELOW_WORK_SE relative standard errors) stays below the work ratio, the standard error of
    each windowed median step from the uncached steps' own step-to-step scatter (fastest of the repeats)."""
    r = _row(result, "none")
    curve = step_curves(frame_of(result))
    steps = curve[(curve["cache"] == "none") & (curve["token"] >= 1)].sort_values("token")["step_ms"].to_numpy()
    rel = float(np.hypot(_median_step_se(steps, r.early_step_ms, SUMMARY_WINDOW),
                         _median_step_se(steps, r.late_step_ms, SUMMARY_WINDOW)))
    margin = BELOW_WORK_SE * rel
    return dict(ratio=r.measured_ratio, work=r.work_ratio, late=int(r.late_token), early=int(r.early_token),
                late_n=int(r.late_tokens_processed), early_n=int(r.early_tokens_processed),
                late_pp=r.late_ms_per_token_processed, early_pp=r.early_ms_per_token_processed, margin=margin,
                holds=bool(r.measured_ratio * (1 + margin) < r.work_ratio))


@claim(NOTEBOOK, clock="wall",
       says="""
           a cached step, which pushes one token through the model, cost {cached:.2f} ms per token; the uncached
           steps of tokens {early} and {late}, with {early_n} and {late_n} tokens in one pass, cost {early_pp:.3f}
           and {late_pp:.3f} ms per token: at least {times:.0f}× less""",
       otherwise="""
           here a pass over many tokens did not cost clearly less per token than a pass over one. That is unusual;
           check that the run used one thread (frame.attrs) and press Run again.""")
def many_tokens_per_pass_cost_less_each(result: Any) -> dict:
    none, cached = _row(result, "none"), _row(result, "dynamic")
    one = float(cached.early_ms_per_token_processed)
    worst = max(none.early_ms_per_token_processed, none.late_ms_per_token_processed)
    return dict(cached=one, early=int(none.early_token), late=int(none.late_token),
                early_n=int(none.early_tokens_processed), late_n=int(none.late_tokens_processed),
                early_pp=none.early_ms_per_token_processed, late_pp=none.late_ms_per_token_processed,
                times=one / worst, holds=one > 2 * worst)


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           the line through the uncached steps meets zero context at {fixed:.2f} ms ({low:.2f} to {high:.2f} ms
           over resampled steps; {times:.1f}× a whole cached step of {cached:.2f} ms), and each token of context
           adds {slope:.3f} ms: what every pass pays, whatever it holds, weighs as much as {worth} tokens of
           context""",
       otherwise="""
           here the line's fixed part is not clearly above zero: resampling the steps moves where it meets zero
           context down to nothing or below. With a long prompt, attention over every pair of tokens in a pass
           makes the curve bend upwards and the line meets zero low; more often, the load of the machine changed
           during the run, and the line, which extends the measured steps down to zero context, tilted with it
           (press Run again with repeats at 3). The cost per token processed, above, does not depend on a
           line.""")
def uncached_steps_share_a_per_pass_cost(result: Any) -> dict:
    """Decided by the run's own scatter: the lower end of the meeting point's resampled interval is above zero."""
    fit = slowdown_fit(frame_of(result)).set_index("cache")
    cached = float(_row(result, "dynamic").early_step_ms)
    fixed, low, high = (float(fit.loc["none", k]) for k in ("fixed_ms", "fixed_low_ms", "fixed_high_ms"))
    slope = float(fit.loc["none", "us_per_context_token"]) / 1e3
    # steps that do not grow at all (slope <= 0): the whole step is paid per pass
    worth = "no" if fixed <= 0 else f"{fixed / slope:.0f}" if slope > 0 else "any number of"
    return dict(fixed=fixed, low=low, high=high, cached=cached, times=fixed / cached, slope=slope, worth=worth,
                holds=low > 0)


# -- with a cache, at long context (run_context_steps) --------------------------------------------------------
@claim(NOTEBOOK, clock="wall",
       says="""
           with a cache, a step at a context of {long} tokens took {ratio:.2f}× a step at {short} tokens
           ({short_ms:.2f} → {long_ms:.2f} ms): the step grew by {slope:.2f} ms per 1,000 tokens of context (± {se:.2f},
           a straight line through the fastest of the repeats of each of {n} steps), more than twice its standard
           error, as the K/V a step reads (and, in kvlab's dynamic cache, copies) grew from {short_mb:.2f} to
           {long_mb:.2f} MB""",
       otherwise="""
           here the cached steps did not grow with the context by more than twice the line's standard error. On a
           GPU a model this small waits for Python and kernel launches, and reading a few MB of K/V takes
           microseconds; on a CPU, other programs slowing steps at random can hide it (raise repeats and run
           again).""")
def cached_steps_grow_at_long_context(result: Any) -> dict:
    """With a cache, attention still reads every stored K/V each step: the step's time grows with the context.

    Decided on the slope of a straight line through every decode step's fastest repeat against its context (the
    K/V it read), by more than GROWS_SE standard errors, not on the long/short ratio against a fixed line: on a
    CPU the growth is a fraction of the step (1.3-1.4x at nearly the whole context), and the slope over all the
    steps is far steadier than one ratio of two medians. The ratio is quoted."""
    frame = frame_of(result)
    s = context_step_summary(frame)
    short, long = s.iloc[0], s.iloc[-1]
    fastest = frame.groupby(["context", "token"], as_index=False)["step_ms"].min()  # other programs only add time
    x, y = fastest["context"].to_numpy(dtype=float), fastest["step_ms"].to_numpy(dtype=float)
    slope, se = _slope_and_se(x, y)
    return dict(short=int(short.context), long=int(long.context), ratio=float(long.vs_shortest),
                short_ms=float(short.step_ms), long_ms=float(long.step_ms), short_mb=float(short.kv_mb_read),
                long_mb=float(long.kv_mb_read), slope=slope * 1e3, se=se * 1e3, n=len(fastest),
                holds=bool(slope > 0 and slope > GROWS_SE * se))


GROWS_SE = 2.0  # "grew": a slope beyond twice its standard error


def _slope_and_se(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The least-squares slope of ``y`` on ``x`` and its standard error (0 for a perfect line)."""
    if len(x) < 3 or np.ptp(x) == 0:
        raise ValueError("a slope needs at least three steps at two or more contexts")
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (slope * x + intercept)
    return float(slope), float(np.sqrt(resid @ resid / (len(x) - 2) / ((x - x.mean()) @ (x - x.mean()))))
