"""Claims of notebook 01 on step times whose verdict is known: exact lines in the tokens each step processes."""
from __future__ import annotations

import pandas as pd
import pytest

from kvlab.lessons import CLAIMS, claims_for, verdicts
from kvlab.experiments.slowdown import tokens_processed

from claim_examples import counterexample_of

LESSONS = ("01",)  # the lessons these tests belong to: `pytest -m lNN`

NAMES = ["uncached_tokens_slow_down", "cached_steps_stay_flat", "uncached_wait_gap_widens",
         "measured_slowdown_below_work", "many_tokens_per_pass_cost_less_each", "uncached_steps_share_a_per_pass_cost"]
LONG_CONTEXT = ["cached_steps_grow_at_long_context"]  # on run_context_steps, not run_slowdown


def run(fixed: float = 2.0, per_token: float = 0.1, cached_ms: float = 2.0, prompt: int = 32,
        n: int = 200) -> pd.DataFrame:
    """A run of ``n`` tokens: uncached steps cost fixed + per_token x tokens processed, cached ones cached_ms."""
    rows = []
    for cache in ("none", "dynamic"):
        t = 0.0
        for i in range(n):
            work = tokens_processed(cache, prompt, i)
            step = fixed + per_token * work if cache == "none" or i == 0 else cached_ms
            t += step / 1e3
            rows.append(dict(cache=cache, repeat=0, token=i, position=prompt + i, tokens_processed=work,
                             time_s=t, step_ms=step, phase="prefill" if i == 0 else "decode", cache_bytes=0))
    return pd.DataFrame(rows)


def test_the_notebook_shows_these_claims():
    assert [c.name for c in claims_for("01_the_slowdown.ipynb")] == NAMES + LONG_CONTEXT


def test_a_run_that_behaves_as_the_lesson_says_supports_every_claim():
    shown = verdicts(run(), *NAMES)
    assert all(v.holds for v in shown), str(shown)
    text = str(shown)
    assert "token 194 took" in text and "(the work grew 4.3×)" in text  # (32 + 194) / (32 + 20)


def test_time_proportional_to_work_leaves_no_gap_to_explain():
    # no part of a pass is shared: measured ratio == work ratio, and the line meets zero at zero
    flat_cost = run(fixed=0.0, per_token=0.1)
    assert not CLAIMS["measured_slowdown_below_work"].on(flat_cost).holds
    v = CLAIMS["uncached_steps_share_a_per_pass_cost"].on(flat_cost)
    assert not v.holds and "meets zero context at 0.00 ms (0.00 to 0.00 ms" in str(v)
    assert CLAIMS["uncached_tokens_slow_down"].on(flat_cost).holds


def test_the_fixed_part_is_judged_by_the_runs_own_scatter_not_by_a_share_of_a_cached_step():
    """A fixed part well below a cached step (the cache's own work is in the cached step) still holds when the
    steps' scatter leaves it clearly above zero; the same line with a scatter as large as it does not."""
    import numpy as np

    frame = run(fixed=0.5, per_token=0.05, cached_ms=1.2)
    v = CLAIMS["uncached_steps_share_a_per_pass_cost"].on(frame)
    assert v.holds and v.values["times"] == pytest.approx(0.5 / 1.2) and v.values["low"] > 0
    noisy = run(fixed=0.5, per_token=0.05, cached_ms=1.2)
    uncached = noisy["cache"] == "none"
    noisy.loc[uncached, "step_ms"] += np.random.default_rng(1).normal(0, 3.0, uncached.sum())
    v = CLAIMS["uncached_steps_share_a_per_pass_cost"].on(noisy)
    assert not v.holds and v.values["low"] <= 0 < v.values["high"], str(v)


def test_uncached_steps_that_do_not_grow_are_reported_as_such():
    # a GPU-like run: every pass costs the same, whatever it holds
    gpu_like = run(fixed=2.0, per_token=0.0, cached_ms=2.0)
    assert not CLAIMS["uncached_tokens_slow_down"].on(gpu_like).holds
    assert not CLAIMS["uncached_wait_gap_widens"].on(gpu_like).holds
    assert CLAIMS["cached_steps_stay_flat"].on(gpu_like).holds
    v = CLAIMS["many_tokens_per_pass_cost_less_each"].on(gpu_like)
    assert v.holds and v.values["cached"] == pytest.approx(2.0)
    v = CLAIMS["uncached_steps_share_a_per_pass_cost"].on(gpu_like)
    assert v.holds and "weighs as much as any number of tokens" in str(v)


