"""Load sweeps in virtual time: rising load, every request accounted for, the knee where the curve bends."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import kvlab
from kvlab.cli import main as cli_main
from kvlab.clocks import SLO
from kvlab.experiments.service_curves import end_of_window_counts, knee_rps, lesson_spec, scheduler_config, service_curve
from kvlab.serving.engine import Engine
from kvlab.serving.cost_model import CostModel
from kvlab.serving.sweep import auto_rates, estimate_capacity_rps, find_knee, load_sweep, mark_knee
from kvlab.workload import make_workload, profile_workload

LESSONS = ("06",)  # the lessons these tests belong to: `pytest -m lNN`

ROUND = dict(step=0.02, prefill_tokens=1e-3, attention_calls=1e-4, decode_seqs=1e-3, decode_kv_slots=1e-5,
             prefill_attention=1e-6)


@pytest.fixture(scope="module")
def cost_model() -> CostModel:
    return CostModel(coefficients=ROUND, config=kvlab.llama_30m().to_dict(), settings={"block_size": 16})


@pytest.fixture(scope="module")
def curve(cost_model) -> pd.DataFrame:
    return service_curve("short_short", requests=80, levels=6, cost_model=cost_model,
                         slo=SLO(ttft_s=2.0, tpot_s=0.3), scheduler=scheduler_config(max_seqs=8, max_waiting=16))


def test_offered_load_rises_and_every_request_is_accounted_for_at_every_level(curve):
    assert curve["offered_rps"].is_monotonic_increasing and curve["offered_rps"].is_unique
    assert (curve["requests"] == 80).all()
    # drained: every request completed or failed, none lost; the clocks' sample size is the completed count
    assert (curve["sent"] == 80).all() and (curve["completed"] + curve["failed"] == curve["sent"]).all()
    assert (curve["ttft_n"] == curve["completed"]).all() and (curve["e2e_n"] == curve["completed"]).all()
    counts = end_of_window_counts(curve)  # when the sending window closed
    assert (counts["sent"] == counts["completed"] + counts["failed"] + counts["waiting"] + counts["running"]).all()
    reasons = [c for c in curve if c.startswith("failed_")]
    assert (curve[reasons].sum(axis=1) == curve["failed"]).all()
    assert (curve["peak_kv_bytes"] == curve["peak_kv_blocks"] * curve["peak_kv_bytes"].iloc[0]
            / curve["peak_kv_blocks"].iloc[0]).all()
    assert (curve["peak_kv_blocks"] <= curve["kv_blocks_total"]).all()


def test_the_curve_bends_light_load_is_served_overload_is_not(curve):
    low, high = curve.iloc[0], curve.iloc[-1]
    assert low["throughput_ratio"] > 0.95 and low["failure_rate"] == 0
    assert high["throughput_ratio"] < low["throughput_ratio"]
    assert high["ttft_p95_s"] > 3 * low["ttft_p95_s"]
    assert curve["is_knee"].sum() <= 1


def test_a_simulated_sweep_is_deterministic(cost_model):
    engine = Engine(cost_model, lesson_spec(scheduler_config(max_seqs=8)))
    a = load_sweep(engine, profile_workload("mixture", 40, seed=3), [1.0, 4.0])
    b = load_sweep(engine, profile_workload("mixture", 40, seed=3), [1.0, 4.0])
    cols = [c for c in a if c != "run_wall_s"]
    pd.testing.assert_frame_equal(a[cols], b[cols])


def test_knee_on_a_synthetic_curve():
    assert find_knee([1, 2, 3, 4], [True, True, False, False]).index == 1
    assert find_knee([1, 2, 3], [False, False, False]).index is None  # overloaded everywhere
    assert find_knee([1, 2, 3], [True, True, True]).index is None  # the knee lies beyond the rates tried
    frame = pd.DataFrame({"profile": "x", "policy": "p", "offered_rps": [1.0, 2.0, 3.0, 4.0, 5.0],
                          "throughput_ratio": [1.0, 0.99, 0.97, 0.8, 0.6],
                          "ttft_p95_s": [0.1, 0.2, 0.9, 5.0, 9.0]})
    marked = mark_knee(frame, min_throughput_ratio=0.9)
    assert marked["is_knee"].tolist() == [False, False, True, False, False]
    marked = mark_knee(frame, min_throughput_ratio=0.9, slo_ttft_s=0.5)  # the SLO bites first
    assert marked["is_knee"].tolist() == [False, True, False, False, False]
    with pytest.raises(ValueError, match="rise strictly"):
        find_knee([2, 1], [True, False])


def test_bad_rates_and_profiles_are_clear_errors(cost_model):
    engine = Engine(cost_model, lesson_spec())
    for rates, match in (([], "empty"), ([0.0], "> 0"), ([2.0, 1.0], "rise strictly"), ([float("nan")], "finite")):
        with pytest.raises(ValueError, match=match):
            load_sweep(engine, profile_workload("short_short", 4), rates)
    with pytest.raises(ValueError, match="unknown profile"):
        profile_workload("chatty", 4)
    with pytest.raises(ValueError, match="levels"):
        auto_rates(5.0, levels=1)


def test_capacity_estimate_places_the_levels_around_the_bend(cost_model):
    reqs = make_workload("short_short", 100, arrival="all_at_once", seed=0, max_context=1024)
    small, big = (estimate_capacity_rps(cost_model, reqs, m) for m in (1, 16))
    assert big > 2 * small  # batching shares each step's fixed cost
    rates = auto_rates(big, 10)
    assert len(rates) == 10 and rates[0] == pytest.approx(0.1 * big, rel=1e-3) and rates[-1] == pytest.approx(
        1.5 * big, rel=1e-3)


def test_sweep_cli_writes_json_with_settings_environment_and_one_row_per_level(tmp_path, capsys):
    path = tmp_path / "sweep.json"
    assert cli_main(["sweep", "--simulate", "--profile", "short_short", "--rates", "1,4", "--requests", "30",
                     "--json", str(path)]) == 0
    doc = json.loads(path.read_text())
    assert {"kvlab_version", "settings", "environment", "results"} <= set(doc)
    assert doc["settings"]["simulate"] is True and doc["settings"]["requests"] == 30
    assert [r["offered_rps"] for r in doc["results"]] == [1.0, 4.0]
    for row in doc["results"]:
        for key in ("ttft_p50_s", "ttft_p95_s", "ttft_n", "tpot_p50_s", "e2e_p95_s", "achieved_rps",
                    "throughput_ratio", "failure_rate", "peak_kv_blocks", "peak_kv_bytes", "goodput_rps",
                    "window_waiting", "keeps_up", "is_knee"):
            assert key in row, key
    assert "levels x 30 requests" in capsys.readouterr().out


def test_the_panel_runs_a_curve_and_turns_bad_rates_into_one_clear_line(cost_model):
    from kvlab.lessons.l06_under_load.panel import parse_rates, service_curve_panel

    assert parse_rates("auto") is None and parse_rates(" 0.5, 1;2 ") == [0.5, 1.0, 2.0]
    panel = service_curve_panel(cost_model, profile="short_short", requests=50)
    result = panel.run(rates="1, 3, 6")
    assert result is not None and result.frame["offered_rps"].tolist() == [1.0, 3.0, 6.0]
    assert result.figure is not None and list(result.summary["TTFT n"]) == list(result.frame["ttft_n"])
    assert list(result.summary["TPOT n"]) == list(result.frame["tpot_n"])  # every quantile with its n
    assert panel.run(rates="fast") is None and "write 'auto' or rising numbers" in panel.error
    assert panel.run(rates="3, 1") is None and "rise strictly" in panel.error


def test_the_knee_rate_of_each_profile_is_read_from_the_marked_curves():
    frame = pd.DataFrame({"profile": ["chat"] * 3 + ["docs"] * 3, "policy": "p",
                          "offered_rps": [2.0, 4.0, 6.0, 0.5, 1.0, 1.5],
                          "throughput_ratio": [1.0, 0.95, 0.7, 0.99, 0.5, 0.4], "ttft_p95_s": 0.1})
    marked = mark_knee(frame)
    assert knee_rps(marked, "chat") == 4.0 and knee_rps(marked, "docs") == 0.5
    overloaded = mark_knee(frame.assign(throughput_ratio=0.5))
    assert np.isnan(knee_rps(overloaded, "chat"))  # no level kept up: no knee to read
    with pytest.raises(ValueError, match="no curve for profile 'mixture'"):
        knee_rps(marked, "mixture")
