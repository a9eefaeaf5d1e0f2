"""The load generator's clocks, checked against a scripted server whose chunk timings the test sets.

Tolerance, stated once: on loopback the client may see a chunk later than
the server scheduled it, never earlier. So every TTFT is >= the scripted
TTFT and every E2E >= TTFT + (n - 1) gaps, the server's schedule (exact
bounds); the median TTFT (from sending), TPOT and ITL are within
TOLERANCE_S (TPOT: a quarter of it) of the scripted values, a bound with
slack for a busy 2-core machine.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from kvlab.clocks import summarize
from kvlab.results_io import load_results
from kvlab.http.loadgen import http_workload, request_body, run_loadtest
from kvlab.http.loadtest import main
from kvlab.http.local import ServerProcess, ServerThread, free_port
from kvlab.http.scripted import scripted_app
from kvlab.workload import Request

# The tolerance on a median: half the scripted time (a client that mis-times a request is off by a whole TTFT or
# more; a busy machine's scheduling adds milliseconds, which a tighter bound would turn into a red suite).
TTFT_S, GAP_S = 0.08, 0.02
TOLERANCE_S = TTFT_S / 2


def workload(n=8, rate=25.0, max_new_tokens=6, **kw):
    requests = http_workload("short_short", n, arrival="constant", rate=rate, seed=0, **kw)
    for r in requests:
        r.max_new_tokens = max_new_tokens
    return requests


@pytest.fixture(scope="module")
def timed_server():
    # A subprocess, as in real use: the server's timers do not wait on the client's Python.
    with ServerProcess(["kvlab.http.scripted", "--ttft", str(TTFT_S), "--gap", str(GAP_S)]) as server:
        run_loadtest(server.url, workload(n=4, rate=math.inf))  # warm up: a fresh server's first answers are slow
        yield server


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_client_clocks_match_the_scripted_ttft_and_gaps(timed_server, chat):
    n_tokens = 6
    result = run_loadtest(timed_server.url, workload(n=12, max_new_tokens=n_tokens), chat=chat)
    frame = result.frame()
    assert (frame.status == "completed").all()
    # A chunk cannot arrive before the server sends it: exact lower bounds.
    assert (frame.ttft_s >= TTFT_S).all()
    assert (frame.e2e_s >= TTFT_S + (n_tokens - 1) * GAP_S).all()
    # Medians within the stated tolerance, timed from when each request went out (a client that
    # fell behind its schedule is the open-loop test's subject). Chat's role-only chunk is not a token.
    assert (frame.ttft_s - frame.send_delay_s).median() - TTFT_S <= TOLERANCE_S
    assert abs(frame.tpot_s.median() - GAP_S) <= GAP_S / 2
    summary = summarize(result.records)
    assert summary.latency["itl"]["n"] == len(frame) * (n_tokens - 1)
    assert abs(summary.latency["itl"]["p50"] - GAP_S) <= TOLERANCE_S
    assert (frame.output_tokens == n_tokens).all() and result.output_tokens_from == "usage"


def test_prompt_ids_reach_the_server_one_token_each(timed_server):
    requests = workload(n=4)
    for fmt in ("tokens", "text"):
        frame = run_loadtest(timed_server.url, requests, prompt_format=fmt).frame()
        assert (frame.prompt_tokens_reported == frame.prompt_tokens).all(), fmt
    body = request_body(requests[0], "m")
    assert body["prompt"] == requests[0].prompt and all(32 <= i < 127 for i in body["prompt"])
    assert body["stream"] and body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("send_usage", [True, False])
def test_output_tokens_come_from_usage_else_from_chunks(send_usage):
    app = scripted_app(tokens_per_chunk=3, send_usage=send_usage)
    with ServerThread(app) as server:
        result = run_loadtest(server.url, workload(n=4, max_new_tokens=7))
    frame = result.frame()
    assert (frame.chunks == 3).all()  # ceil(7 / 3) chunks, each one stamp
    assert [len(r.token_s) for r in result.records] == [3] * 4
    if send_usage:
        assert (frame.output_tokens == 7).all() and result.output_tokens_from == "usage"
    else:
        assert (frame.output_tokens == 3).all() and result.output_tokens_from == "chunks"


def test_connections_are_kept_alive_and_bounded_by_max_connections():
    app = scripted_app(ttft_s=0.01)
    with ServerThread(app) as server:
        result = run_loadtest(server.url, workload(n=30, rate=200.0, max_new_tokens=2), max_connections=3)
    assert result.summary().completed == 30
    assert 1 <= len(app.state.client_ports) <= 3  # 30 requests over at most 3 connections


def test_rejections_are_failures_with_their_reason_and_retry_after():
    app = scripted_app(reject_every=3)
    with ServerThread(app) as server:
        result = run_loadtest(server.url, workload(n=9, rate=200.0))
    s = result.summary()
    assert s.sent == 9 and s.completed == 6 and s.failed == 3
    assert s.failed_by_reason == {"http_429:queue_full": 3}
    rejected = [r for r in result.records if r.status == "failed"]
    assert all(r.extra["retry_after_s"] == "1" and "queue full" in r.extra["error"] for r in rejected)
    assert app.state.counts == {"received": 9, "rejected": 3, "completed": 6, "disconnected": 0}


def test_the_run_records_when_its_clock_started_on_the_wall_clock(timed_server, monkeypatch):
    from kvlab.room import LearnerRun

    before = time.time()
    result = run_loadtest(timed_server.url, workload(n=3, rate=50.0))
    after = time.time()
    started = result.settings["started_at_unix"]
    assert before <= started <= after - result.wall_s + 0.01  # clock 0 on the wall clock, within the run
    later = time.time() + 600  # the learner shares ten minutes later: the run stays where it happened
    monkeypatch.setattr(time, "time", lambda: later)
    run = LearnerRun("Ada", "09_measure_a_real_server.ipynb").add_requests(result)
    assert run.load["started_at"] == started and run.load["started_at_from"] == "client"


def test_a_server_nobody_runs_is_a_connect_error_for_every_request():
    url = f"http://127.0.0.1:{free_port()}"
    result = run_loadtest(url, workload(n=3, rate=100.0), model="any", timeout_s=5)
    assert [r.fail_reason for r in result.records] == ["connect_error"] * 3


def test_a_slow_server_times_out_and_sees_the_client_leave():
    app = scripted_app(ttft_s=5.0)
    with ServerThread(app) as server:
        result = run_loadtest(server.url, workload(n=3, rate=100.0), timeout_s=0.3)
        assert [r.fail_reason for r in result.records] == ["timeout"] * 3
        deadline = time.perf_counter() + 60
        while app.state.counts["disconnected"] < 3 and time.perf_counter() < deadline:
            time.sleep(0.02)
    assert app.state.counts["disconnected"] == 3 and app.state.counts["completed"] == 0


def test_the_deadline_bounds_the_run_and_accounts_for_every_request(timed_server):
    requests = workload(n=20, rate=2.0)  # arrivals over 9.5 s
    result = run_loadtest(timed_server.url, requests, deadline_s=1.2)
    assert result.wall_s < 6.0  # bounded by the deadline (and a busy machine's lag), not by the last arrival
    frame = result.frame()
    assert len(frame) == 20 and set(frame.status) <= {"completed", "failed"}
    late = frame[frame.scheduled_s > 1.2]
    assert len(late) >= 15 and (late.fail_reason == "deadline").all() and (late.sent == False).all()  # noqa: E712
    # a request takes ~0.2 s: the first two, sent 0.7 s or more before the deadline, completed
    assert (frame[frame.scheduled_s < 0.6].status == "completed").all()


def test_an_open_loop_clock_starts_at_the_scheduled_arrival_even_when_the_client_falls_behind():
    # One connection, requests all due at t = 0, each served in 0.1 s: the k-th is sent only
    # after k others finished, and its TTFT counts that wait (no coordinated omission).
    with ServerThread(scripted_app(ttft_s=0.1)) as server:
        result = run_loadtest(server.url, workload(n=4, max_new_tokens=1, rate=math.inf), max_connections=1)
    frame = result.frame().sort_values("sent_s")
    assert (frame.scheduled_s == 0).all()
    k = np.arange(4)
    assert (frame.send_delay_s.to_numpy() >= k * 0.1).all()
    assert (frame.ttft_s.to_numpy() >= (k + 1) * 0.1).all()


def test_bad_arguments_are_refused_before_any_request():
    r = [Request(0, 4, 4, 0.0, "x")]
    with pytest.raises(ValueError, match="scheme"):
        run_loadtest("127.0.0.1:8000", r, model="m")
    with pytest.raises(ValueError, match="no requests"):
        run_loadtest("http://127.0.0.1:1", [], model="m")
    with pytest.raises(ValueError, match="chat completions take text"):
        run_loadtest("http://127.0.0.1:1", r, model="m", chat=True, prompt_format="tokens")
    with pytest.raises(ValueError, match="timeout_s"):
        run_loadtest("http://127.0.0.1:1", r, model="m", timeout_s=0)
    with pytest.raises(ValueError, match="repeat"):
        run_loadtest("http://127.0.0.1:1", r + r, model="m")


def test_the_command_line_writes_summary_and_requests_with_settings(timed_server, tmp_path, capsys):
    out_json, out_csv = tmp_path / "run.json", tmp_path / "run.csv"
    code = main(["--url", timed_server.url, "--num-requests", "4", "--arrival", "constant", "--rate", "20",
                 "--json", str(out_json), "--csv", str(out_csv), "--no-progress"])
    assert code == 0
    assert "4 sent, 4 completed, 0 failed" in capsys.readouterr().out
    summary, meta = load_results(out_json)
    assert summary.completed[0] == 4 and meta["settings"]["model"] == "scripted"  # found at /v1/models
    assert meta["settings"]["workload"]["rate"] == 20 and meta["settings"]["output_tokens_from"] == "usage"
    frame, _ = load_results(out_csv)
    assert len(frame) == 4 and (frame.ttft_s >= TTFT_S).all()
    json.dumps(meta)  # plain JSON
