"""The panel of lesson 07: how many sequences one KV budget holds, reserving the maximum vs paging blocks."""
from __future__ import annotations

import ipywidgets as widgets
import pandas as pd

from kvlab.experiments.capacity import budget_for_tokens, capacity_workload, paged_vs_reserved
from kvlab.experiments.presets import LESSON_SPEC
from kvlab.model.config import ModelConfig
from kvlab.lessons.l07_memory_is_capacity.figures import plot_paged_vs_reserved
from kvlab.lessons.common.panel import ExperimentPanel

_SLIDER = dict(continuous_update=False, style={"description_width": "170px"}, layout=widgets.Layout(width="480px"))


def fit_for_learners(table: pd.DataFrame) -> pd.DataFrame:
    """``paged_vs_reserved`` in plain words: sequences that fit and where the budget's tokens went."""
    return pd.DataFrame({
        "scheme": table["scheme"], "sequences that fit": table["sequences_fit"],
        "counted by hand": table["formula_fit"], "tokens held": table["tokens_held"],
        "wasted in last blocks": table["in_block_waste_tokens"],
        "reserved, never used": table["reserved_unused_tokens"], "share wasted": table["waste_share"].round(3),
    })


def capacity_panel(config: ModelConfig) -> ExperimentPanel:
    """Sliders for the KV budget, the context limit, the block size and the requests (starting at the notebook's
    setting, the lessons' spec); Run counts who fits."""
    controls = {
        "budget_tokens": widgets.IntSlider(value=8192, min=1024, max=32768, step=1024,
                                           description="KV budget (tokens)", **_SLIDER),
        "max_model_len": widgets.IntSlider(value=1024, min=256, max=config.max_position_embeddings,
                                           step=256, description="max context (tokens)", **_SLIDER),
        "block_size": widgets.Dropdown(options=[1, 4, 8, 16, 32, 64, 128], value=LESSON_SPEC.block_size,
                                       description="block size (tokens)", style=_SLIDER["style"]),
        "n": widgets.IntSlider(value=64, min=8, max=256, step=8, description="requests waiting", **_SLIDER),
    }

    def run(progress, budget_tokens: int, max_model_len: int, block_size: int, n: int) -> pd.DataFrame:
        requests = capacity_workload(config, n=n, max_context=max_model_len)
        spec = LESSON_SPEC.replace(kv_budget_bytes=budget_for_tokens(config, budget_tokens), block_size=block_size,
                                   max_model_len=max_model_len)
        return paged_vs_reserved(config, requests, spec)

    return ExperimentPanel(controls, run, figure=lambda t, _p: plot_paged_vs_reserved(t),
                           summary=lambda t, _p: fit_for_learners(t),
                           title="One KV budget: sequences that fit, reserving the maximum vs paging blocks")