def test_a_gap_that_grows_by_the_same_each_step_is_not_called_widening():
    """A constant per-step difference doubles the gap from the middle of the run to its end with no slowdown at
    all (the old rule, gap at the end > 1.5 x gap at the middle, held on it); the rule compares the per-step
    difference late in the run with early in it, against the run's own scatter."""
    constant = run(fixed=3.0, per_token=0.0, cached_ms=2.0)  # every uncached step 1 ms behind, none slowing down
    v = CLAIMS["uncached_wait_gap_widens"].on(constant)
    assert not v.holds and v.values["times"] == pytest.approx(1.0), str(v)
    curves = constant.pivot(index=["token"], columns="cache", values="time_s")
    gap = curves["none"] - curves["dynamic"]
    assert gap.iloc[-1] > 1.5 * gap.iloc[len(gap) // 2 - 1]  # what the old rule saw as widening
    assert CLAIMS["uncached_wait_gap_widens"].on(run()).holds
    stops = counterexample_of("uncached_wait_gap_widens")(None)
    assert not CLAIMS["uncached_wait_gap_widens"].on(stops).holds


def test_a_widening_inside_the_runs_own_scatter_is_not_called_widening():
    import numpy as np

    slight = run(fixed=3.0, per_token=0.001, cached_ms=2.0)  # a 0.1 ms drift over the run
    uncached = slight["cache"] == "none"
    slight.loc[uncached, "step_ms"] += np.random.default_rng(0).normal(0, 1.0, uncached.sum())
    v = CLAIMS["uncached_wait_gap_widens"].on(slight)
    assert not v.holds and v.values["late_ms"] - v.values["early_ms"] < v.values["margin"], str(v)


def test_cached_steps_that_got_much_faster_are_not_called_flat_either():
    frame = run()
    early = (frame["cache"] == "dynamic") & frame["token"].between(15, 25)
    frame.loc[early, "step_ms"] = 5.0  # another program slowed the early cached steps
    assert not CLAIMS["cached_steps_stay_flat"].on(frame).holds


def test_a_claim_reads_a_panel_result_as_well_as_a_frame():
    class PanelResult:
        frame = run()

    assert CLAIMS["cached_steps_stay_flat"].on(PanelResult()).holds


@pytest.mark.parametrize("kind, sizes", [("cpu", (32, 80)), ("cuda", (512, 400))])
def test_the_example_run_is_sized_for_the_device(monkeypatch, kind, sizes):
    """On a GPU the 90M lesson model's short steps are launch-bound and uncached tokens barely slow down: the
    example takes the device's lesson sizes (kvlab.model.lessons.lesson_scale), not the CPU's."""
    import claim_examples.l01_the_slowdown as ex01
    from kvlab.model.lessons import LESSON_SCALES

    calls = []
    monkeypatch.setattr(ex01, "lesson_scale", lambda device=None: LESSON_SCALES[kind])
    monkeypatch.setattr(ex01, "slowdown_model", lambda: "the lesson model")
    monkeypatch.setattr(ex01, "run_slowdown", lambda model, **kw: calls.append((model, kw)) or "a run")
    ex01._example.cache_clear()
    try:
        assert ex01._example() == "a run"
    finally:
        ex01._example.cache_clear()  # the next example is a real run again
    prompt, new = sizes
    assert calls == [("the lesson model", dict(prompt_tokens=prompt, max_new_tokens=new, repeats=2))]


def long_context_run(short_ms: float = 1.2, per_token_us: float = 0.6, contexts=(32, 253, 507, 1015)) -> pd.DataFrame:
    """Cached steps that cost short_ms + per_token_us per token of context beyond the shortest, K/V 4096 B a token."""
    return pd.DataFrame([dict(repeat=0, context=n, token=t, position=n + t,
                              step_ms=short_ms + per_token_us * 1e-3 * (n - contexts[0]), kv_bytes_read=4096 * (n + t))
                         for n in contexts for t in range(1, 5)])


def test_cached_steps_that_grow_with_context_are_attributed_to_the_kv_read():
    v = CLAIMS["cached_steps_grow_at_long_context"].on(long_context_run())
    assert v.holds, str(v)
    assert v.values["ratio"] == pytest.approx((1.2 + 0.6e-3 * 983) / 1.2)
    assert "a context of 1015 tokens" in str(v) and "from 0.14 to 4.17 MB" in str(v)


def test_cached_steps_flat_at_every_context_are_not_called_growing():
    # a GPU-like run: the step waits for launches, and the K/V read is too small to show
    assert not CLAIMS["cached_steps_grow_at_long_context"].on(long_context_run(per_token_us=0.0)).holds
    # the claim's own counter-example, built from a run that grows
    flat = counterexample_of("cached_steps_grow_at_long_context")(long_context_run())
    assert not CLAIMS["cached_steps_grow_at_long_context"].on(flat).holds


def test_the_flat_claim_names_the_short_context_it_was_measured_at():
    v = CLAIMS["cached_steps_stay_flat"].on(run())
    assert "at most 226 tokens" in str(v)  # prompt 32 + token 194


def test_one_step_ratio_is_never_both_slowing_down_and_nearly_flat():
    """Uncached steps 1.25× slower once read "slow down ✓" (> 1.2) while 1.25× cached read "nearly flat ✓"
    (< 1.3): both sentences now share one boundary, FLAT_WITHIN."""
    from kvlab.lessons.l01_the_slowdown.claims import FLAT_WITHIN

    frame = run(fixed=6.44, per_token=0.01)  # uncached: (6.44 + 2.26) / (6.44 + 0.52) = 1.25
    late = (frame["cache"] == "dynamic") & (frame["token"] >= 100)
    frame.loc[late, "step_ms"] = 2.0 * 1.25  # cached: the same 1.25×
    slow, flat = (CLAIMS[n].on(frame) for n in ("uncached_tokens_slow_down", "cached_steps_stay_flat"))
    assert slow.values["ratio"] == pytest.approx(1.25, abs=0.01) and 1.2 < 1.25 < FLAT_WITHIN
    assert flat.values["ratio"] == pytest.approx(1.25, abs=0.01)
    assert slow.holds is False and flat.holds is True
    assert CLAIMS["uncached_tokens_slow_down"].on(run(fixed=0.0, per_token=0.1)).holds  # 4.3×: slows down


def test_a_slowdown_below_the_work_ratio_by_less_than_the_runs_scatter_is_not_called_below():
    """The old rule (measured ratio < work ratio, no margin) held on a ratio 1.5% below the work ratio in steps
    that jump by ±0.3 ms: the sentence now says by how much the ratio must stay below, from the run's scatter."""
    import numpy as np

    c = CLAIMS["measured_slowdown_below_work"]
    quiet = run(fixed=0.1, per_token=0.1)  # measured 22.7 / 5.3 = 4.28×, work 226 / 52 = 4.35×
    v = c.on(quiet)
    assert v.holds is True and v.values["margin"] == pytest.approx(0.0), v.text
    assert "by more than 0.0%, twice the standard error" in v.text, v.text
    noisy = run(fixed=0.1, per_token=0.1)
    uncached = (noisy["cache"] == "none") & (noisy["token"] >= 1)
    noisy.loc[uncached, "step_ms"] += 0.3 * np.where(noisy.loc[uncached, "token"] % 2 == 0, 1.0, -1.0)
    v = c.on(noisy)
    assert v.values["ratio"] < v.values["work"]  # what the old rule saw as "below"
    assert v.holds is False and v.values["ratio"] * (1 + v.values["margin"]) >= v.values["work"], v.text


def test_the_flat_and_growing_sentences_state_the_line_they_are_decided_by():
    """"nearly flat" and "slow down" are decided by one fixed line, FLAT_WITHIN: each sentence states it. "Grow at
    long context" is decided by the slope of step time on context beyond twice its standard error (the growth is a
    fraction of a CPU step, 1.3-1.4x at nearly the whole context, where one ratio against a 1.3x line held in 6 of 10
    quiet runs): its sentence states the slope and its error."""
    from kvlab.lessons.l01_the_slowdown.claims import FLAT_WITHIN

    line = f"{FLAT_WITHIN:g}×"
    for name in ("uncached_tokens_slow_down", "cached_steps_stay_flat"):
        assert line in CLAIMS[name].on(run()).text, name
    v = CLAIMS["cached_steps_grow_at_long_context"].on(long_context_run())
    assert "ms per 1,000 tokens of context (± 0.00" in v.text and v.values["slope"] == pytest.approx(0.6), v.text


def test_a_slope_inside_its_noise_is_not_called_growing():
    """Steps that grow by 0.05 ms per 1,000 tokens under a jitter of 0.5 ms: the slope is inside twice its error."""
    import numpy as np

    frame = long_context_run(per_token_us=0.05)
    rng = np.random.default_rng(0)
    frame["step_ms"] = frame["step_ms"] + rng.normal(0, 0.5, len(frame))
    v = CLAIMS["cached_steps_grow_at_long_context"].on(frame)
    assert v.holds is False and v.values["slope"] < 2 * v.values["se"], v.text
