"""The four clocks, checked on hand-made timestamps with hand-computed answers."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlab.clocks import SLO, RequestRecord, quantiles, requests_frame, summarize
from kvlab.results_io import load_results, save_results
from kvlab.env import environment


def record(rid, scheduled, sent=None, admitted=None, tokens=(), finished=None, failed=None, **kw):
    """Build a record through the event methods, as an engine would."""
    r = RequestRecord(rid, prompt_tokens=10, max_new_tokens=8, scheduled_s=scheduled, sent_s=sent, **kw)
    if admitted is not None:
        r.admit(admitted)
    for t in tokens:
        r.token(t)
    if finished is not None:
        r.finish(finished)
    if failed is not None:
        r.fail(*failed)
    return r


def run():
    """Six requests; at the last event (t = 4.0): 3 completed, 1 failed, 1 running, 1 waiting."""
    return [
        record(1, 0.0, sent=0.1, admitted=0.5, tokens=[1.0, 1.5, 2.0, 3.0], finished=3.0),
        record(2, 1.0, admitted=1.2, tokens=[2.0, 2.2], finished=2.5),
        record(3, 2.0, failed=(2.0, "queue_full")),
        record(4, 2.5, admitted=3.5, tokens=[4.0]),  # still running
        record(5, 3.0),  # still waiting
        record(6, 1.0, admitted=1.0, tokens=[1.5], finished=1.5),  # one token: no TPOT
    ]


# -- one request -------------------------------------------------------------------
def test_each_clock_starts_at_the_scheduled_arrival():
    c = run()[0].clocks()
    assert c["send_delay_s"] == pytest.approx(0.1)
    assert c["queue_s"] == pytest.approx(0.5)
    assert c["ttft_s"] == pytest.approx(1.0)
    assert c["e2e_s"] == pytest.approx(3.0)
    assert c["tpot_s"] == pytest.approx((3.0 - 1.0) / 3)  # (E2E - TTFT) / (n - 1)


def test_itl_gaps_are_every_gap_between_tokens():
    assert run()[0].itl_s() == pytest.approx([0.5, 0.5, 1.0])


def test_tpot_is_undefined_for_one_token_and_e2e_for_unfinished_requests():
    records = run()
    assert math.isnan(records[5].clocks()["tpot_s"])
    assert math.isnan(records[3].clocks()["e2e_s"])
    assert records[3].clocks()["ttft_s"] == pytest.approx(1.5)


def test_reported_usage_count_drives_tpot_when_chunks_carry_several_tokens():
    r = record(1, 0.0, tokens=[1.0, 2.0])  # two streamed chunks ...
    r.finish(2.0, output_tokens=5)  # ... carrying five tokens
    assert r.output_tokens == 5
    assert r.clocks()["tpot_s"] == pytest.approx((2.0 - 1.0) / 4)


def test_admission_keeps_the_first_time_after_preemption():
    r = record(1, 0.0, admitted=1.0)
    r.admit(5.0)  # re-admitted after preemption
    assert r.admitted_s == 1.0 and r.status == "running"


def test_contradictory_stamps_are_refused():
    r = RequestRecord(1, 10, 8, scheduled_s=0.0, status="completed")
    with pytest.raises(ValueError, match="no finished_s"):
        summarize([r])
    with pytest.raises(ValueError, match="status"):
        RequestRecord(1, 10, 8, scheduled_s=0.0, status="done")


def test_record_from_a_workload_request_starts_its_clock_at_the_arrival():
    from kvlab.workload import Request

    r = RequestRecord.from_request(Request(7, 12, 4, arrival_s=2.5, profile="short_short"), sent_s=2.6)
    assert (r.request_id, r.scheduled_s, r.sent_s, r.status) == (7, 2.5, 2.6, "waiting")
    assert r.extra["profile"] == "short_short"


# -- quantiles -----------------------------------------------------------------------
def test_quantiles_match_numpy_and_report_n_ignoring_nan():
    values = [3, 1, 4, 1, 5, float("nan"), 9, 2, 6]
    q = quantiles(values)
    clean = [3, 1, 4, 1, 5, 9, 2, 6]
    assert q["n"] == 8
    assert q["p50"] == pytest.approx(3.5)  # sorted 1 1 2 3 | 4 5 6 9
    assert q["mean"] == pytest.approx(31 / 8)
    for name, p in (("p90", 90), ("p95", 95), ("p99", 99)):
        assert q[name] == pytest.approx(np.percentile(clean, p))


def test_quantiles_of_nothing_are_nan_not_an_error():
    q = quantiles([float("nan")], qs=(0.5, 0.999))
    assert q["n"] == 0 and math.isnan(q["mean"]) and math.isnan(q["p50"]) and math.isnan(q["p99.9"])
    with pytest.raises(ValueError, match="0.95"):
        quantiles([1.0], qs=(95,))


# -- a run ---------------------------------------------------------------------------
def test_counts_at_the_last_event():
    s = summarize(run())
    assert s.until_s == 4.0 and s.duration_s == 4.0
    assert (s.sent, s.completed, s.failed, s.running, s.waiting) == (6, 3, 1, 1, 1)
    assert s.failed_by_reason == {"queue_full": 1}
    assert s.sent == s.completed + s.failed + s.waiting + s.running


def test_counts_at_an_earlier_cut_off():
    s = summarize(run(), until_s=2.1)
    # sent by 2.1: requests 1, 2, 3, 6. Request 1 and 2 finish later: running at the cut-off.
    assert (s.sent, s.completed, s.failed, s.running, s.waiting) == (4, 1, 1, 2, 0)
    assert s.duration_s == pytest.approx(2.1)
    assert s.streamed_tokens_per_s == pytest.approx(5 / 2.1)  # 3 + 1 + 1 tokens by 2.1
    assert s.to_dict() == summarize(run(), window_s=2.1).to_dict()
    early = summarize(run(), until_s=0.3)  # request 1 sent at 0.1, not yet admitted
    assert (early.sent, early.waiting) == (1, 1)


def test_latency_quantiles_come_from_completed_requests_with_their_n():
    lat = summarize(run()).latency
    assert lat["ttft"]["n"] == 3 and lat["ttft"]["mean"] == pytest.approx((1.0 + 1.0 + 0.5) / 3)
    assert lat["tpot"]["n"] == 2 and lat["tpot"]["mean"] == pytest.approx((2 / 3 + 0.5) / 2)
    assert lat["itl"]["n"] == 4 and lat["itl"]["p50"] == pytest.approx(0.5)  # pooled 0.5 0.5 1.0 0.2
    assert lat["itl"]["mean"] == pytest.approx(2.2 / 4)
    assert lat["e2e"]["p50"] == pytest.approx(1.5)  # 3.0 1.5 0.5
    assert lat["queue"]["mean"] == pytest.approx((0.5 + 0.2 + 0.0) / 3)


def test_throughput_over_first_arrival_to_last_event():
    s = summarize(run())
    assert s.output_tokens == 7  # 4 + 2 + 1 from completed requests
    assert s.output_tokens_per_s == pytest.approx(7 / 4)
    assert s.requests_per_s == pytest.approx(3 / 4)
    assert s.streamed_tokens_per_s == pytest.approx(8 / 4)  # the running request's token too


def test_goodput_counts_requests_meeting_every_slo():
    s = summarize(run(), slo=SLO(ttft_s=0.9))  # only request 6 (TTFT 0.5)
    assert (s.slo_met, s.goodput_rps, s.slo_share) == (1, pytest.approx(0.25), pytest.approx(1 / 4))
    # TTFT <= 1.0 and TPOT <= 0.55: request 1 misses TPOT (0.667); 2 meets both; 6 has no TPOT.
    s = summarize(run(), slo=SLO(ttft_s=1.0, tpot_s=0.55))
    assert s.slo_met == 2 and s.goodput_rps == pytest.approx(0.5) and s.slo_share == pytest.approx(2 / 4)
    assert summarize(run(), slo=SLO(e2e_s=2.0)).slo_met == 2


def test_bad_summary_arguments_are_refused():
    with pytest.raises(ValueError, match="at least one target"):
        SLO()
    with pytest.raises(ValueError, match="ttft_s=-1"):
        SLO(ttft_s=-1)
    with pytest.raises(ValueError, match="not both"):
        summarize(run(), window_s=1, until_s=1)
    with pytest.raises(ValueError, match="at least one"):
        summarize([])


def test_frames_name_every_clock():
    df = requests_frame(run())
    assert len(df) == 6
    for col in ("request_id", "status", "fail_reason", "ttft_s", "tpot_s", "e2e_s", "queue_s", "output_tokens"):
        assert col in df.columns
    assert df.loc[0, "ttft_s"] == pytest.approx(1.0)
    row = summarize(run(), slo=SLO(ttft_s=1)).to_frame().iloc[0]
    assert row["ttft_n"] == 3 and row["failed_queue_full"] == 1 and row["slo_ttft_s"] == 1
    assert row["e2e_p95_s"] == pytest.approx(np.percentile([3.0, 1.5, 0.5], 95))
    assert list(summarize(run()).latency_frame().index) == ["ttft", "tpot", "itl", "e2e", "queue"]


def test_extra_fields_become_columns():
    r = run()[0]
    r.extra["profile"] = "long_gen"
    assert requests_frame([r]).loc[0, "profile"] == "long_gen"


# -- export ----------------------------------------------------------------------------
def test_results_carry_version_settings_and_machine(tmp_path):
    s = summarize(run())
    path = save_results(tmp_path / "run.json", s, {"policy": "continuous", "rate": 2.0})
    doc = json.loads(path.read_text())  # strict JSON: NaN became null
    assert doc["settings"] == {"policy": "continuous", "rate": 2.0}
    assert doc["kvlab_version"] and doc["environment"]["cpu_count"] >= 1
    assert doc["results"][0]["completed"] == 3
    frame, meta = load_results(save_results(tmp_path / "requests.csv", requests_frame(run()), {"seed": 0}))
    assert len(frame) == 6 and meta["settings"] == {"seed": 0} and "python" in meta["environment"]
    with pytest.raises(ValueError, match=".txt"):
        save_results(tmp_path / "run.txt", s, {})


def test_environment_names_versions_and_device():
    env = environment()
    for key in ("python", "platform", "cpu_count", "versions", "device", "timestamp"):
        assert key in env
    assert env["versions"]["numpy"] == np.__version__


# -- properties ----------------------------------------------------------------------------
@st.composite
def records(draw):
    out = []
    for i in range(draw(st.integers(1, 12))):
        t = st.floats(0.0, 3.0)
        scheduled = draw(t)
        r = RequestRecord(i, 10, 8, scheduled_s=scheduled, sent_s=scheduled + draw(t))
        now = r.sent_s
        fate = draw(st.sampled_from(["waiting", "running", "completed", "failed_early", "failed_late"]))
        if fate == "failed_early":
            r.fail(now + draw(t), "queue_full")
        elif fate != "waiting":
            now += draw(t)
            r.admit(now)
            for _ in range(draw(st.integers(0 if fate != "completed" else 1, 5))):
                now += draw(t)
                r.token(now)
            if fate == "completed":
                r.finish(now + draw(t))
            elif fate == "failed_late":
                r.fail(now + draw(t), "cancelled")
        out.append(r)
    return out


@settings(max_examples=200, deadline=None)
@given(records(), st.lists(st.floats(-1.0, 40.0), min_size=2, max_size=5))
def test_sent_is_completed_plus_failed_plus_waiting_plus_running_at_any_cut_off(recs, cut_offs):
    ended_before = -1
    for until in sorted(cut_offs):
        s = summarize(recs, until_s=until)
        assert s.sent == sum(r.sent_s <= until for r in recs)
        assert s.sent == s.completed + s.failed + s.waiting + s.running
        assert s.failed == sum(s.failed_by_reason.values())
        assert s.completed + s.failed >= ended_before  # ended requests never un-end
        ended_before = s.completed + s.failed
        assert s.latency["ttft"]["n"] <= s.completed


@settings(deadline=None)  # a property, not a speed: a busy machine's slow example is no failure
@given(st.lists(st.floats(-1e6, 1e6), max_size=50),
       st.lists(st.integers(0, 1000).map(lambda k: k / 1000), min_size=1, max_size=6))
def test_quantiles_never_decrease_with_q(values, qs):
    qs = sorted(set(qs))
    q = quantiles(values, qs)
    got = [q[f"p{x * 100:g}"] for x in qs]
    assert q["n"] == len(values)
    if values:
        assert all(a <= b + 1e-9 * (1 + abs(b)) for a, b in zip(got, got[1:]))


def test_a_censored_ttft_quantile_counts_the_requests_still_waiting_at_their_wait_so_far():
    """By hand: at the close (t = 10) three requests had their first token after 1, 2 and 3 s, one still waits
    since t = 2 (8 s so far, censored), one was refused. Completed-only would drop the waiting one."""
    from kvlab.clocks import RequestRecord, ttft_censored

    rs = [RequestRecord(f"r{i}", 8, 4, scheduled_s=0.0, admitted_s=t, first_token_s=t, token_s=[t], finished_s=t,
                        status="completed")
          for i, t in enumerate((1.0, 2.0, 3.0))]
    rs.append(RequestRecord("w", 8, 4, scheduled_s=2.0))  # never admitted by the close
    rs.append(RequestRecord("x", 8, 4, scheduled_s=1.0, finished_s=1.0, status="failed", fail_reason="http_429"))
    c = ttft_censored(rs, until_s=10.0, q=1.0)
    assert c == {"value": 8.0, "n": 4, "censored": 1, "failed": 1, "at_least": True}
    assert ttft_censored(rs[:3], until_s=10.0, q=0.5) == {"value": 2.0, "n": 3, "censored": 0, "failed": 0,
                                                           "at_least": False}
    with pytest.raises(ValueError, match="outside"):
        ttft_censored(rs, 10.0, q=95)


def test_a_censored_tpot_quantile_counts_a_stalled_stream_at_its_gap_so_far():
    """By hand: at the close (t = 10) one request completed 5 tokens from t = 1 to 5 (TPOT 1 s); one streamed 2
    tokens at t = 2 and 3 and then stalled (at least (10 - 2) / 2 = 4 s per token by its next one); one is still
    waiting for its first token and one was refused: neither has a TPOT to count."""
    from kvlab.clocks import RequestRecord, tpot_censored

    done = RequestRecord("d", 8, 5, scheduled_s=0.0, admitted_s=1.0, first_token_s=1.0,
                         token_s=[1.0, 2.0, 3.0, 4.0, 5.0], finished_s=5.0, status="completed")
    stalled = RequestRecord("s", 8, 5, scheduled_s=0.0, admitted_s=2.0, first_token_s=2.0, token_s=[2.0, 3.0],
                            status="running")
    waiting = RequestRecord("w", 8, 5, scheduled_s=1.0)
    refused = RequestRecord("x", 8, 5, scheduled_s=1.0, finished_s=1.0, status="failed", fail_reason="http_429")
    c = tpot_censored([done, stalled, waiting, refused], until_s=10.0, q=1.0)
    assert c == {"value": 4.0, "n": 2, "censored": 1, "at_least": True}
    assert tpot_censored([done, stalled], until_s=10.0, q=0.0)["value"] == 1.0
    assert tpot_censored([done], until_s=10.0) == {"value": 1.0, "n": 1, "censored": 0, "at_least": False}
    with pytest.raises(ValueError, match="outside"):
        tpot_censored([done], 10.0, q=50)
