"""Lesson 09 over a real socket: accounting, the service curve, client vs engine clocks, the panel, the exercises.

The load-shaped tests run against kvlab's scripted server (kvlab.http.scripted) in a thread on
127.0.0.1 and a free port, whose answers are known: `max_tokens` tokens, one per chunk, and a
429 for every k-th request when asked. One test starts the real `python -m kvlab serve` in a
subprocess, as the notebook does, and checks it is gone after `stop()`. No assertion on times:
only counts, causality and equalities that hold on any machine.
"""
from __future__ import annotations

import atexit

import pandas as pd
import pytest
from matplotlib.figure import Figure

from kvlab.lessons.l09_measure_a_real_server.exercises import (_output_tokens_per_s, _overhead_ms, check_http_overhead,
                                                        check_output_tokens_per_s, check_rejections_and_quantiles)
from kvlab.experiments.wire import (accounting, check_rates, client_vs_engine, measure_at_client, overhead_table,
                                    requests_per_rate, serve_args, server_metrics, start_server, wait_until_idle,
                                    wire_service_curve)
from kvlab.http.local import ServerThread
from kvlab.http.scripted import scripted_app
from kvlab.lessons.l09_measure_a_real_server.figures import plot_client_vs_engine, plot_wire_service_curve
from kvlab.lessons.l09_measure_a_real_server.panel import service_table, wire_panel

LESSONS = ("09",)  # the lessons these tests belong to: `pytest -m lNN`


@pytest.fixture(scope="module")
def scripted():
    app = scripted_app(ttft_s=0.002, gap_s=0.001)
    with ServerThread(app) as server:
        server.app = app
        yield server


@pytest.fixture(scope="module")
def rejecting():
    app = scripted_app(ttft_s=0.002, gap_s=0.001, reject_every=3)
    with ServerThread(app) as server:
        server.app = app
        yield server


def test_every_request_is_accounted_for_and_the_tokens_add_up(scripted):
    result = measure_at_client(scripted.url, num_requests=10, rate=100.0)
    acc = accounting(result)
    assert (acc["sent"], acc["completed"], acc["rejected"], acc["failed_other"]) == (10, 10, 0, 0)
    assert acc["accounted_for"]
    asked = sum(r.max_new_tokens for r in result.records)  # the scripted server writes exactly max_tokens
    assert acc["tokens_asked"] == acc["tokens_usage"] == acc["tokens_streamed"] == asked
    assert acc["output_tokens_from"] == "usage"


def test_rejections_are_counted_as_rejected_not_lost(rejecting):
    before = rejecting.app.state.counts["rejected"]
    acc = accounting(measure_at_client(rejecting.url, num_requests=12, rate=200.0))
    rejected_by_server = rejecting.app.state.counts["rejected"] - before
    assert acc["rejected"] == rejected_by_server == 4  # every third of 12
    assert acc["completed"] == 8 and acc["failed_other"] == 0 and acc["accounted_for"]


def test_the_service_curve_replays_the_same_requests_once_per_rate(scripted):
    seen = []

    def progress(iterable, *, total=None, desc=None, unit="it"):
        seen.append(total)
        return iterable

    before = scripted.app.state.counts["received"]
    table = wire_service_curve(scripted.url, rates=(40, 160), num_requests=8, duration_s=None, progress=progress)
    assert scripted.app.state.counts["received"] - before == 16
    assert seen == [2]
    assert list(table["offered_rps"]) == [40.0, 160.0]
    assert list(table["sent"]) == [8, 8] and table["accounted_for"].all()
    assert table["tokens_asked"].nunique() == 1  # the same seeded requests, only closer together
    assert list(table["num_requests"]) == [8, 8]
    for col in ("requests_per_s", "ttft_p50_s", "ttft_p90_s", "e2e_p50_s", "e2e_p90_s", "tpot_p50_s", "rejected"):
        assert col in table.columns
    learner = service_table(table)
    assert list(learner["completed"]) == [8, 8]
    assert isinstance(plot_wire_service_curve(table), Figure)


