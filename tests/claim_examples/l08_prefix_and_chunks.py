"""Claim examples of notebook 08 (prefix and chunks): preemption, prefix caching and chunked prefill on the real
model and on a fixed step cost, the shipped trace sample; and those runs edited so that each wall-clock
sentence is false."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import pandas as pd

from kvlab.experiments.prefix_and_chunks import (chunked_prefill_runs, chunked_prefill_table,
                                                                   preemption_runs, preemption_table,
                                                                   prefix_caching_runs, prefix_caching_table)
from kvlab.experiments.serving_run import FixedStepCostExecutor, ServingRun, lesson_model

from . import counterexample, example


@example("tight_budget_preempts_and_recomputes", "tight_budget_runs_fewer_sequences_per_step")
@lru_cache(maxsize=1)
def _exact_preemption() -> list[ServingRun]:
    return preemption_runs(None, kv_blocks=(None, 40), executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")


@example("tight_budget_costs_time")
def _wall_preemption(seed: int = 0) -> pd.DataFrame:
    return preemption_table(preemption_runs(lesson_model(), kv_blocks=(None, 40), seed=seed))


@example("prefix_hits_match_hand_count")
@lru_cache(maxsize=1)
def _exact_prefix() -> list[ServingRun]:
    return prefix_caching_runs(None, executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")


@example("prefix_hits_on_your_run", "prefix_cache_brings_first_token_sooner")
def _wall_prefix(seed: int = 0) -> list[ServingRun]:
    return prefix_caching_runs(lesson_model(), n=6, system_prompt_tokens=128, seed=seed)


def _prefix_table(runs: Any, on_edit: dict) -> pd.DataFrame:
    """The prefix runs' table with the caching-on row's columns set (a value, or a function of the off row)."""
    t = runs if isinstance(runs, pd.DataFrame) else prefix_caching_table(runs)
    t = t.reset_index(drop=True)
    on, off = t.index[t["expected_hit_tokens"] > 0][0], t.index[t["expected_hit_tokens"] == 0][0]
    for col, v in on_edit.items():
        t.loc[on, col] = v(t.loc[off]) if callable(v) else v
    return t


@counterexample("prefix_hits_on_your_run")
def _prefix_missed_blocks(runs: Any) -> pd.DataFrame:  # a block fewer found than the hand count expects
    t = _prefix_table(runs, {})
    on = t.index[t["expected_hit_tokens"] > 0][0]
    t.loc[on, "hit_tokens"] = int(t.loc[on, "expected_hit_tokens"]) - 16
    return t


@counterexample("prefix_cache_brings_first_token_sooner")
def _prefix_barely_sooner(runs: Any) -> pd.DataFrame:  # caching on: TTFT p50 0.9 of caching off
    return _prefix_table(runs, {"ttft_p50_s": lambda off: 0.9 * off["ttft_p50_s"]})


@example("chunks_cap_the_longest_gap", "chunks_delay_the_long_prompt")
def _wall_chunks(seed: int = 0) -> list[ServingRun]:
    return chunked_prefill_runs(lesson_model(), seed=seed)  # the notebook's run: a few seconds on 2 cores


def _chunk_table(runs: Any, column: str, times: float) -> pd.DataFrame:
    """The chunked-prefill table with the chunked row's ``column`` set to ``times`` the whole-prompt row's."""
    t = (runs if isinstance(runs, pd.DataFrame) else chunked_prefill_table(runs)).reset_index(drop=True)
    whole = t.index[t["run"].str.startswith("whole")][0]
    chunks = t.index[t["run"].str.startswith("chunks")][0]
    t.loc[chunks, column] = times * float(t.loc[whole, column])
    return t


@counterexample("chunks_cap_the_longest_gap")
def _chunks_gap_uncut(runs: Any) -> pd.DataFrame:  # the longest gap in chunks 0.7 of the whole prompt's
    return _chunk_table(runs, "decode_gap_max_s", 0.7)



@example("ideal_cache_hit_ratio_of_the_trace", "later_turns_hold_most_of_the_ideal_hits")
@lru_cache(maxsize=1)
def _sample_trace() -> pd.DataFrame:
    from kvlab.experiments.prefix_traces import sample_frame
    return sample_frame()


@example("engine_hits_rise_with_kv_memory_to_the_ideal", "lru_reaches_most_of_the_ideal_with_a_fraction_of_the_memory")
@lru_cache(maxsize=1)
def _sample_curve() -> pd.DataFrame:
    from kvlab.experiments.prefix_traces import sample_curve
    return sample_curve()


@example("caching_on_computes_fewer_prompt_tokens", "caching_on_answers_sooner_at_the_same_load",
         "caching_on_serves_at_least_as_much")
@lru_cache(maxsize=1)
def _sample_on_off() -> pd.DataFrame:
    from kvlab.experiments.prefix_traces import caching_on_off
    return caching_on_off(_sample_trace(), rate=5.0)
