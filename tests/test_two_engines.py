"""kvlab serve and transformers serve side by side: the knee rule by hand, bad input, and one small real run of both."""
from __future__ import annotations

import pandas as pd
import pytest

from kvlab.lessons.l09_measure_a_real_server.two_engines import (ENGINES, clocks_table, compare_engines, engine_knees, knee, make_server,
                                           within_knee)
from kvlab.http.peer import transformers_serve_available

OK, WHY = transformers_serve_available()


def sweep_rows(engine="kvlab serve", rates=(4, 8, 16), served=(1.0, 1.0, 0.5), p95=(0.1, 0.2, 3.0)):
    return pd.DataFrame({"engine": engine, "phase": "sweep", "offered_rps": [float(r) for r in rates],
                         "served": list(served), "ttft_p95_s": list(p95)})


def test_the_knee_is_the_highest_rate_served_with_every_lower_rate_served_too():
    assert knee(sweep_rows(), slo_ttft_s=1.0) == 8.0
    assert knee(sweep_rows(served=(1.0, 0.85, 1.0), p95=(0.1, 0.2, 0.3)), slo_ttft_s=1.0) == 4.0  # 85% < 90% served
    assert knee(sweep_rows(p95=(1.5, 0.2, 0.3)), slo_ttft_s=1.0) is None  # even the lowest rate missed the bound
    assert knee(sweep_rows(p95=(0.1, 0.2, 0.3), served=(1, 1, 1)), slo_ttft_s=1.0) == 16.0
    assert not within_knee({"served": 1.0, "ttft_p95_s": float("nan")}, 1.0)  # nothing completed: no p95
    both = pd.concat([sweep_rows(), sweep_rows("transformers serve", p95=(0.1, 2.0, 3.0))])
    assert engine_knees(both, 1.0) == {"kvlab serve": 8.0, "transformers serve": 4.0}


def test_bad_input_is_refused_before_any_server_starts(tmp_path):
    with pytest.raises(ValueError, match="low_rate"):
        compare_engines(tmp_path, low_rate=0)
    with pytest.raises(ValueError, match="rates"):
        compare_engines(tmp_path, rates=())
    with pytest.raises(ValueError, match="engines"):
        compare_engines(tmp_path, engines=("vllm",))
    with pytest.raises(ValueError, match="not one of"):
        make_server("vllm", tmp_path)


def test_the_panel_refuses_rates_it_does_not_offer():
    from kvlab.lessons.l09_measure_a_real_server.panel_two_engines import two_engines_panel

    with pytest.raises(ValueError, match="not among the panel's choices"):
        two_engines_panel(rates=(3.0,))


@pytest.fixture(scope="module")
def run():
    """The one run of both servers in the default tier: the one notebook 09's panel made in this session's
    execution of it (tests/notebook_run.py), where its claims were shown; a run of its own if they were not."""
    from kvlab.lessons.l09_measure_a_real_server.two_engines import EnginesRun

    from claim_examples.l09_measure_a_real_server import engines_run
    from notebook_run import run_notebook

    frame = run_notebook("09_measure_a_real_server.ipynb").claim_result("two_engines_account_for_every_request")
    if frame is None:
        return engines_run()
    a = frame.attrs
    return EnginesRun(frame, a["servers"], a["greedy"], a["settings"], a["unavailable"])


def test_both_engines_are_measured_cold_warm_and_swept_with_every_request_accounted_for(run):
    t = run.frame
    engines = ENGINES if OK else ENGINES[:1]
    assert list(t.engine.unique()) == list(engines) and run.unavailable == (None if OK else WHY)
    for engine in engines:
        phases = t[t.engine == engine].phase.tolist()
        assert phases[:2] == ["cold", "warm"] and set(phases[2:]) == {"sweep"}
    assert (t.sent == t.completed + t.failed + t.waiting).all() and (t.waiting == 0).all()
    assert (t[t.phase == "cold"].sent == 6).all() and (t[t.phase == "warm"].sent == 12).all()
    table = clocks_table(run)
    assert {"TTFT n", "TTFT p95 ms", "TPOT p50 ms", "sent", "completed", "failed", "waiting"} <= set(table.columns)
    assert t.attrs["settings"]["slo_ttft_s"] == 1.0 and set(t.attrs["servers"]) == set(engines)


@pytest.mark.skipif(not OK, reason=WHY)
def test_the_two_servers_hold_the_same_weights_and_report_their_settings(run):
    assert len(set(run.greedy.values())) == 1, run.greedy  # greedy text equal on both servers
    for engine in ENGINES:
        d = run.servers[engine]
        assert d["version"] and d["block_size"] == 16 and d["num_blocks"] == 512 and d["threads"] == 1
    assert "--continuous-batching" in run.servers["transformers serve"]["command"]


def test_the_figure_draws_each_engines_sweep(run):
    from kvlab.lessons.l09_measure_a_real_server.figures_two_engines import plot_two_engines

    fig = plot_two_engines(run.frame)
    lines = [l.get_label() for l in fig.axes[0].lines]
    assert "kvlab serve" in lines and (("transformers serve" in lines) == OK)
    with pytest.raises(ValueError, match="no sweep rows"):
        plot_two_engines(run.frame[run.frame.phase != "sweep"])
