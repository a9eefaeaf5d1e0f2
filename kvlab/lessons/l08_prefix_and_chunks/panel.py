"""Notebook 08's panels: a KV budget too small for every sequence to grow (blocks over time and preemptions), and
a trace's shared prefixes replayed (hits against KV memory, caching on vs off)."""
from __future__ import annotations

import ipywidgets as widgets
import pandas as pd

from kvlab.experiments.presets import LESSON_SPEC
from kvlab.experiments.prefix_and_chunks import preemption_runs, preemption_table
from kvlab.experiments.prefix_traces import caching_on_off, sample_curve, sample_frame
from kvlab.experiments.serving_run import runs_frame
from kvlab.lessons.common.panel import ExperimentPanel
from kvlab.lessons.l08_prefix_and_chunks.figures import plot_kv_blocks, plot_prefix_cache
from kvlab.model.decoder import Decoder

_SLIDER = dict(continuous_update=False, style={"description_width": "210px"}, layout=widgets.Layout(width="520px"))
BLOCK_TOKENS = 16  # the simulated engine's block (the shipped llama-30m calibration)
# KV pools for the on/off comparison, in blocks: from one request at full context (1024 tokens) up;
# 1024 blocks is the engine's default pool (16 sequences of 1024 tokens)
KV_BLOCKS = (64, 128, 256, 512, 1024, 2048, 4096)


def on_off_for_learners(on_off: pd.DataFrame) -> pd.DataFrame:
    """``caching_on_off`` in plain words: the four clocks with their n, and the prompt tokens computed."""
    t = on_off.copy()
    t.attrs = {}  # pandas compares attrs when it combines frames, and a frame in attrs cannot be compared
    t = t.round({"sent_rps": 2, "achieved_rps": 2, "ttft_p50_s": 3, "ttft_p95_s": 3, "tpot_p50_s": 4,
                      "e2e_p50_s": 3, "achieved_output_tokens_per_s": 1, "token_hit_ratio": 4})
    return pd.DataFrame({
        "prefix caching": t["prefix_caching"].map({True: "on", False: "off"}),
        "KV pool (tokens)": t["kv_tokens"], "offered req/s": t["sent_rps"], "achieved req/s": t["achieved_rps"],
        "TTFT p50 s": t["ttft_p50_s"], "TTFT p95 s": t["ttft_p95_s"], "TTFT n": t["ttft_n"],
        "TPOT p50 s": t["tpot_p50_s"], "TPOT n": t["tpot_n"], "E2E p50 s": t["e2e_p50_s"], "E2E n": t["e2e_n"],
        "output tok/s": t["achieved_output_tokens_per_s"], "prompt tokens computed": t["prefill_tokens_computed"],
        "prompt tokens sent": t["prompt_tokens"], "from the cache %": 100 * t["token_hit_ratio"],
        "preemptions": t["preemptions"],
    })


def prefix_trace_panel(rate: float = 5.0, kv_blocks: int = 1024) -> ExperimentPanel:
    """Sliders for the offered load and the KV pool; Run replays the shipped sample with caching on and off.

    The result's frame is ``caching_on_off`` at those settings, with the sample's ``capacity_curve``
    (at the trace's own pace, computed once) in ``frame.attrs["curve"]``; the figure is
    ``plot_prefix_cache`` of both. Everything runs on the simulator's virtual clock.
    """
    if kv_blocks not in KV_BLOCKS:
        raise ValueError(f"kv_blocks={kv_blocks!r}: choose one of {list(KV_BLOCKS)}")
    controls = {
        "rate": widgets.FloatSlider(value=rate, min=0.5, max=10.0, step=0.5, description="offered load (requests/s)",
                                    **_SLIDER),
        "kv_blocks": widgets.SelectionSlider(options=[(f"{b * BLOCK_TOKENS:,}", b) for b in KV_BLOCKS],
                                             value=kv_blocks, description="KV pool (tokens) for on vs off",
                                             **_SLIDER),
    }

    def run(progress, rate: float, kv_blocks: int) -> pd.DataFrame:
        curve = sample_curve()
        on_off = caching_on_off(sample_frame(), rate=rate, kv_blocks=kv_blocks)
        on_off.attrs["curve"] = curve
        return on_off

    return ExperimentPanel(controls, run,
                           figure=lambda f, _p: plot_prefix_cache(f.attrs["curve"], f),
                           summary=lambda f, _p: on_off_for_learners(f),
                           title="The Mooncake-format sample (synthetic) replayed with its shared prefixes")


_BUDGET_SLIDER = dict(continuous_update=False, style={"description_width": "170px"}, layout=widgets.Layout(width="480px"))
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
        "kv_blocks": widgets.IntSlider(value=kv_blocks, min=MAX_MODEL_LEN // LESSON_SPEC.block_size, max=192, step=8,
                                       description="KV budget (blocks of 16)", **_BUDGET_SLIDER),
        "n": widgets.IntSlider(value=n, min=2, max=24, description="requests", **_BUDGET_SLIDER),
        "max_seqs": widgets.IntSlider(value=max_seqs, min=1, max=24, description="batch slots (max_seqs)", **_BUDGET_SLIDER),
    }

    def run(progress, kv_blocks: int, n: int, max_seqs: int) -> pd.DataFrame:
        runs = preemption_runs(model, kv_blocks=(kv_blocks,), n=n, max_seqs=max_seqs, max_model_len=MAX_MODEL_LEN,
                               progress=progress)
        frame = runs_frame(runs)
        frame.attrs["preemption"] = preemption_table(runs)
        return frame

    return ExperimentPanel(controls, run,
                           figure=lambda f, _p: plot_kv_blocks(f.attrs["trace"], block_size=LESSON_SPEC.block_size),
                           summary=lambda f, _p: budget_for_learners(f.attrs["preemption"]),
                           title="A KV budget that runs out: blocks in use and preemptions")


__all__ = ["KV_BLOCKS", "on_off_for_learners", "prefix_trace_panel"]
