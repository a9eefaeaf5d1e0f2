"""The distribution of one clock across requests: why a mean hides the wait.

Left: a histogram of the clock (say TTFT) with the mean, the median and the tail quantiles drawn
on it. Right: every request sorted from fastest to slowest, so the share of requests above any
line can be read off. The sample size n is always printed next to the quantiles.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ...clocks import quantiles

CLOCK_LABELS = {"ttft_s": "time to first token", "tpot_s": "time per output token (TPOT)",
                "e2e_s": "end-to-end time (E2E)", "queue_s": "queue wait"}
LINES = (("mean", "#d62728", "-"), ("p50", "#333333", ":"), ("p95", "#6a3d9a", "--"), ("p99", "#6a3d9a", "-."))


def plot_clock_distribution(requests: pd.DataFrame, clock: str = "ttft_s", slo_s: float | None = None,
                            title: str | None = None) -> Figure:
    """Histogram and sorted values of ``clock`` over the completed requests, with mean / p50 / p95 / p99.

    ``requests`` is a requests frame (``ServingRun.requests`` or ``kvlab.clocks.requests_frame``).
    With ``slo_s`` a target line is drawn and the share of requests missing it is printed.
    """
    if clock not in requests.columns:
        raise ValueError(f"no column {clock!r} in the requests frame; choose one of "
                         f"{[c for c in CLOCK_LABELS if c in requests.columns]}")
    done = requests[requests["status"] == "completed"] if "status" in requests.columns else requests
    values = done[clock].dropna().to_numpy(dtype=float) * 1e3  # ms
    q = quantiles(values)
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_hist, ax_sorted = fig.subplots(1, 2)
    name = CLOCK_LABELS.get(clock, clock)
    if not len(values):
        for ax in (ax_hist, ax_sorted):
            ax.text(0.5, 0.5, "no completed requests", transform=ax.transAxes, ha="center", va="center",
                    color="#555")
        return fig
    ax_hist.hist(values, bins=min(30, max(5, len(values) // 2)), color="#9ecae1", edgecolor="white")
    ordered = np.sort(values)
    ax_sorted.plot(np.arange(1, len(ordered) + 1) / len(ordered) * 100, ordered, marker=".", color="#1f77b4")
    for stat, color, ls in LINES:
        v = q[stat]
        label = f"{stat} = {v:,.1f} ms" + (f"  (n = {q['n']})" if stat == "mean" else "")
        ax_hist.axvline(v, color=color, ls=ls, lw=1.5, label=label)
        ax_sorted.axhline(v, color=color, ls=ls, lw=1.2)
    above = int((values > q["mean"]).sum())
    ax_sorted.text(0.03, 0.78, f"{above} of {len(values)} requests ({above / len(values):.0%}) wait longer "
                               "than the mean\n"
                               f"the slowest 5% wait ≥ {q['p95'] / q['mean']:.1f}× the mean",
                   transform=ax_sorted.transAxes, va="top", fontsize=8)
    if slo_s is not None:
        miss = float((values > slo_s * 1e3).mean())
        ax_hist.axvline(slo_s * 1e3, color="black", lw=2, label=f"target {slo_s * 1e3:,.0f} ms ({miss:.0%} miss it)")
        ax_sorted.axhline(slo_s * 1e3, color="black", lw=2)
    ax_hist.set(xlabel=f"{name} (ms)", ylabel="requests", title=title or f"{name}: {q['n']} completed requests")
    ax_hist.legend(fontsize=8)
    ax_sorted.set(xlabel="requests, fastest to slowest (%)", ylabel=f"{name} (ms)",
                  title="Every request, sorted")
    for ax in (ax_hist, ax_sorted):
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
    return fig
