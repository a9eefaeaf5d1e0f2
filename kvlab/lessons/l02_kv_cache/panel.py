"""The panels of lesson 02: measured cache memory vs the formula, and a KV memory calculator."""
from __future__ import annotations

import ipywidgets as widgets
import pandas as pd

from kvlab.experiments.memory import CACHE_PRECISIONS, kv_memory_table, measure_cache_memory, resolve_config
from kvlab.model.config import PUBLISHED_CONFIGS
from kvlab.model.decoder import Decoder
from kvlab.lessons.l02_kv_cache.figures import plot_cache_memory, plot_kv_memory
from kvlab.lessons.common.panel import ExperimentPanel

_WIDE = dict(style={"description_width": "150px"}, layout=widgets.Layout(width="480px"))
CONTEXTS = [2**i for i in range(9, 18)]  # 512 .. 131072 tokens
BATCHES = [2**i for i in range(0, 9)]  # 1 .. 256 sequences
GPU_SIZES = {"24 GiB (RTX 4090, L4)": 24, "40 GiB (A100 40GB)": 40, "48 GiB (L40S)": 48,
             "80 GiB (A100 / H100 80GB)": 80, "141 GiB (H200)": 141}
WEIGHT_BYTES = 2  # the calculator assumes fp16 / bf16 weights


def memory_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """The last step of each cache: bytes by kind, the formula, and whether they agree."""
    last = frame.groupby("cache", sort=False).tail(1)
    return pd.DataFrame({
        "cache": last["cache"], "tokens stored": last["tokens"], "allocated bytes": last["allocated_bytes"],
        "holding tokens": last["used_bytes"], "reserved, empty": last["reserved_bytes"],
        "offloaded": last["offloaded_bytes"], "formula bytes": last["formula_bytes"],
        "note": [n if n else ("allocated = formula" if a == f else f"allocated / formula = {a / f:.2f}")
                 for n, a, f in zip(last["note"], last["allocated_bytes"], last["formula_bytes"])],
    })


def cache_memory_panel(model: Decoder | None = None, prompt_tokens: int = 32,
                       max_new_tokens: int = 96) -> ExperimentPanel:
    """Generate with every cache strategy and plot its measured bytes against the formula.

    The defaults store 127 tokens: past the quantized cache's 64-token full-precision window, so
    its packed history shows.
    """
    controls = {
        "prompt_tokens": widgets.IntSlider(value=prompt_tokens, min=1, max=256, continuous_update=False,
                                           description="prompt tokens", **_WIDE),
        "max_new_tokens": widgets.IntSlider(value=max_new_tokens, min=1, max=256, continuous_update=False,
                                            description="tokens to generate", **_WIDE),
    }

    def run(progress, prompt_tokens: int, max_new_tokens: int) -> pd.DataFrame:
        return measure_cache_memory(model, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens,
                                    progress=progress)

    return ExperimentPanel(controls, run, figure=lambda frame, _p: plot_cache_memory(frame),
                           summary=lambda frame, _p: memory_summary(frame),
                           title="Measured cache memory vs the formula")


def calculator_sentence(table: pd.DataFrame, context: int, batch: int, precision: str) -> str:
    """One sentence on the chosen point: cache size, weights, total, and how many sequences fit."""
    row = table[(table["context"] == context) & (table["batch"] == batch)].iloc[0]
    kib_per_token = table.attrs["kv_bytes_per_token"] / 1024
    text = (f"{row['model']}: {context:,} tokens × batch {batch} with a {precision} cache = "
            f"{row['kv_gib']:,.2f} GiB of KV cache ({kib_per_token:,.0f} KiB per token) + "
            f"{row['weights_gib']:,.1f} GiB of fp16 weights = {row['total_gib']:,.1f} GiB: "
            f"{'fits' if row['fits'] else 'does NOT fit'} in {row['gpu_gib']:g} GiB. "
            f"At most {row['max_batch']:,} sequences of {context:,} tokens fit beside the weights (an upper "
            "bound: a real server also needs memory for activations and keeps some back).")
    if row["over_model_context"]:
        text += " (Longer than the model was trained for; the formula still tells the cost.)"
    return text


def kv_calculator_panel(model: str = "Llama-3-8B (GQA)", context: int = 8192, batch: int = 8,
                        precision: str = "fp16 / bf16", gpu_gib: float = 80) -> ExperimentPanel:
    """Pick a published model shape, a context, a batch, a cache precision and a GPU; see the memory.

    Instant (pure arithmetic), so every change recomputes at once: ``auto_run``.
    """
    resolve_config(model)
    controls = {
        "model": widgets.Dropdown(options=list(PUBLISHED_CONFIGS), value=model, description="model", **_WIDE),
        "context": widgets.SelectionSlider(options=CONTEXTS, value=context, description="context (tokens)",
                                           continuous_update=False, **_WIDE),
        "batch": widgets.SelectionSlider(options=BATCHES, value=batch, description="batch (sequences)",
                                         continuous_update=False, **_WIDE),
        "precision": widgets.Dropdown(options=list(CACHE_PRECISIONS), value=precision,
                                      description="cache precision", **_WIDE),
        "gpu_gib": widgets.Dropdown(options=GPU_SIZES, value=gpu_gib, description="GPU memory", **_WIDE),
    }

    def run(progress, model: str, context: int, batch: int, precision: str, gpu_gib: float) -> pd.DataFrame:
        return kv_memory_table(model, CONTEXTS, sorted({1, 8, 64, batch}), CACHE_PRECISIONS[precision],
                               gpu_gib=gpu_gib, weight_bytes_per_element=WEIGHT_BYTES)

    return ExperimentPanel(controls, run,
                           figure=lambda t, p: plot_kv_memory(t, p["context"], p["batch"]),
                           summary=lambda t, p: calculator_sentence(t, p["context"], p["batch"], p["precision"]),
                           title="KV cache calculator (published model shapes, fp16 weights)",
                           auto_run=True)
