"""Cold vs warm start: what a request waits for when the service has to start first, and once it is warm."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

PHASE_COLORS = ["#bdbdbd", "#969696", "#9467bd", "#8c564b", "#e6550d"]


def plot_cold_warm(frame: pd.DataFrame) -> Figure:
    """Left: each start-up phase, their total (first token from a stopped service) and a warm request's TTFT,
    on a log scale (seconds against milliseconds). Right: the TTFT of each serving of the same request.

    ``frame`` comes from ``kvlab.lessons.l04_four_clocks.four_clocks.cold_vs_warm`` (start-up phases in its attrs).
    """
    a = frame.attrs
    phases = [("Python start", a["python_start_s"]), ("import torch + kvlab", a["import_s"]),
              ("build model", a["build_model_s"]), ("engine + KV pool", a["engine_init_s"]),
              ("TTFT of the first request", float(frame["ttft_s"].iloc[0]))]
    warm = frame[frame["start"] == "warm"]
    rows = [*phases, ("= to the first token from a stopped service", sum(v for _, v in phases)),
            (f"warm request: TTFT (median of {len(warm)})", float(warm["ttft_s"].median()))]
    colors = [*PHASE_COLORS, "#d62728", "#1f77b4"]
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax_phase, ax_runs = fig.subplots(1, 2, width_ratios=[1.6, 1])
    y = range(len(rows))
    bars = ax_phase.barh(list(y), [v for _, v in rows], color=colors)
    ax_phase.bar_label(bars, labels=[f"{v * 1e3:,.1f} ms" if v < 1 else f"{v:,.2f} s" for _, v in rows],
                       fontsize=8, padding=3)
    ax_phase.set_yticks(list(y), [name for name, _ in rows], fontsize=8)
    ax_phase.invert_yaxis()
    ax_phase.set_xscale("log")
    ax_phase.set_xlim(1e-3, max(v for _, v in rows) * 8)
    ax_phase.set(xlabel="seconds (log scale)", title="Cold start, phase by phase, vs a warm request")
    colors = ["#e6550d" if s == "cold" else "#1f77b4" for s in frame["start"]]
    bars = ax_runs.bar(frame["run"].astype(str), frame["ttft_s"] * 1e3, color=colors)
    ax_runs.bar_label(bars, fmt="%.1f", fontsize=7)
    ax_runs.set(xlabel="serving of the same request (0 = first after start-up)", ylabel="TTFT (ms)",
                title="Same request, served again and again")
    for ax in (ax_phase, ax_runs):
        ax.title.set_fontsize(10)
        ax.grid(axis="x" if ax is ax_phase else "y", alpha=0.3)
    return fig
