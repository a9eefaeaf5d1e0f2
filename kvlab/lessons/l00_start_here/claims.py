"""Claims of notebook 00 (start here), checked on the learner's run of the first panel (``run_slowdown``, cached)."""
from __future__ import annotations

from typing import Any

from kvlab.experiments.slowdown import prefill_vs_decode
from kvlab.lessons.common.claims import claim, frame_of

NOTEBOOK = "00_start_here.ipynb"


@claim(NOTEBOOK, clock="wall",
       says="""
           the prefill of {prompt} tokens took {prefill:.2f} ms, {ratio:.1f}× one decode step ({decode:.2f} ms),
           not {prompt}×: {per_token:.3f} ms per prompt token against {decode:.2f} ms per generated token""",
       otherwise="""
           here the prefill cost about as much per token as a decode step. With a very short prompt there is
           little to share; on a busy machine the single prefill step may have been slowed by another program:
           press Run again with repeats at 3.""")
def prefill_costs_less_per_token_than_decode(result: Any) -> dict:
    r = prefill_vs_decode(frame_of(result))
    prompt = int(r.prompt_tokens)
    return dict(prompt=prompt, prefill=r.prefill_ms, decode=r.decode_ms, ratio=r.ratio,
                per_token=r.prefill_ms / prompt, holds=r.ratio < prompt / 2)
