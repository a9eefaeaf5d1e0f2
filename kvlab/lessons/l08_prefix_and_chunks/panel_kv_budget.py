"""The panel of lesson 08: a KV budget too small for every sequence to grow — blocks over time and preemptions."""
from __future__ import annotations

import ipywidgets as widgets
import pandas as pd

from .prefix_and_chunks import preemption_runs, preemption_table
from ...runs.serving_run import runs_frame
from ...model.decoder import Decoder
from .figures_kv_blocks import plot_kv_blocks
from ..common.panel import ExperimentPanel
from ...cache.paged import BLOCK_SIZE

_SLIDER = dict(continuous_update=False, style={"description_width": "170px"}, layout=widgets.Layout(width="480px"))
MAX_MODEL_LEN = 256  # so one request needs at most 16 blocks: the smallest budget the engine accepts


def budget_for_learners(table: pd.DataFrame) -> pd.DataFrame:
    """``preemption_table`` in plain words."""
    return pd.DataFrame({
        "KV budget (blocks)": table["kv_blocks"], "preemptions": table["preemptions"],
        "tokens recomputed": table["recomputed_tokens"], "most sequences at once": table["peak_running"],
        "steps": table["steps"], "output tokens/s": table["output_tokens_per_s"].round(0),
        "n (completed)": table["ttft_n"], "E2E p95 (ms)": (table["e2e_p95_s"] * 1e3).round(0),
    })


def kv_budget_panel(model: Decoder | None = None, kv_blocks: int = 40, n: int = 12,
                    max_seqs: int = 12) -> ExperimentPanel:
    """A KV budget slider (blocks of 16 tokens); Run serves requests that grow, and shows the pool over time."""
    controls = {
        "kv_blocks": widgets.IntSlider(value=kv_blocks, min=MAX_MODEL_LEN // BLOCK_SIZE, max=192, step=8,
                                       description="KV budget (blocks of 16)", **_SLIDER),
        "n": widgets.IntSlider(value=n, min=2, max=24, description="requests", **_SLIDER),
        "max_seqs": widgets.IntSlider(value=max_seqs, min=1, max=24, description="batch slots (max_seqs)", **_SLIDER),
    }

    def run(progress, kv_blocks: int, n: int, max_seqs: int) -> pd.DataFrame:
        runs = preemption_runs(model, kv_blocks=(kv_blocks,), n=n, max_seqs=max_seqs, block_size=BLOCK_SIZE,
                               max_model_len=MAX_MODEL_LEN, progress=progress)
        frame = runs_frame(runs)
        frame.attrs["preemption"] = preemption_table(runs)
        return frame

    return ExperimentPanel(controls, run,
                           figure=lambda f, _p: plot_kv_blocks(f.attrs["trace"], block_size=BLOCK_SIZE),
                           summary=lambda f, _p: budget_for_learners(f.attrs["preemption"]),
                           title="A KV budget that runs out: blocks in use and preemptions")
