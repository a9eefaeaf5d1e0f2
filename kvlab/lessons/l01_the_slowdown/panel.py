"""The panel of lesson 01: time per token with and without a KV cache, behind a Run button."""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import pandas as pd

from kvlab.experiments.slowdown import run_slowdown, slowdown_summary
from kvlab.model.decoder import Decoder
from kvlab.model.lessons import lesson_scale
from kvlab.lessons.l01_the_slowdown.figures import plot_slowdown
from kvlab.lessons.common.panel import ExperimentPanel

_SLIDER = dict(continuous_update=False, style={"description_width": "150px"},
               layout=widgets.Layout(width="480px"))


def learner_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with column names a learner reads at a glance."""
    return pd.DataFrame({
        "cache": summary["cache"], "early token": summary["early_token"], "late token": summary["late_token"],
        "ms per step (early)": summary["early_step_ms"], "ms per step (late)": summary["late_step_ms"],
        "measured late/early": summary["measured_ratio"],
        "tokens processed (early → late)": [f"{a} → {b}" for a, b in
                                            zip(summary["early_tokens_processed"], summary["late_tokens_processed"])],
        "expected from work": summary["work_ratio"], "total seconds": summary["total_s"],
    })


def slowdown_panel(model: Decoder | None = None, prompt_tokens: int | None = None,
                   max_new_tokens: int | None = None, caches: Sequence[str] = ("none", "dynamic"),
                   repeats: int = 3, title: str = "Time per token: no cache vs a KV cache") -> ExperimentPanel:
    """Sliders for prompt length, tokens to generate and repeats; Run times every token per cache.

    ``model`` defaults to the lesson's Llama (``lesson_model()``: ~3M parameters on CPU, ~90M on a GPU). Each cache runs
    ``repeats`` times and each step counts its fastest run, which keeps the curves readable on a
    busy machine. The result's frame is ``run_slowdown``'s, its summary ``slowdown_summary``'s in
    learner-friendly columns. ``prompt_tokens`` and ``max_new_tokens`` default to the device's
    lesson sizes (``kvlab.model.lessons.lesson_scale``: 32 and 200 on CPU, longer on a GPU).
    """
    caches = tuple(caches)
    scale = lesson_scale(None if model is None else model.device)
    prompt_tokens = scale.prompt_tokens if prompt_tokens is None else prompt_tokens
    max_new_tokens = scale.max_new_tokens if max_new_tokens is None else max_new_tokens
    controls = {
        "prompt_tokens": widgets.IntSlider(value=prompt_tokens, min=8, max=max(512, 2 * prompt_tokens), step=8,
                                           description="prompt tokens", **_SLIDER),
        "max_new_tokens": widgets.IntSlider(value=max_new_tokens, min=20, max=max(400, max_new_tokens), step=20,
                                            description="tokens to generate", **_SLIDER),
        "repeats": widgets.IntSlider(value=repeats, min=1, max=5, description="repeats (fastest)", **_SLIDER),
    }

    def run(progress, prompt_tokens: int, max_new_tokens: int, repeats: int) -> pd.DataFrame:
        return run_slowdown(model, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, caches=caches,
                            repeats=repeats, progress=progress)

    return ExperimentPanel(controls, run,
                           figure=lambda frame, _p: plot_slowdown(frame, slowdown_summary(frame)),
                           summary=lambda frame, _p: learner_summary(slowdown_summary(frame)),
                           title=title)
