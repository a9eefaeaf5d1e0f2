"""Claim examples of notebook 05 (batching): static vs continuous and the batch-wait knob on the real model and on a
fixed step cost, the batch-scaling run; and those runs edited so that each wall-clock sentence is false."""
from __future__ import annotations

import functools
from typing import Any

import pandas as pd

from kvlab.experiments.batching import batch_wait_runs, batching_table, compare_policies, policy_rounds
from kvlab.model.lessons import lesson_model
from kvlab.experiments.serving_run import FixedStepCostExecutor, ServingRun, runs_frame

from . import counterexample, example


KNOB_PRICES = dict(step_s=0.004, token_s=0.0001)  # the exact knob's executor (notebook 05's cell uses the same)


@example("a_batched_step_costs_less_than_separate_steps")
@functools.lru_cache(maxsize=4)
def _panel_example(seed: int = 0) -> pd.DataFrame:
    return runs_frame(compare_policies(lesson_model(), lengths=("mixed",), n=8, max_seqs=4, prompt_tokens=16,
                                       max_new_tokens=12, seed=seed))


@counterexample("a_batched_step_costs_less_than_separate_steps")
def _batched_step_as_dear_as_separate(frame: pd.DataFrame) -> pd.DataFrame:  # a step for b costs b single steps
    trace = frame.attrs["trace"].copy()
    decode = trace["num_prefill_seqs"] == 0
    one = float(trace.loc[decode & (trace["num_seqs"] == 1), "duration_s"].median())
    trace.loc[decode, "duration_s"] = trace.loc[decode, "num_seqs"] * one
    frame.attrs = {**frame.attrs, "trace": trace}
    return frame


@example("mixed_lengths_continuous_serves_more_per_second", "mixed_lengths_continuous_first_tokens_sooner",
         "equal_lengths_same_schedule")
@functools.lru_cache(maxsize=4)
def _policies_example(seed: int = 0) -> pd.DataFrame:
    # the notebook's run (policy_rounds' defaults: three paired rounds of the lesson's requests, its shuffle whatever
    # the seed, so repeated runs measure the timing noise the notebook meets, not other workloads)
    return batching_table(policy_rounds(lesson_model(), rounds=3))


@counterexample("mixed_lengths_continuous_serves_more_per_second", "mixed_lengths_continuous_first_tokens_sooner")
def _gain_inside_the_noise(table: pd.DataFrame) -> pd.DataFrame:
    """Counter-example: in every round the equal pair 20% apart, continuous mixed 1.15× static's throughput and 1/1.1
    its TTFT."""
    t = table.copy()
    for _, rows in t.groupby("round"):
        at = {run: i for i, run in zip(rows.index, rows["run"])}
        t.loc[at["static, equal lengths"], "output_tokens_per_s"] = 1.25 * t.loc[at["continuous, equal lengths"],
                                                                               "output_tokens_per_s"]
        t.loc[at["continuous, mixed lengths"], "output_tokens_per_s"] = 1.15 * t.loc[at["static, mixed lengths"],
                                                                                   "output_tokens_per_s"]
        t.loc[at["continuous, mixed lengths"], "ttft_p50_s"] = t.loc[at["static, mixed lengths"], "ttft_p50_s"] / 1.1
    return t


@counterexample("equal_lengths_same_schedule")
def _equal_schedules_differ(table: pd.DataFrame) -> pd.DataFrame:  # the static equal run took 5 more steps
    table.loc[table["run"] == "static, equal lengths", "steps"] += 5
    return table


@example("static_steps_are_the_sum_of_longest_outputs", "exact_equal_lengths_policies_coincide",
         "exact_mixed_lengths_continuous_fewer_steps", "continuous_keeps_every_slot_busy_while_requests_wait")
