"""The panel of notebook 03's comparison with transformers: kvlab's caches beside transformers' own, behind a Run button."""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import pandas as pd

from .transformers_caches import QUANTO_BITS, STRATEGIES, pair_table, run_transformers_caches
from ...model.decoder import Decoder
from .figures_transformers_caches import plot_transformers_caches
from ..common.panel import ExperimentPanel

_WIDE = dict(style={"description_width": "150px"}, layout=widgets.Layout(width="480px"))


def transformers_caches_panel(model: Decoder | None = None, strategies: Sequence[str] = STRATEGIES, pairs: int = 16,
                              questions: int = 4, new_tokens: int = 24, bits: int = 4, residual: int = 16,
                              group_size: int = 32, title: str = "kvlab's caches beside transformers'") -> ExperimentPanel:
    """Choose strategies, the context, the tokens and the quantized settings; Run generates with each
    strategy in kvlab and in transformers on the same weights (``run_transformers_caches``).

    Its summary is ``pair_table`` (one row per strategy, both libraries side by side), its figure
    ``plot_transformers_caches``; a transformers cache that cannot run here is named in one line each.
    """
    from ...tasks.recall import PAIR_TOKENS, QUERY_TOKENS, load_recall_model

    model = model if model is not None else load_recall_model()
    contexts = [(f"{p * PAIR_TOKENS + QUERY_TOKENS} tokens ({p} pairs)", p) for p in (4, 8, 16, 32)]
    controls = {
        "strategies": widgets.SelectMultiple(options=list(STRATEGIES), value=tuple(strategies), rows=4,
                                             description="strategies", **_WIDE),
        "pairs": widgets.Dropdown(options=contexts, value=pairs, description="context", **_WIDE),
        "new_tokens": widgets.IntSlider(value=new_tokens, min=8, max=64, step=8, continuous_update=False,
                                        description="tokens per run", **_WIDE),
        "bits": widgets.Dropdown(options=list(QUANTO_BITS)[::-1], value=bits, description="quantized: bits", **_WIDE),
        "residual": widgets.Dropdown(options=[0, 8, 16, 32], value=residual, description="residual window", **_WIDE),
    }

    def run(progress, strategies, pairs, new_tokens, bits, residual) -> pd.DataFrame:
        return run_transformers_caches(model, strategies, pairs=pairs, questions=questions, new_tokens=new_tokens,
                                       bits=bits, group_size=group_size, residual=residual, progress=progress)

    def summary(frame: pd.DataFrame, _params) -> pd.DataFrame:
        return pair_table(frame)

    return ExperimentPanel(controls, run, figure=lambda frame, _p: plot_transformers_caches(frame),
                           summary=summary, title=title)


__all__ = ["transformers_caches_panel"]
