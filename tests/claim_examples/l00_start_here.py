"""Claim examples of notebook 00 (start here): a short cached run of ``run_slowdown``, and a prefill built by hand."""
from __future__ import annotations

import functools
from typing import Any

import pandas as pd

from kvlab.experiments.slowdown import run_slowdown
from kvlab.model.lessons import lesson_model

from . import counterexample, example
from .l01_the_slowdown import steps_by_hand


@example("prefill_costs_less_per_token_than_decode")
@functools.lru_cache(maxsize=1)
def _example() -> pd.DataFrame:
    return run_slowdown(lesson_model(), prompt_tokens=32, max_new_tokens=40, caches=("dynamic",), repeats=2)


@counterexample("prefill_costs_less_per_token_than_decode")
def _prefill_as_dear_as_decode(_example: Any) -> pd.DataFrame:
    """Counter-example: a prefill of 32 tokens that costs 32 decode steps (nothing shared in the pass)."""
    return steps_by_hand({"dynamic": lambda token, n: 1.0 * n}, new_tokens=20)
