"""Cold vs warm start: what a request waits for when the service has to start first, and once it is warm."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

PHASE_COLORS = ["#bdbdbd", "#969696", "#9467bd", "#8c564b", "#e6550d"]


def plot_cold_warm(frame: pd.DataFrame) -> Figure:
    """Left: the time to a first token from a stopped service, phase by phase, next to a warm request's TTFT
    (log scale: seconds against milliseconds). Right: the TTFT of each serving of the same request.

    ``frame`` comes from ``kvlab.experiments.four_clocks.cold_vs_warm`` (start-up phases in its attrs).
    """
    a = frame.attrs
    phases = [("Python start", a["python_start_s"]), ("import torch + kvlab", a["import_s"]),
              ("build model", a["build_model_s"]), ("engine + KV pool", a["engine_init_s"]),
              ("TTFT of the first request", float(frame["ttft_s"].iloc[0]))]
    warm = frame[frame["start"] == "warm"]
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    ax_phase, ax_runs = fig.subplots(1, 2, width_ratios=[1.6, 1])
    left = 0.0
    for (name, seconds), color in zip(phases, PHASE_COLORS):
        ax_phase.barh(1, seconds, left=left, color=color, label=f"{name}: {seconds * 1e3:,.0f} ms")
        left += seconds
    ax_phase.barh(0, warm["ttft_s"].median(), color="#1f77b4",
                  label=f"warm TTFT (median of {len(warm)}): {warm['ttft_s'].median() * 1e3:,.1f} ms")
    ax_phase.set_yticks([0, 1], ["warm service", "stopped service"])
    ax_phase.set_xscale("log")
    ax_phase.set(xlabel="seconds until the first token (log scale)", title="From a stopped service vs a warm one")
    ax_phase.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2, frameon=False)
    colors = ["#e6550d" if s == "cold" else "#1f77b4" for s in frame["start"]]
    bars = ax_runs.bar(frame["run"].astype(str), frame["ttft_s"] * 1e3, color=colors)
    ax_runs.bar_label(bars, fmt="%.1f", fontsize=7)
    ax_runs.set(xlabel="serving of the same request (0 = first after start-up)", ylabel="TTFT (ms)",
                title="Same request, served again and again")
    for ax in (ax_phase, ax_runs):
        ax.title.set_fontsize(10)
        ax.grid(axis="x" if ax is ax_phase else "y", alpha=0.3)
    return fig
