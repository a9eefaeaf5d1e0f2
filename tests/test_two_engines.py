"""kvlab serve and transformers serve side by side: the knee rule by hand, bad input, and one small real run of both."""
from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from kvlab.experiments.two_engines import (ENGINES, Protocol, clocks_table, compare_engines, engine_knees, knee, make_server,
                                           within_knee)
from kvlab.http.peer import transformers_serve_available

LESSONS = ("03", "09")  # the lessons these tests belong to: `pytest -m lNN`

OK, WHY = transformers_serve_available()


def sweep_rows(engine="kvlab serve", rates=(4, 8, 16), served=(1.0, 1.0, 0.5), p95=(0.1, 0.2, 3.0)):
    return pd.DataFrame({"engine": engine, "phase": "sweep", "offered_rps": [float(r) for r in rates],
                         "served": list(served), "ttft_p95_s": list(p95)})


def test_the_knee_is_the_highest_rate_served_with_every_lower_rate_served_too():
    assert knee(sweep_rows(), slo_ttft_s=1.0).rps == 8.0
    assert knee(sweep_rows(served=(1.0, 0.85, 1.0), p95=(0.1, 0.2, 0.3)), slo_ttft_s=1.0).rps == 4.0  # 85% < 90% served
    low = knee(sweep_rows(p95=(1.5, 0.2, 0.3)), slo_ttft_s=1.0)  # even the lowest rate missed the bound
    assert (low.case, low.rps, low.at_least) == ("behind_from_the_start", None, None)
    top = knee(sweep_rows(p95=(0.1, 0.2, 0.3), served=(1, 1, 1)), slo_ttft_s=1.0)  # no knee on the grid
    assert (top.case, top.rps, top.at_least) == ("kept_up", None, 16.0)
    assert not within_knee({"served": 1.0, "ttft_p95_s": float("nan")}, 1.0)  # nothing completed: no p95
    both = pd.concat([sweep_rows(), sweep_rows("transformers serve", p95=(0.1, 2.0, 3.0))])
    assert {e: k.rps for e, k in engine_knees(both, 1.0).items()} == {"kvlab serve": 8.0, "transformers serve": 4.0}


def test_a_rate_is_read_at_its_close_with_the_unanswered_counted_at_their_wait():
    """Hand-built: 4 requests, close at 2 s. One completes in time; one got its first token but is still
    streaming; two have no first token. Counts at the close, the all-sent p95 counts the open waits, and a run
    that ended before its close reads as if it had none."""
    from kvlab.clocks import RequestRecord
    from kvlab.http.loadgen import LoadTestResult
    from kvlab.experiments.two_engines import clock_row

    def rec(rid, sched, first=None, end=None):
        r = RequestRecord(rid, 8, 2, scheduled_s=sched)
        r.sent_s = sched
        if first is not None:
            r.admit(first); r.token(first)
        if end is not None:
            r.token(end); r.finish(end)
        return r

    records = [rec("a", 0.0, 0.1, 0.3), rec("b", 0.5, 1.0, 2.5), rec("c", 1.0, 2.4, 2.6), rec("d", 1.5)]
    records[3].fail(2.05, "deadline")  # cut off by the client just after the close
    row = clock_row("kvlab serve", "sweep", 4.0, LoadTestResult(records, {"close_s": 2.0}, 2.6))
    assert (row["sent"], row["completed"], row["failed"], row["waiting"]) == (4, 1, 0, 3)
    assert row["ttft_n"] == 1 and row["ttft_p95_s"] == pytest.approx(0.1)  # the one survivor alone
    assert row["ttft_censored"] == 2  # c and d had no first token at 2.0 s: waits 1.0 and 0.5 so far
    waits = sorted([0.1, 0.5, 1.0, 0.5])
    import numpy as np
    assert row["ttft_p95_sent_s"] == pytest.approx(float(np.quantile(waits, 0.95)))
    assert not within_knee(row, slo_ttft_s=1.0)  # 25% served
    # TPOT over every request with a first token by 2.0 s: a's 0.2 s, and b still streaming after one token at
    # 1.0 s, counted at its gap so far (2.0 - 1.0) / 1; c's first token came after the close, d had none
    assert (row["tpot_sent_n"], row["tpot_censored"]) == (2, 1) and row["tpot_p50_sent_s"] == pytest.approx(0.6)
    assert row["tpot_n"] == 1 and row["tpot_p50_s"] == pytest.approx(0.2)  # the survivor alone
    done = [rec("a", 0.0, 0.1, 0.3), rec("b", 0.5, 0.6, 0.9)]
    early = clock_row("kvlab serve", "sweep", 4.0, LoadTestResult(done, {"close_s": 5.0}, 0.9))
    plain = clock_row("kvlab serve", "sweep", 4.0, LoadTestResult(done, {}, 0.9))
    assert early == plain  # ended before its close: the achieved rate is over the time it took, not the close


def test_bad_input_is_refused_before_any_server_starts(tmp_path):
    with pytest.raises(ValueError, match="low_rate"):
        Protocol(low_rate=0)
    with pytest.raises(ValueError, match="rates"):
        compare_engines(tmp_path, rates=())
    with pytest.raises(ValueError, match="engines"):
        compare_engines(tmp_path, engines=("vllm",))
    for bad, match in ((dict(drain_s=0), "drain_s"), (dict(warmup=-1), "warmup"), (dict(bisect=1.5), "bisect"),
                       (dict(min_served=1.5), "min_served"), (dict(cold_requests=True), "cold_requests")):
        with pytest.raises(ValueError, match=match):
            dataclasses.replace(Protocol(), **bad)
    with pytest.raises(ValueError, match="not one of"):
        make_server("vllm", tmp_path)


