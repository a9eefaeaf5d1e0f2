"""Claims of notebook 02 are deterministic: they hold on their examples, and fail on runs that break them."""
from __future__ import annotations

import dataclasses

from kvlab.lessons import CLAIMS

from claim_examples import example_of

LESSONS = ("02",)  # the lessons these tests belong to: `pytest -m lNN`

NOTEBOOK = "02_kv_cache.ipynb"



def test_different_tokens_are_caught():
    c = CLAIMS["cached_and_uncached_write_the_same_tokens"]
    runs = dict(example_of(c)())
    runs["none"] = dataclasses.replace(runs["none"], tokens=runs["none"].tokens[:-1] + [runs["none"].tokens[-1] + 1])
    v = c.on(runs)
    assert v.holds is False and "19 of 20 equal" in str(v)


def test_memory_claims_fail_when_the_bytes_break_the_formula():
    c = CLAIMS["dynamic_memory_follows_the_formula"]
    frame = example_of(c)().copy()
    frame.loc[frame.index[frame["cache"] == "dynamic"][3], "allocated_bytes"] += 4
    assert c.on(frame).holds is False


def test_quantized_before_its_window_fills_is_not_checked_rather_than_failed():
    c = CLAIMS["quantized_saves_past_its_window"]
    frame = example_of(c)()
    short = frame[frame["tokens"] <= 60].copy()
    short.attrs = frame.attrs
    assert c.on(short).holds is None