def test_the_achieved_rate_is_completed_over_a_window_that_outlasts_the_schedule(scripted):
    from kvlab.experiments.wire import sent_schedule
    from kvlab.http.loadgen import http_workload

    table = wire_service_curve(scripted.url, rates=(32,), duration_s=0.5)
    row = table.iloc[0]
    arrivals = [r.arrival_s for r in http_workload("short_short", int(row.sent), rate=32.0, seed=0)]
    # the rate actually sent is the seeded schedule's, the same on every machine
    assert row.scheduled_span_s == pytest.approx(max(arrivals) - min(arrivals), abs=1e-12)
    assert row.sent_rps == pytest.approx(row.sent / row.scheduled_span_s)
    # the window runs on past the last arrival until the last answer ends; achieved divides by it
    assert row.window_s == pytest.approx(row.duration_s) and row.drain_s > 0
    assert row.window_s == pytest.approx(row.scheduled_span_s + row.drain_s)
    assert row.requests_per_s == pytest.approx(row.completed / row.window_s)
    assert row.requests_per_s < row.sent_rps  # nothing rejected, yet below what was sent: the drain
    learner = service_table(table)
    assert {"sent req/s", "window s", "n", "TPOT n"} <= set(learner.columns)
    assert sent_schedule([]) == {"scheduled_span_s": 0.0, "sent_rps": pytest.approx(float("nan"), nan_ok=True)}


@pytest.mark.parametrize("kwargs, words", [
    (dict(rates=()), "rates is empty"),
    (dict(rates=(4, -1)), "not positive"),
    (dict(rates=(4, 4)), "repeat"),
    (dict(profile="tweets"), "not one of"),
    (dict(num_requests=0), "num_requests"),
    (dict(arrival="all_at_once"), "arrival"),
    (dict(duration_s=2.0), "exactly one"),
    (dict(num_requests=None, duration_s=-1.0), "duration_s"),
])
def test_bad_arguments_are_refused_before_any_request(scripted, kwargs, words):
    before = scripted.app.state.counts["received"]
    with pytest.raises(ValueError, match=words):
        wire_service_curve(scripted.url, **{"rates": (10,), "num_requests": 4, "duration_s": None, **kwargs})
    assert scripted.app.state.counts["received"] == before


def test_a_fixed_duration_sends_rate_times_seconds_requests_with_a_floor():
    assert [requests_per_rate(r, duration_s=2.0) for r in (1.0, 8.0, 32.5)] == [8, 16, 65]
    assert requests_per_rate(100.0, num_requests=12, duration_s=None) == 12


def test_serve_args_are_checked_and_name_the_command():
    assert serve_args(max_waiting=8, max_seqs=4)[:4] == ["kvlab", "serve", "--max-waiting", "8"]
    assert "--max-seqs" in serve_args(max_seqs=4)
    with pytest.raises(ValueError, match="max_waiting"):
        serve_args(max_waiting=0)
    with pytest.raises(ValueError, match="max_seqs"):
        serve_args(max_seqs=-2)
    assert check_rates([1, 2.5]) == (1.0, 2.5)