def test_the_panel_refuses_rates_it_does_not_offer():
    from kvlab.lessons.l09_measure_a_real_server.panel import two_engines_panel

    with pytest.raises(ValueError, match="not among the panel's choices"):
        two_engines_panel(rates=(3.0,))


@pytest.fixture(scope="module")
def run():
    """The one run of both servers in the default tier: the one notebook 09's panel made in this session's
    execution of it (tests/notebook_run.py), where its claims were shown; a run of its own if they were not."""
    from kvlab.experiments.two_engines import EnginesRun

    from claim_examples.l09_measure_a_real_server import engines_run
    from notebook_run import run_notebook

    frame = run_notebook("09_measure_a_real_server.ipynb").claim_result("two_engines_account_for_every_request")
    if frame is None:
        return engines_run()
    a = frame.attrs
    return EnginesRun(frame, a["servers"], a["greedy"], a["settings"], a["unavailable"])


@pytest.mark.notebook_runs("09_measure_a_real_server.ipynb")
def test_both_engines_are_measured_cold_warm_and_swept_with_every_request_accounted_for(run):
    t = run.frame
    engines = ENGINES if OK else ENGINES[:1]
    assert list(t.engine.unique()) == list(engines) and run.unavailable == (None if OK else WHY)
    for engine in engines:
        phases = t[t.engine == engine].phase.tolist()
        assert phases[:2] == ["cold", "warm"] and set(phases[2:]) == {"sweep"}
    assert (t.sent == t.completed + t.failed + t.waiting).all()
    slo, share = t.attrs["settings"]["slo_ttft_s"], t.attrs["settings"]["min_served"]
    open_rows = t[t.waiting > 0]  # unfinished at a sweep rate's close; cold and warm run to their end
    assert (open_rows.phase == "sweep").all()
    # an unfinished request counts against its rate: not served, and its wait so far inside the all-sent p95
    assert (t.served == t.completed / t.sent).all() and (t.ttft_censored <= t.waiting).all()
    for _, r in open_rows.iterrows():  # a rate with requests open at its close is within the knee only if few are
        assert within_knee(r, slo, share) <= (r.waiting <= (1 - share) * r.sent), r.to_dict()
    # with nothing open the all-sent readings are over the completed requests alone: the same numbers (where some
    # are open they differ either way: a stream still open may have had its first token sooner than the survivors)
    closed = t[t.waiting == 0]
    assert (closed.ttft_censored == 0).all() and (closed.tpot_censored == 0).all()
    assert np.allclose(closed.ttft_p95_sent_s, closed.ttft_p95_s, equal_nan=True)
    assert np.allclose(closed.tpot_p50_sent_s, closed.tpot_p50_s, equal_nan=True)
    assert (t[t.phase == "cold"].sent == 6).all() and (t[t.phase == "warm"].sent == 12).all()
    table = clocks_table(run)
    assert {"TTFT n", "TTFT p95 ms", "TPOT p50 ms", "sent", "completed", "failed", "waiting",
            "client late p95 ms"} <= set(table.columns)
    # the client's own lateness, from its records: on loopback against kvlab's servers it sends on time; every
    # connection it opened is counted, at least one per measurement
    assert (t.send_delay_p95_s >= 0).all() and (t.new_connections >= 1).all() and (t.connect_max_s >= 0).all()
    assert t.attrs["settings"]["slo_ttft_s"] == 1.0 and set(t.attrs["servers"]) == set(engines)


@pytest.mark.notebook_runs("09_measure_a_real_server.ipynb")
@pytest.mark.skipif(not OK, reason=WHY)
def test_the_two_servers_hold_the_same_weights_and_report_their_settings(run):
    assert len(set(run.greedy.values())) == 1, run.greedy  # greedy text equal on both servers
    for engine in ENGINES:
        d = run.servers[engine]
        assert d["version"] and d["block_size"] == 16 and d["num_blocks"] == 512 and d["threads"] == 1
    assert "--continuous-batching" in run.servers["transformers serve"]["command"]


@pytest.mark.notebook_runs("09_measure_a_real_server.ipynb")
def test_the_figure_draws_each_engines_sweep(run):
    from kvlab.lessons.l09_measure_a_real_server.figures import plot_two_engines

    fig = plot_two_engines(run.frame)
    lines = [l.get_label() for l in fig.axes[0].lines]
    assert "kvlab serve" in lines and (("transformers serve" in lines) == OK)
    with pytest.raises(ValueError, match="no sweep rows"):
        plot_two_engines(run.frame[run.frame.phase != "sweep"])


def test_the_lesson_checkpoint_is_the_shipped_weights_beside_a_byte_tokenizer(tmp_path):
    """Copied as shipped (already transformers' format), not re-saved: the same bytes of weights, a tokenizer that
    cuts text as kvlab's, and both loaders read the same parameters from it."""
    import torch
    import transformers

    from kvlab.experiments.two_engines import lesson_checkpoint
    from kvlab.model.loading import checkpoint_tokenizer, from_transformers
    from kvlab.model.tokenizer import ByteTokenizer
    from kvlab.experiments.recall import RECALL_MODEL_DIR, load_recall_model

    folder = lesson_checkpoint(tmp_path / "lesson")
    assert (folder / "model.safetensors").read_bytes() == (RECALL_MODEL_DIR / "model.safetensors").read_bytes()
    assert checkpoint_tokenizer(folder).encode("a cache, 12 keys!") == ByteTokenizer().encode("a cache, 12 keys!")
    theirs = from_transformers(transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    ours = load_recall_model(device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), theirs.state_dict().values()))
