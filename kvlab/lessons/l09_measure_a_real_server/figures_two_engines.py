"""The service curves of two engines on one figure: achieved vs offered load, and TTFT p95 / TPOT p50 by load."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

COLORS = {"kvlab serve": "#1f77b4", "transformers serve": "#ff7f0e", "vLLM": "#2ca02c"}
TTFT_P95 = "ttft_p95_sent_s"  # over every request sent, the unanswered at their wait so far (the knee reads it)


def plot_two_engines(frame: pd.DataFrame, slo_ttft_s: float | None = None) -> Figure:
    """Left: completed vs offered requests/s of each engine's sweep. Middle: TTFT p95. Right: TPOT p50.

    ``frame`` is ``kvlab.lessons.l09_measure_a_real_server.two_engines.compare_engines(...).frame``: its ``sweep`` rows
    are drawn (cold and warm rows are the table's). Each TTFT point is the p95 over every request
    sent, as the knee reads it, with completed/sent above it and how many had no first token at the close;
    the dotted line is the knee's TTFT bound (``slo_ttft_s``,
    default the run's setting).
    """
    t = frame[frame["phase"] == "sweep"]
    if t.empty:
        raise ValueError("no sweep rows to plot; run compare_engines with at least one rate")
    if slo_ttft_s is None:
        slo_ttft_s = frame.attrs.get("settings", {}).get("slo_ttft_s")
    fig = Figure(figsize=(12, 3.8), layout="constrained")
    ax_tput, ax_ttft, ax_tpot = fig.subplots(1, 3, sharex=True)
    offered = t["offered_rps"].to_numpy(dtype=float)
    lo, hi = offered.min() / 1.5, offered.max() * 1.5
    ax_tput.plot([lo, hi], [lo, hi], ls="--", color="#999999", lw=1, label="achieved = offered")
    ms = 1e3
    for engine, g in t.groupby("engine", sort=False):
        g = g.sort_values("offered_rps")
        color = COLORS.get(engine, "#555555")
        x = g["offered_rps"].to_numpy(dtype=float)
        ax_tput.plot(x, g["requests_per_s"], "o-", color=color, label=engine)
        p95 = g[TTFT_P95 if TTFT_P95 in g else "ttft_p95_s"] * ms
        ax_ttft.plot(x, p95, "o-", color=color, label=engine)
        ax_tpot.plot(x, g["tpot_p50_s"] * ms, "o-", color=color, label=engine)
        open_ = g["ttft_censored"] if "ttft_censored" in g else [0] * len(g)
        for xi, y, n, sent, unanswered in zip(x, p95, g["ttft_n"], g["sent"], open_):
            if np.isfinite(y):
                ax_ttft.annotate(f"{n}/{sent}" + (f", {unanswered} open" if unanswered else ""), (xi, y),
                                 xytext=(0, 6), textcoords="offset points", ha="center", fontsize=7, color=color)
    if slo_ttft_s:
        ax_ttft.axhline(slo_ttft_s * ms, ls=":", color="black", lw=1, label=f"knee bound {slo_ttft_s * ms:.0f} ms")
    ax_tput.set(xscale="log", yscale="log", xlim=(lo, hi), xlabel="offered load (requests/s)",
                ylabel="completed (requests/s)", title="Throughput at the client")
    ax_ttft.set(yscale="log", xlabel="offered load (requests/s)", ylabel="TTFT p95 of all sent (ms)",
                title="First token, p95 (completed/sent; open: no first token at the close)")
    ax_tpot.set(yscale="log", xlabel="offered load (requests/s)", ylabel="TPOT p50 (ms)",
                title="Time per output token, median")
    for ax in (ax_tput, ax_ttft, ax_tpot):
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8, loc="upper left")
    return fig


__all__ = ["plot_two_engines"]
