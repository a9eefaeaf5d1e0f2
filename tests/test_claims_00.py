"""The claim of notebook 00: a prefill costs far less per token than decoding one token at a time."""
from __future__ import annotations

import pandas as pd

from kvlab.lessons import CLAIMS, claims_for

LESSONS = ("00",)  # the lessons these tests belong to: `pytest -m lNN`


def run(prefill_ms: float, decode_ms: float = 2.0, prompt: int = 32, n: int = 20) -> pd.DataFrame:
    rows = [dict(cache="dynamic", repeat=0, token=i, position=prompt + i, tokens_processed=prompt if i == 0 else 1,
                 time_s=0.0, step_ms=prefill_ms if i == 0 else decode_ms, phase="prefill" if i == 0 else "decode",
                 cache_bytes=0) for i in range(n)]
    return pd.DataFrame(rows)


def test_the_notebook_shows_this_claim():
    assert [c.name for c in claims_for("00_start_here.ipynb")] == ["prefill_costs_less_per_token_than_decode"]


def test_a_prefill_a_few_decode_steps_long_supports_the_claim():
    v = CLAIMS["prefill_costs_less_per_token_than_decode"].on(run(prefill_ms=6.0))
    assert v.holds
    assert "the prefill of 32 tokens took 6.00 ms, 3.0× one decode step (2.00 ms), not 32×" in str(v)


def test_a_prefill_as_slow_as_decoding_each_token_does_not():
    assert not CLAIMS["prefill_costs_less_per_token_than_decode"].on(run(prefill_ms=64.0))
