"""The serving pictures from real runs: Gantt chart, batch composition, KV blocks, a request's journey, quantiles."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection, PolyCollection
from matplotlib.container import BarContainer
from matplotlib.figure import Figure

import kvlab
from kvlab.experiments.capacity import block_size_table, capacity_levers, paged_vs_reserved
from kvlab.experiments.serving_run import FixedStepCostExecutor, runs_frame, runs_table, serve
from kvlab.lessons.l05_batching.figures import plot_batch_composition
from kvlab.lessons.l07_memory_is_capacity.figures import plot_block_size, plot_capacity_levers, plot_paged_vs_reserved
from kvlab.lessons.l04_four_clocks.figures import plot_clock_distribution
from kvlab.lessons.common.gantt import gantt_segments, plot_gantt, plot_gantts
from kvlab.lessons.l04_four_clocks.figures import plot_request_journey
from kvlab.lessons.l08_prefix_and_chunks.figures import plot_kv_blocks
from kvlab.lessons.l05_batching.figures import plot_batch_wait, plot_policy_tradeoff
from kvlab.lessons.l04_four_clocks.figures import plot_cold_warm
from kvlab.lessons.l08_prefix_and_chunks.figures import plot_token_gaps
from kvlab.serving import SchedulerConfig
from kvlab.workload import Request
from kvlab.serving.config import EngineSpec

LESSONS = ("04", "05", "07", "08")  # the lessons these tests belong to: `pytest -m lNN`


def _requests(n_ok: int = 5, too_long: bool = True) -> list[Request]:
    g = np.random.default_rng(0)
    out = [Request(i, int(p), int(o), 0.0, "x", prompt=g.integers(0, 320, int(p)).tolist())
           for i, (p, o) in enumerate(zip(g.integers(12, 30, n_ok), g.integers(6, 20, n_ok)))]
    if too_long:  # longer than max_model_len: fails at once with its reason
        out.append(Request(n_ok, 90, 20, 0.0, "x", prompt=g.integers(0, 320, 90).tolist()))
    return out


@pytest.fixture(scope="module")
def tight_run(model):
    """A real run with a queue (2 slots), a failed request and preemptions (a budget of 8 blocks of 8 tokens)."""
    sched = SchedulerConfig(max_seqs=3, max_batch_tokens=32, max_model_len=64)
    run = serve(model, _requests(), EngineSpec(block_size=8, scheduler=sched, enable_prefix_caching=False).with_blocks(model.config, 8), label="tight")
    assert run.stats["preemptions"] > 0, "the fixture should preempt"
    return run


def bar_rows(ax) -> set[int]:
    return {round(p.get_y() + p.get_height() / 2) for c in ax.containers if isinstance(c, BarContainer) for p in c}


# -- Gantt --------------------------------------------------------------------------------------------
def test_the_gantt_chart_has_one_bar_row_per_request_and_marks_the_failed_one(tight_run):
    fig = plot_gantt(tight_run.requests, tight_run.steps)
    assert isinstance(fig, Figure)
    ax = fig.axes[0]
    n = len(tight_run.requests)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"req {i}" for i in range(n)]
    failed = tight_run.requests.index[tight_run.requests["status"] == "failed"].tolist()
    assert failed == [n - 1]
    assert bar_rows(ax) >= set(range(n - 1)), "every request that ran has its row of bars"
    assert any("prompt_too_long" in t.get_text() for t in ax.texts), "the failure reason is written"
    crosses = [c for c in ax.collections if isinstance(c, PathCollection) and c.get_label() == "failed"]
    assert len(crosses) == 1 and len(crosses[0].get_offsets()) == 1


def test_gantt_segments_run_from_arrival_to_the_last_token_without_overlap(tight_run):
    seg = gantt_segments(tight_run.requests, tight_run.steps)
    for r in tight_run.records:
        mine = seg[seg["request_id"] == r.request_id].sort_values("start_s")
        if r.status == "failed":
            assert mine.empty or set(mine["kind"]) == {"queued"}
            continue
        assert mine["start_s"].iloc[0] == pytest.approx(r.scheduled_s)
        assert mine["end_s"].iloc[-1] == pytest.approx(r.finished_s)
        assert (mine["start_s"].to_numpy()[1:] >= mine["end_s"].to_numpy()[:-1] - 1e-12).all(), "segments overlap"
        assert "decode" in set(mine["kind"]) and "prefill" in set(mine["kind"])
    preempted = [r.request_id for r in tight_run.records if r.extra["preemptions"] > 0]
    assert preempted and all((seg[seg["request_id"] == rid]["kind"] == "paused").any() for rid in preempted), \
        "a preempted request shows a pause before it is recomputed"


def test_gantt_segments_on_the_virtual_clock_are_exact():
    cfg = kvlab.tiny_llama()
    reqs = [Request(i, 16, o, 0.0, "x", prompt=[1] * 16) for i, o in enumerate([3, 5, 4])]
    run = serve(cfg, reqs, EngineSpec(scheduler=SchedulerConfig(policy="static", max_seqs=2, max_batch_tokens=64)), clock="virtual", executor=FixedStepCostExecutor(0.01))
    seg = gantt_segments(run.requests, run.steps).set_index(["request_id", "kind"])
    # Request 2 queues while the batch (0, 1) runs to its longest member: 5 steps of 10 ms.
    assert seg.loc[(2, "queued"), ["start_s", "end_s"]].tolist() == pytest.approx([0.0, 0.05])
    assert seg.loc[(0, "prefill"), ["start_s", "end_s"]].tolist() == pytest.approx([0.0, 0.01])
    assert seg.loc[(0, "decode"), ["start_s", "end_s"]].tolist() == pytest.approx([0.01, 0.03])


def test_gantts_draw_one_panel_per_run_on_a_shared_time_axis(model):
    reqs = _requests(4, too_long=False)
    runs = [serve(model, reqs, EngineSpec(scheduler=SchedulerConfig(policy=p, max_seqs=2, max_batch_tokens=64)), label=p)
            for p in ("static", "continuous")]
    frame = runs_frame(runs)
    fig = plot_gantts(frame, frame.attrs["steps"])
    assert [ax.get_title() for ax in fig.axes] == ["static", "continuous"]
    assert all(bar_rows(ax) == set(range(4)) for ax in fig.axes)
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()
    with pytest.raises(ValueError, match="no column 'policy'"):
        plot_gantts(frame, frame.attrs["steps"], by="policy")


def test_empty_and_all_failed_runs_still_draw():
    fig = plot_gantt([], pd.DataFrame(columns=["step", "request_id", "phase", "num_tokens", "start_s", "end_s"]))
    assert "no requests" in [t.get_text() for t in fig.axes[0].texts]
    cfg = kvlab.tiny_llama()
    run = serve(cfg, [Request(0, 90, 20, 0.0, "x", prompt=[1] * 90)], EngineSpec(scheduler=SchedulerConfig(max_model_len=64, max_batch_tokens=64)), clock="virtual", executor=FixedStepCostExecutor(0.01))
    assert run.records[0].status == "failed" and run.trace.empty
    plot_gantt(run.requests, run.steps)
    plot_batch_composition(run.trace)
    plot_kv_blocks(run.trace)
    plot_request_journey(run.records[0], run.steps)
    fig = plot_clock_distribution(run.requests)
    assert "no completed requests" in [t.get_text() for t in fig.axes[0].texts]
    plot_token_gaps(run.requests)


# -- batch composition, KV blocks -------------------------------------------------------------------------
def test_batch_composition_stacks_decode_and_prompt_tokens_of_every_step(tight_run):
    trace = tight_run.trace
    fig = plot_batch_composition(trace, max_batch_tokens=32, max_seqs=3)
    ax_tok, ax_seq = fig.axes[0], fig.axes[1]
    decode, prefill = [c for c in ax_tok.containers if isinstance(c, BarContainer)]
    assert len(decode) == len(prefill) == len(trace)
    assert [p.get_height() for p in decode] == trace["num_decode_seqs"].tolist()
    assert [p.get_height() + q.get_height() for p, q in zip(decode, prefill)] == trace["num_tokens"].tolist()
    assert any(line.get_ydata()[0] == 32 for line in ax_tok.lines), "the token budget is drawn"
    seq_bars = [c for c in ax_seq.containers if isinstance(c, BarContainer)]
    assert [p.get_height() + q.get_height() for p, q in zip(*seq_bars)] == trace["num_seqs"].tolist()
    fig = plot_batch_composition(pd.concat([trace, trace.assign(run="again")]), by="run", x="time")
    assert len(fig.axes) == 4
    with pytest.raises(ValueError, match="x='steps'"):
        plot_batch_composition(trace, x="steps")


def test_kv_blocks_over_time_show_the_budget_and_every_preemption(tight_run):
    trace = tight_run.trace
    fig = plot_kv_blocks(trace, block_size=8)
    ax = fig.axes[0]
    assert sum(isinstance(c, PolyCollection) for c in ax.collections) == 3  # used, cached, free
    budget = int(trace["kv_blocks_used"].iloc[0] + trace["kv_blocks_free"].iloc[0])
    assert budget == 8 and any(line.get_label() == "budget: 8 blocks" for line in ax.lines)
    marks = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(marks) == 1 and len(marks[0].get_offsets()) == int((trace["num_preempted"] > 0).sum())


# -- one request's journey, distributions -------------------------------------------------------------------
def test_the_journey_draws_the_clocks_and_one_gap_bar_per_token_after_the_first(tight_run):
    record = next(r for r in tight_run.records if r.status == "completed" and r.admitted_s > r.scheduled_s)
    fig = plot_request_journey(record, tight_run.steps)
    ax, ax_gap = fig.axes
    texts = " ".join(t.get_text() for t in ax.texts)
    for clock in ("queue wait", "TTFT", "E2E", "TPOT"):
        assert clock in texts
    gaps = [c for c in ax_gap.containers if isinstance(c, BarContainer)][0]
    assert len(gaps) == record.output_tokens - 1
    assert [p.get_height() for p in gaps] == pytest.approx(np.diff(record.token_s) * 1e3)
    c = record.clocks()
    assert any(line.get_ydata()[0] == pytest.approx(c["tpot_s"] * 1e3) for line in ax_gap.lines), "TPOT line"
    row = tight_run.requests[tight_run.requests["request_id"] == record.request_id].iloc[0]
    plot_request_journey(row, tight_run.steps)  # a row of the requests frame works too
    failed = next(r for r in tight_run.records if r.status == "failed")
    fig = plot_request_journey(failed, tight_run.steps)
    assert "no gaps" in " ".join(t.get_text() for t in fig.axes[1].texts)
    with pytest.raises(ValueError, match="token_s"):
        plot_request_journey(row.drop("token_s"))


def test_the_distribution_draws_mean_and_quantiles_where_they_are(tight_run):
    done = tight_run.requests[tight_run.requests["status"] == "completed"]
    fig = plot_clock_distribution(tight_run.requests, "ttft_s", slo_s=0.01)
    ax = fig.axes[0]
    x = {line.get_label().split(" =")[0]: line.get_xdata()[0] for line in ax.lines}
    assert x["mean"] == pytest.approx(done["ttft_s"].mean() * 1e3)
    assert x["p95"] == pytest.approx(np.quantile(done["ttft_s"], 0.95) * 1e3)
    assert any(f"(n = {len(done)})" in line.get_label() for line in ax.lines)
    with pytest.raises(ValueError, match="no column 'wait_s'"):
        plot_clock_distribution(tight_run.requests, "wait_s")


def test_token_gaps_leave_out_excluded_requests_and_mark_events(tight_run):
    fig = plot_token_gaps(tight_run.requests, exclude=[0], marks={"something": 0.01})
    ax = fig.axes[0]
    drawn = [line for line in ax.lines if line.get_label().startswith("req")]
    ok = [r for r in tight_run.records if r.request_id != 0 and r.output_tokens >= 2]
    assert len(drawn) == len(ok)
    assert "something" in [t.get_text() for t in ax.texts]


# -- tables of several runs, capacity, start-up -------------------------------------------------------------
def test_policy_and_batch_wait_figures_have_one_mark_per_run():
    cfg = kvlab.tiny_llama()
    reqs = [Request(i, 16, 4 + 3 * i, 0.02 * i, "x", prompt=[1] * 16) for i in range(5)]
    runs = []
    for policy, wait in (("static", 0.0), ("static", 0.05), ("continuous", 0.0)):
        run = serve(cfg, reqs, EngineSpec(scheduler=SchedulerConfig(policy=policy, max_seqs=3, max_batch_tokens=64, batch_wait_s=wait)), label=f"{policy} {wait}", clock="virtual", executor=FixedStepCostExecutor(0.01))
        runs.append(run)
    table = runs_table(runs)
    table.insert(1, "policy", ["static", "static", "continuous"])
    table.insert(2, "batch_wait_s", [0.0, 0.05, 0.0])
    fig = plot_policy_tradeoff(table)
    assert len([c for c in fig.axes[0].containers if isinstance(c, BarContainer)][0]) == 3
    fig = plot_batch_wait(table)
    assert len(fig.axes[0].lines[0].get_xdata()) == 2  # the static runs make the curve


def test_capacity_figures_draw_every_scheme_and_setting():
    cfg = kvlab.tiny_llama()
    reqs = [Request(i, 20 + 7 * i, 10 + i, 0.0, "x") for i in range(12)]
    budget = 512 * cfg.kv_bytes_per_token(4)
    table = paged_vs_reserved(cfg, reqs, EngineSpec(kv_budget_bytes=budget).replace(max_model_len=256))
    fig = plot_paged_vs_reserved(table)
    bars = [c for c in fig.axes[0].containers if isinstance(c, BarContainer)][0]
    assert [p.get_height() for p in bars] == table["sequences_fit"].tolist()
    plot_block_size(block_size_table(cfg, reqs, budget))
    levers = capacity_levers(cfg, reqs, EngineSpec(kv_budget_bytes=budget), max_model_lens=(128, 256),
                             max_new_tokens=(8, 16))
    assert len(plot_capacity_levers(levers).axes) == 2


def test_the_cold_start_figure_reads_its_phases_from_the_frame():
    frame = pd.DataFrame({"run": [0, 1, 2], "start": ["cold", "warm", "warm"], "ttft_s": [0.03, 0.02, 0.021],
                          "tpot_s": [0.01] * 3, "e2e_s": [0.3] * 3})
    frame.attrs.update(python_start_s=0.5, import_s=2.0, build_model_s=0.1, engine_init_s=0.01)
    fig = plot_cold_warm(frame)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0] == "Python start" and "stopped service" in labels[5]
    total = [p.get_width() for p in fig.axes[0].containers[0]][5]
    assert total == pytest.approx(0.5 + 2.0 + 0.1 + 0.01 + 0.03)
