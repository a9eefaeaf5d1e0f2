"""Figure of kvlab's caches beside transformers': time per token and cache bytes, per strategy.

``frame`` is ``run_transformers_caches``' (one row per strategy and library, the per-token rows in
``frame.attrs["steps"]``). Left: the median time per decode token of each library, a whisker to the
95th percentile; right: the cache bytes after every step of the first question, measured (kvlab solid,
transformers dashed) and the formula (black dots). A transformers cache that did not run is named on
the left.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..common.figure_style import cache_color

_LINES = {"kvlab": "-", "transformers": "--"}


def plot_transformers_caches(frame: pd.DataFrame) -> Figure:
    """Time per token (left) and cache bytes per step (right), kvlab vs transformers, per strategy."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_t, ax_b = fig.subplots(1, 2)
    strategies = list(dict.fromkeys(frame["strategy"]))
    x = np.arange(len(strategies))
    width = 0.38
    for j, lib in enumerate(("kvlab", "transformers")):
        rows = frame[frame["library"] == lib].set_index("strategy").reindex(strategies)
        p50, p95 = rows["token_ms_p50"].to_numpy(float), rows["token_ms_p95"].to_numpy(float)
        pos = x + (j - 0.5) * width
        colors = [cache_color(s) for s in strategies]
        ax_t.bar(pos, p50, width, color=colors, alpha=0.9 if lib == "kvlab" else 0.45,
                 hatch=None if lib == "kvlab" else "//", edgecolor="black", linewidth=0.5, label=lib)
        ax_t.errorbar(pos, p50, yerr=[np.zeros_like(p50), np.nan_to_num(p95 - p50)], fmt="none", ecolor="black",
                      capsize=3, linewidth=0.8)
        for p, v, st in zip(pos, p50, rows["status"]):
            if not np.isfinite(v):
                ax_t.text(p, 0, " did not run here", rotation=90, va="bottom", ha="center", fontsize=7)
    ax_t.set_xticks(x, strategies)
    ax_t.set(ylabel="ms per decode token (median, whisker p95)", title="time per token: kvlab solid, transformers hatched")
    ax_t.grid(alpha=0.3, axis="y")
    ax_t.legend(fontsize=7)

    steps = frame.attrs.get("steps")
    if steps is not None and len(steps):
        first = steps[(steps["question"] == steps["question"].min()) & (steps["repeat"] == steps["repeat"].min())]
        prompt = int(frame["prompt_tokens"].iloc[0])
        for (s, lib), rows in first.groupby(["strategy", "library"], sort=False):
            stored = prompt + rows["token"]
            ax_b.plot(stored, rows["cache_bytes"] / 1024, ls=_LINES[lib], color=cache_color(s), label=f"{s}, {lib}")
            ax_b.plot(stored, rows["formula_bytes"] / 1024, ls="none", marker=".", ms=2.5, color="black")
        ax_b.plot([], [], ls="none", marker=".", color="black", label="formula")
    ax_b.set(xlabel="tokens stored", ylabel="cache KiB after the step", title="cache bytes as tokens are stored")
    ax_b.grid(alpha=0.3)
    ax_b.legend(fontsize=7, ncol=2)
    return fig


__all__ = ["plot_transformers_caches"]