def test_kvlab_server_in_a_subprocess_is_timed_on_both_sides_and_stopped():
    # 2 batch slots + a queue of 6 hold all 6 timed requests at once, however slow the machine: none is turned away
    server = start_server(model="tiny_llama", max_waiting=6, max_seqs=2)
    try:
        assert server.host == "127.0.0.1"
        frame = client_vs_engine(server.url, num_requests=6, rate=20.0, max_new_tokens=5)
        assert len(frame) == 6  # every request matched to its engine-side record by response id
        assert (frame["engine_output_tokens"] == frame["output_tokens"]).all()
        assert (frame["output_tokens"] == 5).all()
        # causality, whatever the two clocks' origins: the client sends before the server receives,
        # and reads the first token after the engine produced it
        assert (frame["ttft_overhead_s"] >= 0).all()
        table = overhead_table(frame)
        assert list(table["n"]) == [6] * 5
        assert isinstance(plot_client_vs_engine(frame), Figure)
        before = wait_until_idle(server.url)
        # a burst far above what 2 batch slots + a queue of 6 can hold: some are turned away with 429
        acc = accounting(measure_at_client(server.url, num_requests=40, rate=2000.0))
        after = wait_until_idle(server.url)
        assert acc["accounted_for"] and acc["failed_other"] == 0 and acc["rejected"] > 0
        assert acc["tokens_asked"] == acc["tokens_usage"] == acc["tokens_streamed"]
        # the client's count of each outcome is the server's own
        delta = {k: after["requests_total"][k] - before["requests_total"][k] for k in after["requests_total"]}
        assert delta["completed"] == acc["completed"] and delta["rejected_queue_full"] == acc["rejected"]
        assert after["generation_tokens_total"] - before["generation_tokens_total"] == acc["tokens_asked"]
        assert after["kv_blocks_used"] == 0  # every request's blocks were freed
    finally:
        server.stop()
        atexit.unregister(server.stop)
    assert server.process.poll() is not None  # no server left behind


def test_server_metrics_refuse_a_server_that_is_not_kvlab(scripted):
    with pytest.raises(ValueError, match="kvlab's own server"):
        server_metrics(scripted.url)


def test_the_panel_runs_programmatically_and_reports_errors_in_one_line(scripted):
    panel = wire_panel(scripted.url, rates=(16.0, 64.0), duration_s=1.0)
    result = panel.run()
    assert result is not None and list(result.frame["offered_rps"]) == [16.0, 64.0]
    assert list(result.frame["num_requests"]) == [16, 64]  # rate x seconds per rate
    assert isinstance(result.figure, Figure) and isinstance(result.summary, pd.DataFrame)
    assert panel.run(rates=()) is None and "rates is empty" in panel.error
    with pytest.raises(ValueError, match="choices"):
        wire_panel(scripted.url, rates=(3.0,))


def test_exercise_checkers_confirm_the_reference_on_a_real_run_and_name_each_slip(scripted):
    from kvlab.lessons.l09_measure_a_real_server.exercises import (_overhead_cases, _overhead_slips, _throughput_cases,
                                                            _throughput_slips)

    result = measure_at_client(scripted.url, num_requests=8, rate=80.0)
    frame = result.frame()
    # the reference throughput is what kvlab's own Summary reports for the run
    assert _output_tokens_per_s(frame) == pytest.approx(result.summary().output_tokens_per_s, rel=1e-9)
    assert check_output_tokens_per_s(_output_tokens_per_s)
    assert check_http_overhead(_overhead_ms)
    # every slip is told apart from the right answer and from the other slips on some test frame
    for cases, slips, reference in ((_overhead_cases(), _overhead_slips, _overhead_ms),
                                    (_throughput_cases(), _throughput_slips, _output_tokens_per_s)):
        table = [[reference(case)] + [v for v, _ in slips(case)] for case in cases]
        for i in range(1, len(table[0])):  # slip i is unambiguous on at least one test frame
            assert any(sum(abs(v - row[i]) < 1e-9 for v in row) == 1 for row in table), (i, table)
    slip = check_http_overhead(lambda f: float(f["client_ttft_from_sent_s"].median() - f["engine_ttft_s"].median()) * 1e3)
    assert not slip and "difference of medians" in slip.message
    slip = check_output_tokens_per_s(lambda f: f.loc[f.status == "completed", "output_tokens"].sum() / f.finished_s.max())
    assert not slip and "first scheduled arrival" in slip.message
    assert not check_http_overhead(None) and not check_http_overhead(3.0)
    assert check_rejections_and_quantiles("c") and not check_rejections_and_quantiles("b")
    assert "no TTFT at all" in check_rejections_and_quantiles("d").message