@functools.lru_cache(maxsize=1)
def _exact_example() -> list[ServingRun]:
    return compare_policies(lesson_model(), executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")


@example("continuous_answers_first_under_a_trickle", "waiting_fills_batches_but_delays_first_tokens",
         "continuous_batches_only_what_has_arrived")
@functools.lru_cache(maxsize=4)
def _knob_example(seed: int = 0) -> list[ServingRun]:
    return batch_wait_runs(lesson_model(), waits=(0.0, 0.3), rate=12.0, n=8, max_seqs=4, max_new_tokens=8,
                           seed=seed)


def _knob_table(runs: Any, edit) -> pd.DataFrame:
    """The knob's runs as a table, with ``edit(static rows sorted by wait, continuous row index)`` applied."""
    t = batching_table(list(runs)).reset_index(drop=True)
    static = t[t["policy"] == "static"].sort_values("batch_wait_s").index
    edit(t, static, t.index[t["policy"] == "continuous"][0])
    return t


@counterexample("continuous_answers_first_under_a_trickle")
def _continuous_as_late_as_waiting(runs: Any) -> pd.DataFrame:
    """Continuous batching's median first token as late as the soonest static run that waits for a fuller batch (the
    static run that does not wait, the old yardstick, left as it was)."""
    def edit(t, static, c):
        waiting = [i for i in static if t.loc[i, "batch_wait_s"] > 0]
        t.loc[c, "ttft_p50_s"] = t.loc[waiting, "ttft_p50_s"].min()
    return _knob_table(runs, edit)


@counterexample("continuous_batches_only_what_has_arrived")
def _continuous_batches_full(runs: Any) -> pd.DataFrame:  # continuous as full as the longest static wait
    def edit(t, static, c):
        t.loc[c, "mean_batch"] = t.loc[static[-1], "mean_batch"]
    return _knob_table(runs, edit)


@example("exact_waiting_trades_first_tokens_for_fuller_batches", "exact_continuous_batches_stay_small_under_a_trickle",
         "exact_arrivals_set_the_pace")
@functools.lru_cache(maxsize=1)
def _exact_knob_example() -> list[ServingRun]:
    return batch_wait_runs(lesson_model(), waits=(0.0, 0.15, 0.3, 0.6), rate=12.0, n=12, max_seqs=6,
                           executor=FixedStepCostExecutor(**KNOB_PRICES), clock="virtual")


@example("decode_step_stays_flat_for_small_batches", "per_sequence_decode_time_falls_with_batch",
         "batch_one_decode_reads_below_the_bandwidth", "batched_prompts_all_get_first_tokens_sooner",
         "first_prompt_waits_for_the_batch", "batched_step_regime")
@functools.lru_cache(maxsize=2)
def _scaling_example(seed: int = 0):
    from kvlab.experiments.batch_scaling import batch_scaling

    return batch_scaling(lesson_model(), batch_sizes=(1, 2, 4, 8, 16), steps=3, repeats=3, prompts=4,
                         prefill_tokens=16, seed=seed)


def _scaling_edit(result: Any, decode=None, prefill=None, machine=None) -> Any:
    """A copy of a BatchScaling with some of its numbers replaced (``decode``/``prefill``: {(row, column): value})."""
    d, p = result.decode.set_index("batch", drop=False), result.prefill.set_index("way", drop=False)
    for (row, col), v in (decode or {}).items():
        d.loc[row, col] = v(d) if callable(v) else v
    for (row, col), v in (prefill or {}).items():
        p.loc[row, col] = v(p) if callable(v) else v
    result.decode, result.prefill = d.reset_index(drop=True), p.reset_index(drop=True)
    result.machine = {**result.machine, **(machine or {})}
    return result


@counterexample("decode_step_stays_flat_for_small_batches")
def _batch_two_doubles(result: Any) -> Any:  # a step for 2 already costs 2.5 single steps
    return _scaling_edit(result, decode={(2, "step_s"): lambda d: 2.5 * d.loc[1, "step_s"]})


@counterexample("per_sequence_decode_time_falls_with_batch")
def _step_grows_with_batch(result: Any) -> Any:  # the largest batch's step costs half its size in single steps
    big = int(result.decode["batch"].max())
    return _scaling_edit(result, decode={(big, "step_s"): lambda d: big / 2 * d.loc[1, "step_s"],
                                         (big, "per_seq_s"): lambda d: d.loc[big, "step_s"] / big})


@counterexample("batch_one_decode_reads_below_the_bandwidth")
def _reads_above_bandwidth(result: Any) -> Any:  # the measured bandwidth half what the step achieved
    got = float(result.decode.set_index("batch").loc[1, "achieved_GBps"])
    return _scaling_edit(result, machine={"bandwidth_GBps": 0.5 * got})


@counterexample("batched_prompts_all_get_first_tokens_sooner")
def _batched_prefill_no_sooner(result: Any) -> Any:  # the batch's first tokens at 0.9 of one by one
    return _scaling_edit(result, prefill={("batched", "all_first_s"): lambda p: 0.9 * p.loc["one by one",
                                                                                              "all_first_s"]})


@counterexample("first_prompt_waits_for_the_batch")
def _first_prompt_unhurt(result: Any) -> Any:  # the first prompt's token as soon in the batch as alone
    return _scaling_edit(result, prefill={("batched", "first_ttft_s"): lambda p: 1.1 * p.loc["one by one",
                                                                                               "first_ttft_s"]})
