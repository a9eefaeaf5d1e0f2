"""The slowdown experiment: per-token timelines, the work behind each step, and the summary's arithmetic."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from kvlab.experiments.slowdown import (run_slowdown, slowdown_config, slowdown_fit, slowdown_summary,
                                                     step_curves, tokens_processed)
from kvlab.threads import torch_threads
from kvlab.experiments.slowdown import per_token_costs, prefill_vs_decode

LESSONS = ("01",)  # the lessons these tests belong to: `pytest -m lNN`


@pytest.fixture(scope="module")
def frame(model):
    return run_slowdown(model, prompt_tokens=8, max_new_tokens=16, caches=("none", "dynamic"), repeats=2)


def test_one_row_per_generated_token_per_cache_and_repeat(frame):
    assert len(frame) == 2 * 2 * 16
    assert list(frame.columns) == ["cache", "repeat", "token", "position", "tokens_processed", "time_s",
                                   "step_ms", "phase", "cache_bytes"]
    for (_, _), run in frame.groupby(["cache", "repeat"]):
        assert list(run["token"]) == list(range(16))
        assert list(run["position"]) == [8 + t for t in range(16)]
        # time_s is the running sum of the step times: the cumulative curve is built from the steps
        np.testing.assert_allclose(run["step_ms"].cumsum() / 1e3, run["time_s"], rtol=1e-9)
        assert (run["step_ms"] > 0).all()


def test_tokens_processed_is_prompt_plus_history_without_a_cache_and_one_with_it(frame):
    none = frame[(frame["cache"] == "none") & (frame["repeat"] == 0)]
    dyn = frame[(frame["cache"] == "dynamic") & (frame["repeat"] == 0)]
    assert list(none["tokens_processed"]) == [8 + t for t in range(16)]
    assert list(dyn["tokens_processed"]) == [8] + [1] * 15
    assert tokens_processed("static", 100, 0) == 100 and tokens_processed("static", 100, 7) == 1


def test_dynamic_cache_bytes_follow_the_formula_and_none_stores_nothing(frame, model):
    cfg = model.config
    dyn = frame[(frame["cache"] == "dynamic") & (frame["repeat"] == 0)]
    # after step i the cache holds the prompt and the i tokens fed back: 8 + i tokens, fp32
    expected = [2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * (8 + i) * 4 for i in range(16)]
    assert list(dyn["cache_bytes"]) == expected
    assert (frame.loc[frame["cache"] == "none", "cache_bytes"] == 0).all()


def test_settings_are_recorded_with_the_numbers(frame):
    assert frame.attrs["model"] == "tiny-llama" and frame.attrs["threads"] == 1
    assert frame.attrs["prompt_tokens"] == 8 and frame.attrs["repeats"] == 2


def test_progress_counts_whole_runs(model):
    calls = []

    def progress(iterable, *, total=None, desc=None, unit="it"):
        calls.append((total, unit))
        yield from iterable

    run_slowdown(model, prompt_tokens=4, max_new_tokens=3, caches=("dynamic",), repeats=3, progress=progress)
    assert calls == [(3, "run")]


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(prompt_tokens=0), "prompt_tokens"),
    (dict(max_new_tokens=1), "max_new_tokens"),
    (dict(repeats=0), "repeats"),
    (dict(caches=()), "caches is empty"),
    (dict(caches=("dynamic", "lru")), "unknown cache 'lru'"),
    (dict(prompt_tokens=1000, max_new_tokens=100), "exceeds the model's context"),
    (dict(threads=0), "threads"),
])
def test_bad_settings_raise_before_any_generation(model, kwargs, fragment):
    ran = []

    def progress(iterable, **_):
        ran.append(True)
        return iterable

    args = dict(prompt_tokens=4, max_new_tokens=4, caches=("none", "dynamic"), progress=progress) | kwargs
    with pytest.raises(ValueError, match=fragment):
        run_slowdown(model, **args)
    assert not ran


def synthetic(prompt: int = 10, n: int = 60, fixed: float = 2.0, per_token: float = 0.5) -> pd.DataFrame:
    """A frame whose step times are an exact line in tokens processed: the oracle for the summary."""
    rows = []
    for cache in ("none", "dynamic"):
        t = 0.0
        for i in range(n):
            work = tokens_processed(cache, prompt, i)
            step = fixed + per_token * work
            t += step / 1e3
            rows.append(dict(cache=cache, repeat=0, token=i, position=prompt + i, tokens_processed=work,
                             time_s=t, step_ms=step, phase="decode", cache_bytes=0))
    return pd.DataFrame(rows)


def test_summary_ratios_match_hand_computed_values():
    s = slowdown_summary(synthetic(), early=10, late=40, window=3).set_index("cache")
    # none: step = 2 + 0.5 (10 + t); the median of a symmetric window of a line is its centre
    assert s.at["none", "early_step_ms"] == pytest.approx(2 + 0.5 * 20)
    assert s.at["none", "late_step_ms"] == pytest.approx(2 + 0.5 * 50)
    assert s.at["none", "measured_ratio"] == pytest.approx(27 / 12)
    assert s.at["none", "work_ratio"] == pytest.approx(50 / 20)
    assert s.at["dynamic", "measured_ratio"] == pytest.approx(1.0)
    assert s.at["dynamic", "work_ratio"] == 1.0


def test_cost_per_token_processed_explains_the_gap_between_measured_and_work_ratio():
    s = slowdown_summary(synthetic(), early=10, late=40, window=3).set_index("cache")
    # none: step = 2 + 0.5 w over w = 20 and 50 tokens processed: the fixed 2 ms is shared by more tokens
    assert s.at["none", "early_ms_per_token_processed"] == pytest.approx((2 + 0.5 * 20) / 20)
    assert s.at["none", "late_ms_per_token_processed"] == pytest.approx((2 + 0.5 * 50) / 50)
    assert s.at["dynamic", "early_ms_per_token_processed"] == pytest.approx(2.5)  # one token per pass
    # measured ratio = work ratio x (late cost per token / early cost per token), exactly
    for cache in ("none", "dynamic"):
        r = s.loc[cache]
        assert r.measured_ratio == pytest.approx(
            r.work_ratio * r.late_ms_per_token_processed / r.early_ms_per_token_processed)


def test_per_token_costs_has_one_row_per_cache_and_token_of_the_summary():
    costs = per_token_costs(synthetic(), early=10, late=40, window=3)
    assert list(zip(costs["cache"], costs["token"])) == [("none", 10), ("none", 40), ("dynamic", 10), ("dynamic", 40)]
    assert list(costs["tokens_processed"]) == [20, 50, 1, 1]
    assert list(costs.columns) == ["cache", "token", "tokens_processed", "step_ms", "ms_per_token_processed"]
    assert costs["ms_per_token_processed"].tolist() == pytest.approx([12 / 20, 27 / 50, 2.5, 2.5])


def test_summary_defaults_keep_both_windows_inside_the_run():
    s = slowdown_summary(synthetic(n=200))
    assert list(s["early_token"]) == [20, 20] and list(s["late_token"]) == [194, 194]
    with pytest.raises(ValueError, match="generate more tokens"):
        slowdown_summary(synthetic(n=200), early=3)


def test_each_step_counts_its_fastest_repeat_and_the_typical_run_s_total():
    quiet = synthetic(n=20)
    busy = quiet.assign(repeat=1, step_ms=quiet["step_ms"] + 5.0, time_s=quiet["time_s"] * 3)
    third = quiet.assign(repeat=2, time_s=quiet["time_s"] * 2)
    curves = step_curves(pd.concat([busy, quiet, third], ignore_index=True))
    assert list(curves["step_ms"]) == list(quiet["step_ms"])  # another program can only add time
    assert list(curves["time_s"]) == list(quiet["time_s"] * 2)  # the median run's cumulative time


def test_fit_recovers_a_known_line_despite_spikes():
    f = synthetic(fixed=2.0, per_token=0.25)
    f.loc[f["token"] % 17 == 5, "step_ms"] += 40.0  # another program stole the CPU now and then
    fit = slowdown_fit(f).set_index("cache")
    # none: step = 2 + 0.25 * (position) exactly, since tokens processed == position for t >= 1
    assert fit.at["none", "us_per_context_token"] == pytest.approx(250.0)
    assert fit.at["none", "fixed_ms"] == pytest.approx(2.0)
    assert fit.at["dynamic", "us_per_context_token"] == pytest.approx(0.0, abs=1e-9)


def test_torch_threads_is_restored_after_the_run():
    before = torch.get_num_threads()  # 1: conftest runs every test on one thread
    with torch_threads(before + 1) as used:
        assert used == before + 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before


def test_lesson_config_is_a_few_million_parameters():
    cfg = slowdown_config()
    assert 2e6 < cfg.num_parameters() < 5e6
    assert cfg.num_kv_heads < cfg.num_heads  # grouped-query, like the models people deploy


def test_the_prefill_is_compared_with_the_median_decode_step_fastest_of_repeats():
    steps = {0: [8.0, 6.0], 1: [2.0, 3.0], 2: [9.0, 1.0], 3: [2.0, 2.5]}  # token: step_ms of repeats 0 and 1
    rows = [dict(cache="dynamic", repeat=r, token=t, position=32 + t, tokens_processed=32 if t == 0 else 1,
                 step_ms=ms[r], time_s=0.0) for t, ms in steps.items() for r in (0, 1)]
    r = prefill_vs_decode(pd.DataFrame(rows))
    # fastest of the repeats: prefill 6 ms; decode steps 2, 1 and 2 ms, median 2 ms
    assert (r.cache, r.prompt_tokens, r.prefill_ms, r.decode_ms, r.ratio) == ("dynamic", 32, 6.0, 2.0, 3.0)
    with pytest.raises(ValueError, match="no decode step"):
        prefill_vs_decode(pd.DataFrame(rows[:2]))
