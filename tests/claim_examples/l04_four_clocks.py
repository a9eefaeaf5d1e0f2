"""Claim examples of notebook 04 (the four clocks): a journey on the wall and the virtual clock, cold vs warm start,
a mixed load, and the token counts of the shipped texts."""
from __future__ import annotations

import functools
from typing import Any

import pandas as pd

from kvlab.lessons.l04_four_clocks.claims import _startup_s, _warm_ttft
from kvlab.experiments.four_clocks import cold_vs_warm, run_journey, run_mixed_load
from kvlab.experiments.tokens_words import (BPE, BYTE, count_tokens, lesson_tokenizers, tokens_per_second,
                                                        words_per_second)
from kvlab.model.lessons import lesson_model
from kvlab.experiments.serving_run import FixedStepCostExecutor, ServingRun, runs_frame

from . import counterexample, example


@example("watched_ttft_is_mostly_queue")
@functools.lru_cache(maxsize=4)
def _journey_example(seed: int = 0) -> pd.DataFrame:
    return runs_frame([run_journey(lesson_model(), n_ahead=2, max_seqs=1, prompt_tokens=16, max_new_tokens=8,
                                   ahead_prompt_tokens=64, ahead_new_tokens=12, seed=seed)])


@counterexample("watched_ttft_is_mostly_queue")
def _watched_not_queued(frame: pd.DataFrame) -> pd.DataFrame:
    """Counter-example: the watched request spent a fifth of its TTFT in the queue."""
    watched = frame["profile"] == "watched"
    frame.loc[watched, "queue_s"] = 0.2 * frame.loc[watched, "ttft_s"]
    return frame


@example("watched_clocks_follow_from_its_steps")
@functools.lru_cache(maxsize=1)
def _exact_example() -> ServingRun:
    return run_journey(lesson_model(), executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")


@example("startup_dwarfs_a_warm_request", "first_request_extra_is_small")
@functools.lru_cache(maxsize=4)
def _cold_example(seed: int = 0) -> pd.DataFrame:
    return cold_vs_warm(repeats=6, prompt_tokens=8, max_new_tokens=3, seed=seed)


@counterexample("startup_dwarfs_a_warm_request")
def _quick_start(frame: pd.DataFrame) -> pd.DataFrame:
    """Counter-example: a start-up of half the warm requests' whole service."""
    half = 0.5 * float(frame.loc[frame["start"] == "warm", "e2e_s"].sum())
    frame.attrs = {**frame.attrs, "python_start_s": half / 2, "import_s": half / 2, "build_model_s": 0.0,
                   "engine_init_s": 0.0}
    return frame


@counterexample("first_request_extra_is_small")
def _slow_first_request(frame: pd.DataFrame) -> pd.DataFrame:
    """Counter-example: the first request paid as much again as the whole start-up."""
    frame.loc[frame["start"] == "cold", "ttft_s"] = float(_warm_ttft(frame).median()) + _startup_s(frame)
    return frame


@example("share_waiting_longer_than_the_mean", "ttft_tail_is_well_above_the_mean")
@functools.lru_cache(maxsize=4)
def _mixed_example(seed: int = 1) -> ServingRun:
    return run_mixed_load(lesson_model(), n=16, seed=seed)


@counterexample("ttft_tail_is_well_above_the_mean")
def _even_waits(_example: Any) -> pd.DataFrame:
    """Counter-example: 20 requests whose TTFTs are spread evenly from 10 to 30 ms (p95 about 1.45× the mean)."""
    ttft = [0.010 + 0.020 * i / 19 for i in range(20)]
    return pd.DataFrame({"status": ["completed"] * 20, "ttft_s": ttft})


@example("byte_tokens_are_utf8_bytes", "english_bpe_favours_english")
@functools.lru_cache(maxsize=1)
def _counts_example() -> pd.DataFrame:
    return count_tokens(lesson_tokenizers(real=None)[0])


@example("same_words_different_tokens_per_second")
def _rates_example() -> pd.DataFrame:
    return tokens_per_second(_counts_example(), words_per_s=10)


@example("fewer_tokens_per_second_can_be_more_words")
def _words_example() -> pd.DataFrame:
    return words_per_second(_counts_example(), {BYTE: 50, BPE: 20})
