"""Claims of notebook 00 (start here), checked on the learner's run of the first panel (``run_slowdown``, cached)."""
from __future__ import annotations

import functools
from typing import Any

import pandas as pd

from ..experiments.slowdown import prefill_vs_decode, run_slowdown
from ..model.lessons import lesson_model
from .framework import claim, frame_of

NOTEBOOK = "00_start_here.ipynb"


@functools.lru_cache(maxsize=1)
def _example() -> pd.DataFrame:
    return run_slowdown(lesson_model(), prompt_tokens=32, max_new_tokens=40, caches=("dynamic",), repeats=2)


def _prefill_as_dear_as_decode(_example: Any) -> pd.DataFrame:
    """Counter-example: a prefill of 32 tokens that costs 32 decode steps (nothing shared in the pass)."""
    from .c01_the_slowdown import steps_by_hand

    return steps_by_hand({"dynamic": lambda token, n: 1.0 * n}, new_tokens=20)


@claim(NOTEBOOK, clock="wall", counterexample=_prefill_as_dear_as_decode, example=_example,
       says="the prefill of {prompt} tokens took {prefill:.2f} ms, {ratio:.1f}× one decode step ({decode:.2f} ms), "
            "not {prompt}×: {per_token:.3f} ms per prompt token against {decode:.2f} ms per generated token",
       otherwise="here the prefill cost about as much per token as a decode step. With a very short prompt there "
                 "is little to share; on a busy machine the single prefill step may have been slowed by another "
                 "program: press Run again with repeats at 3.")
def prefill_costs_less_per_token_than_decode(result: Any) -> dict:
    r = prefill_vs_decode(frame_of(result))
    prompt = int(r.prompt_tokens)
    return dict(prompt=prompt, prefill=r.prefill_ms, decode=r.decode_ms, ratio=r.ratio,
                per_token=r.prefill_ms / prompt, holds=r.ratio < prompt / 2)
