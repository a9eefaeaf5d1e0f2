"""Lessons 04, 05, 07 and 08: the experiments behind the four clocks, batching, memory as capacity, preemption,
prefix caching and chunked prefill, with oracles."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.clocks import summarize
from kvlab.experiments.batching import batch_wait_runs, batching_table, compare_policies, idle_slots
from kvlab.workload import policy_workload
from kvlab.experiments.capacity import (block_manager_fit, block_size_table, budget_for_tokens, capacity_levers,
                                        fit_in_order, paged_vs_reserved, sequence_lengths)
from kvlab.experiments.four_clocks import (cold_vs_warm, cold_warm_summary, journey_clocks, mean_vs_tail,
                                           run_journey, run_mixed_load, startup_phases)
from kvlab.experiments.prefix_and_chunks import (chunked_prefill_runs, chunked_prefill_table, preemption_runs,
                                                 preemption_table, prefix_caching_runs, prefix_caching_table,
                                                 recomputed_tokens)
from kvlab.experiments.serving_run import (FixedStepCostExecutor, records_from_frame, runs_frame, runs_table, serve,
                                           tokens_frame)
from kvlab.serving import BlockManager, SchedulerConfig
from kvlab.workload import Request
from kvlab.serving.config import EngineSpec

LESSONS = ("01", "04", "05", "07", "08")  # the lessons these tests belong to: `pytest -m lNN`

STEP = 0.010


def fixed(step_s: float = STEP, token_s: float = 0.0) -> FixedStepCostExecutor:
    return FixedStepCostExecutor(step_s, token_s)


# -- the fixed step-cost executor and serving runs ---------------------------------------------------------
def test_the_fixed_step_cost_executor_prices_steps_exactly_and_refuses_a_free_step():
    cfg = kvlab.tiny_llama()
    reqs = [Request(0, 20, 5, 0.0, "x", prompt=[1] * 20)]
    run = serve(cfg, reqs, EngineSpec(scheduler=SchedulerConfig(max_batch_tokens=64)), clock="virtual", executor=fixed(0.01, 0.001))
    # prefill of 20 tokens: 10 ms + 20 ms; then 4 decode steps of 10 ms + 1 ms
    assert run.records[0].token_s == pytest.approx([0.030, 0.041, 0.052, 0.063, 0.074])
    with pytest.raises(ValueError, match="not both 0"):
        FixedStepCostExecutor(0.0, 0.0)


def test_a_run_keeps_every_table_and_its_frame_summarizes_like_its_records(model):
    reqs = [Request(i, 12 + i, 6, 0.001 * i, "x", prompt=[(3 * i + j) % 320 for j in range(12 + i)]) for i in range(4)]
    run = serve(model, reqs, EngineSpec(scheduler=SchedulerConfig(max_seqs=2, max_batch_tokens=32)))
    assert len(run.requests) == 4 and (run.requests["status"] == "completed").all()
    assert run.steps["step"].nunique() == len(run.trace)
    tokens = run.tokens()
    assert len(tokens) == run.requests["output_tokens"].sum() and tokens["gap_s"].isna().sum() == 4
    rebuilt = summarize(records_from_frame(run.requests)).to_dict()
    original = run.summary().to_dict()
    for k in ("sent", "completed", "output_tokens", "ttft_p50_s", "e2e_p95_s", "itl_p95_s"):
        assert rebuilt[k] == pytest.approx(original[k])
    frame = runs_frame([run, run])
    assert len(frame) == 8 and len(frame.attrs["trace"]) == 2 * len(run.trace)
    table = runs_table([run])
    assert table.loc[0, "steps"] == len(run.trace) and table.loc[0, "ttft_n"] == 4
    assert table.loc[0, "mean_batch"] == pytest.approx(run.trace["num_seqs"].mean())


# -- 04 the four clocks ------------------------------------------------------------------------------------
def test_the_journey_clocks_on_a_fixed_step_cost_match_the_hand_computation(model):
    run = run_journey(model, executor=fixed(), clock="virtual")
    r = run.record(run.extra["watched"])
    mine = run.steps[run.steps["request_id"] == r.request_id]
    first_token_step = int(mine.loc[mine["phase"] == "prefill", "step"].max())
    c = r.clocks()
    assert r.admitted_s > r.scheduled_s, "the watched request queued"
    assert c["ttft_s"] == pytest.approx((first_token_step + 1) * STEP - r.scheduled_s)
    assert c["tpot_s"] == pytest.approx(STEP)  # it decodes in every step
    assert c["e2e_s"] == pytest.approx(c["ttft_s"] + (r.output_tokens - 1) * STEP)
    table = journey_clocks(run).set_index("clock")
    assert table.loc["TTFT", "seconds"] == pytest.approx(c["ttft_s"])
    assert table.loc["queue wait", "seconds"] == pytest.approx(c["queue_s"])
    assert table.loc["largest gap (ITL max)", "seconds"] == pytest.approx(STEP)
    assert journey_clocks(run.requests).equals(table.reset_index())
    with pytest.raises(ValueError, match="request 99"):
        journey_clocks(run, request_id=99)


def test_the_journey_on_the_real_model_queues_the_watched_request(model):
    run = run_journey(model, n_ahead=2, max_seqs=1, prompt_tokens=16, max_new_tokens=4, ahead_prompt_tokens=24,
                      ahead_new_tokens=6)
    r = run.record(2)
    assert all(x.status == "completed" for x in run.records)
    assert r.admitted_s >= max(x.finished_s for x in run.records[:2]) - 1e-9, "one slot: it waits for both"
    with pytest.raises(ValueError, match="max_seqs"):
        run_journey(model, max_seqs=0)


def test_mean_vs_tail_reports_quantiles_with_n_and_the_share_above_the_mean():
    ttft = [0.01] * 8 + [0.5, 1.0]
    frame = pd.DataFrame({"status": ["completed"] * 10 + ["failed"], "ttft_s": ttft + [np.nan],
                          "e2e_s": [1.0] * 10 + [np.nan], "tpot_s": [0.1] * 10 + [np.nan]})
    row = mean_vs_tail(frame).set_index("clock").loc["ttft_s"]
    assert row["n"] == 10 and row["mean"] == pytest.approx(np.mean(ttft))
    assert row["p95"] == pytest.approx(np.quantile(ttft, 0.95))
    assert row["share_above_mean"] == pytest.approx(0.2)
    assert row["p95_over_mean"] == pytest.approx(np.quantile(ttft, 0.95) / np.mean(ttft))


def test_mixed_load_runs_every_request_of_the_mixture(model):
    run = run_mixed_load(model, n=8, rate=50.0, executor=fixed(0.002, 0.00005), clock="virtual")
    assert len(run.records) == 8 and all(r.status == "completed" for r in run.records)
    assert set(run.requests["profile"]) <= {"short_short", "long_short", "long_gen"}


def test_cold_vs_warm_times_every_start_up_phase_in_a_fresh_process():
    frame = cold_vs_warm(repeats=2, prompt_tokens=8, max_new_tokens=3)
    assert frame["start"].tolist() == ["cold", "warm"]
    assert (frame[["ttft_s", "tpot_s", "e2e_s"]] > 0).all().all()
    a = frame.attrs
    assert a["import_s"] > 0 and a["build_model_s"] > 0 and a["engine_init_s"] > 0 and a["python_start_s"] >= 0
    assert a["threads"] == 1
    phases = startup_phases(frame)
    assert len(phases) == 5 and phases["seconds"].iloc[-1] == frame["ttft_s"].iloc[0]
    summary = cold_warm_summary(frame).set_index("case")
    stopped = summary.loc["request that wakes a stopped service", "ttft_s"]
    assert stopped == pytest.approx(phases["seconds"].sum())
    with pytest.raises(ValueError, match="repeats"):
        cold_vs_warm(repeats=1)


# -- 05 batching -------------------------------------------------------------------------------------------
def test_equal_and_mixed_workloads_ask_for_the_same_tokens():
    equal = policy_workload(320, "equal", n=9, prompt_tokens=40, max_new_tokens=30)
    mixed = policy_workload(320, "mixed", n=9, prompt_tokens=40, max_new_tokens=30)
    assert {r.max_new_tokens for r in equal} == {30} and len({r.max_new_tokens for r in mixed}) == 9
    assert sum(r.max_new_tokens for r in mixed) == sum(r.max_new_tokens for r in equal)
    assert sum(r.prompt_tokens for r in mixed) == sum(r.prompt_tokens for r in equal)
    with pytest.raises(ValueError, match="lengths='ragged'"):
        policy_workload(320, "ragged")


def test_static_batches_last_as_long_as_their_longest_member(model):
    runs = compare_policies(model, n=8, max_seqs=4, executor=fixed(), clock="virtual")
    by = {(r.extra["policy"], r.extra["lengths"]): r for r in runs}
    for lengths in ("equal", "mixed"):
        static = by["static", lengths]
        outputs = [r.max_new_tokens for r in static.records]
        assert len(static.trace) == sum(max(outputs[i:i + 4]) for i in range(0, 8, 4))  # the hand count
    assert len(by["static", "equal"].trace) == len(by["continuous", "equal"].trace)
    table = batching_table(runs).set_index("run")
    assert table.loc["continuous, mixed lengths", "steps"] < table.loc["static, mixed lengths", "steps"]
    assert (table.loc["continuous, mixed lengths", "output_tokens_per_s"]
            > table.loc["static, mixed lengths", "output_tokens_per_s"])
    assert table.loc["continuous, mixed lengths", "mean_batch"] > table.loc["static, mixed lengths", "mean_batch"]


def test_both_policies_serve_every_request_on_the_real_model(model):
    runs = compare_policies(model, lengths=("mixed",), n=4, max_seqs=2, prompt_tokens=16, max_new_tokens=6)
    for run in runs:
        assert all(r.status == "completed" for r in run.records)
        assert [r.output_tokens for r in run.records] == [r.max_new_tokens for r in run.records]
    with pytest.raises(ValueError, match="unknown policy 'greedy'"):
        compare_policies(model, policies=("greedy",))


def test_waiting_for_a_fuller_batch_fills_it_and_delays_the_first_request(model):
    runs = batch_wait_runs(model, waits=(0.0, 0.2), rate=20.0, n=8, max_seqs=4, max_new_tokens=8,
                           executor=fixed(), clock="virtual")
    table = batching_table(runs).set_index("run")
    assert table.loc["static, wait 200 ms", "mean_batch"] > table.loc["static, wait 0 ms", "mean_batch"]
    no_wait, wait, cont = (r.record(0).clocks()["ttft_s"] for r in runs)
    assert wait == pytest.approx(0.15 + STEP)  # its batch fills when the 4th request arrives at 3 / 20 s
    assert no_wait == pytest.approx(STEP) and cont == pytest.approx(STEP)
    with pytest.raises(ValueError, match="waits"):
        batch_wait_runs(model, waits=(-1.0,))


def test_idle_slots_of_static_batches_by_hand():
    s = idle_slots([8, 16, 32, 64], 2)
    assert (s["slots"], s["used"], s["idle"]) == (2 * 16 + 2 * 64, 120, 40)
    assert idle_slots([5, 5, 5], 3)["idle"] == 0


# -- 07 memory is capacity -----------------------------------------------------------------------------------
def test_paged_vs_reserved_on_a_hand_made_case():
    cfg = kvlab.tiny_llama()
    reqs = [Request(i, n - 10, 10, 0.0, "x") for i, n in enumerate([100, 40, 300, 17, 250, 50])]
    budget = 48 * 16 * cfg.kv_bytes_per_token(4)  # 768 tokens = 48 blocks of 16
    t = paged_vs_reserved(cfg, reqs, EngineSpec(kv_budget_bytes=budget).replace(max_model_len=512)).set_index("scheme")
    assert t.loc["reserve max length", "sequences_fit"] == 768 // 512 == t.loc["reserve max length", "formula_fit"]
    # blocks 7, 3, 19, 2, 16 = 47 <= 48 (the sixth, 4 more, does not fit) although 757 tokens <= 768
    assert t.loc["paged blocks", "sequences_fit"] == 5 == t.loc["paged blocks", "block_manager_fit"]
    assert t.loc["paged blocks", "in_block_waste_tokens"] == 47 * 16 - (100 + 40 + 300 + 17 + 250)
    assert t.loc["reserve max length", "reserved_unused_tokens"] == 512 - 100
    parts = ["tokens_held", "in_block_waste_tokens", "reserved_unused_tokens", "free_tokens"]
    assert (t[parts].sum(axis=1) == t["capacity_tokens"]).all()


@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 300), min_size=1, max_size=30), num_blocks=st.integers(1, 200),
       block_size=st.sampled_from([1, 4, 16, 32]))
def test_the_block_manager_fits_exactly_the_sequences_the_formula_counts(lengths, num_blocks, block_size):
    blocks = [math.ceil(n / block_size) for n in lengths]
    assert block_manager_fit(lengths, BlockManager(num_blocks, block_size, False)) == fit_in_order(blocks, num_blocks)


def test_server_caps_shrink_what_each_sequence_holds_and_reserves():
    reqs = [Request(0, 300, 200, 0.0, "x"), Request(1, 20, 10, 0.0, "x")]
    peak, reserve = sequence_lengths(reqs, max_model_len=256, max_new_tokens=64)
    assert peak.tolist() == [256, 30] and reserve.tolist() == [256, 84]  # prompt cut to 192 to leave 64
    peak, reserve = sequence_lengths(reqs, max_model_len=1024)
    assert peak.tolist() == [500, 30] and reserve.tolist() == [1024, 1024]


def test_block_size_waste_is_the_unfilled_tail_and_levers_raise_capacity():
    cfg = kvlab.tiny_llama()
    reqs = [Request(i, 10 + 13 * i, 5 + 3 * i, 0.0, "x") for i in range(20)]
    budget = budget_for_tokens(cfg, 2048)
    sizes = block_size_table(cfg, reqs, budget, block_sizes=(1, 16, 64)).set_index("block_size")
    lengths = np.array([r.prompt_tokens + r.max_new_tokens for r in reqs])
    assert sizes.loc[1, "waste_per_sequence"] == 0
    assert sizes.loc[16, "waste_per_sequence"] == pytest.approx(np.mean(-lengths % 16))
    assert sizes.loc[64, "sequences_fit"] <= sizes.loc[16, "sequences_fit"]
    levers = capacity_levers(cfg, reqs, EngineSpec(kv_budget_bytes=budget), max_model_lens=(128, 512),
                             max_new_tokens=(8, 32, 64))
    for _, rows in levers.groupby("max_model_len"):
        assert rows["reserved_fit"].is_monotonic_decreasing and rows["paged_fit"].is_monotonic_decreasing
    assert (levers["worst_case_fit"] == 2048 // levers["max_model_len"]).all()


def test_a_tight_budget_preempts_and_its_recomputed_tokens_are_counted(model):
    runs = preemption_runs(model, kv_blocks=(None, 20), n=6, max_seqs=6, executor=fixed(), clock="virtual")
    ample, tight = runs
    assert ample.stats["preemptions"] == 0 and ample.extra["recomputed_tokens"] == 0
    assert tight.stats["preemptions"] > 0 and tight.extra["recomputed_tokens"] > 0
    assert all(r.status == "completed" for r in tight.records)
    assert tight.trace["kv_blocks_used"].max() <= 20
    assert recomputed_tokens(tight) == int(tight.trace["num_tokens"].sum()) - int(
        (tight.requests["prompt_tokens"] + tight.requests["output_tokens"] - 1).sum())
    table = preemption_table(runs)
    assert table["preemptions"].tolist() == [0, tight.stats["preemptions"]]
    with pytest.raises(ValueError, match="kv_blocks"):
        preemption_runs(model, kv_blocks=(4,))


def test_one_preemption_recomputes_prompt_plus_written_minus_one_as_exercise_08_says():
    from kvlab.lessons.l08_prefix_and_chunks.exercises import check_recomputed_tokens, tokens_recomputed_after_preemption
    from kvlab.workload import seeded_prompt
    from kvlab.experiments.slowdown import slowdown_config

    cfg = slowdown_config()
    # two requests of 40 + 40 tokens in 8 blocks of 16: both grow until the newer one must give its blocks back
    requests = [Request(i, 40, 40, 0.0, "grows", prompt=seeded_prompt(cfg.vocab_size, 40, (0, i))) for i in range(2)]
    run = serve(cfg, requests, EngineSpec(block_size=16, enable_prefix_caching=False, scheduler=SchedulerConfig(max_seqs=2, max_batch_tokens=128, max_model_len=96)).with_blocks(cfg, 8), clock="virtual", executor=fixed())
    assert run.stats["preemptions"] == 1 and all(r.status == "completed" for r in run.records)
    prefills = run.steps[(run.steps["request_id"] == 1) & (run.steps["phase"] == "prefill")]["num_tokens"].tolist()
    prompt, resumed = prefills  # its first prefill, then the one that readmits it: prompt + what it had written
    written = resumed - prompt
    assert recomputed_tokens(run) == tokens_recomputed_after_preemption(prompt, written) == prompt + written - 1
    if (prompt, written) == (40, 25):  # the numbers of the exercise
        assert check_recomputed_tokens(recomputed_tokens(run))


def test_a_tight_budget_on_the_real_model_still_completes_every_request(model):
    (run,) = preemption_runs(model, kv_blocks=(16,), n=4, max_seqs=4)
    assert run.stats["preemptions"] > 0 and all(r.status == "completed" for r in run.records)


def test_prefix_caching_reuses_the_system_prompt_blocks(model):
    runs = prefix_caching_runs(model, n=5, system_prompt_tokens=64, rate=10.0, executor=fixed(0.002, 0.0001),
                               clock="virtual")
    table = prefix_caching_table(runs).set_index("run")
    on, off = table.loc["prefix caching on"], table.loc["prefix caching off"]
    assert on["hit_tokens"] == on["expected_hit_tokens"] == 4 * 64
    assert off["hit_tokens"] == 0 and off["prompt_tokens_computed"] == off["prompt_tokens"]
    assert on["prompt_tokens_computed"] == on["prompt_tokens"] - 4 * 64
    assert on["ttft_p50_s"] < off["ttft_p50_s"] and on["ttft_p50_saved_s"] > 0


def test_chunked_prefill_caps_the_gap_the_running_decodes_see(model):
    step, per_token = 0.002, 0.0001
    runs = chunked_prefill_runs(model, chunk_tokens=32, n_decoding=3, decode_tokens=30, long_prompt_tokens=400,
                                long_arrival_s=0.01, executor=fixed(step, per_token), clock="virtual")
    table = chunked_prefill_table(runs).set_index("run")
    whole, chunks = table.iloc[0], table.iloc[1]
    assert whole["max_step_tokens"] >= 400 and chunks["max_step_tokens"] <= 32
    assert whole["decode_gap_max_s"] >= step + 400 * per_token - 1e-12
    assert chunks["decode_gap_max_s"] <= step + 32 * per_token + 1e-12
    assert chunks["long_prompt_ttft_s"] > whole["long_prompt_ttft_s"]
    with pytest.raises(ValueError, match="long_prompt_tokens=2000"):
        chunked_prefill_runs(model, long_prompt_tokens=2000)


# -- panels and exercises ------------------------------------------------------------------------------------
def test_the_lesson_panels_run_and_refuse_bad_values(model):
    from kvlab.lessons.l05_batching.panel import batching_panel
    from kvlab.lessons.l08_prefix_and_chunks.panel import kv_budget_panel
    from kvlab.lessons.l04_four_clocks.panel import journey_panel

    result = journey_panel(model).run(n_ahead=1, max_seqs=1, prompt_tokens=16, max_new_tokens=8)
    assert result.figure is not None and result.summary["clock"].iloc[1] == "TTFT"
    result = batching_panel(model, max_new_tokens=6).run(n=4, max_seqs=2)
    assert list(result.frame.attrs["runs"]["run"]) == ["continuous, mixed lengths", "static, mixed lengths"]
    panel = kv_budget_panel(model)
    result = panel.run(kv_blocks=16, n=3, max_seqs=3)
    assert result.summary["KV budget (blocks)"].tolist() == [16]
    assert panel.run(kv_blocks=8) is None and "outside what this control allows" in panel.error


def test_every_exercise_of_these_lessons_confirms_its_solution_and_rejects_the_slip():
    from kvlab.lessons import exercises_for

    for notebook in ("04_four_clocks.ipynb", "05_batching.ipynb", "07_memory_is_capacity.ipynb",
                     "08_prefix_and_chunks.ipynb"):
        found = exercises_for(notebook)
        assert len(found) >= 2, notebook
        for ex in found:
            assert ex.check(ex.solution), f"{ex.name} rejects its own solution"
            assert not ex.check(ex.wrong), f"{ex.name} accepts the wrong answer"
            assert not ex.check(None)


def test_tokens_frame_lists_every_token_with_its_gap():
    frame = pd.DataFrame({"run": ["a", "a"], "request_id": [0, 1], "token_s": [[0.1, 0.3, 0.4], []]})
    t = tokens_frame(frame)
    assert t["token"].tolist() == [0, 1, 2] and t["gap_s"].tolist()[1:] == pytest.approx([0.2, 0.1])
