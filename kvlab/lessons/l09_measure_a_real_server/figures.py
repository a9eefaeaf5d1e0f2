"""Notebook 09's figures: client clocks beside engine clocks, the service curve at the client, two engines."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

CLIENT, ENGINE, REJECTED = "#1f77b4", "#2ca02c", "#d62728"


def plot_client_vs_engine(frame: pd.DataFrame) -> Figure:
    """Left: each request's TTFT at the client against inside the engine. Right: the difference.

    ``frame`` is ``kvlab.experiments.wire.client_vs_engine`` (``kvlab.http.compare.compare_clocks``). Points on the
    dashed line would mean HTTP and streaming cost nothing; the gap above it is what the wire adds.
    """
    if frame.empty:
        raise ValueError("no request completed on both sides; nothing to plot")
    ms = 1e3
    engine = frame["engine_ttft_s"].to_numpy(dtype=float) * ms
    sent = frame["client_ttft_from_sent_s"].to_numpy(dtype=float) * ms
    scheduled = frame["client_ttft_s"].to_numpy(dtype=float) * ms
    overhead = frame["ttft_overhead_s"].to_numpy(dtype=float) * ms
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax_pairs, ax_diff = fig.subplots(1, 2)
    top = max(scheduled.max(), sent.max(), engine.max()) * 1.08
    ax_pairs.plot([0, top], [0, top], ls="--", color="#999999", lw=1, label="client = engine")
    ax_pairs.scatter(engine, scheduled, s=18, color="#aec7e8", label="client, from scheduled arrival")
    ax_pairs.scatter(engine, sent, s=18, color=CLIENT, label="client, from sending")
    ax_pairs.set(xlim=(0, top), ylim=(0, top), xlabel="TTFT inside the engine (ms)",
                 ylabel="TTFT at the client (ms)", title=f"The same {len(frame)} requests, timed twice")
    ax_pairs.legend(fontsize=8, loc="upper left")
    ax_diff.hist(overhead, bins=max(8, min(30, len(overhead) // 2)), color=CLIENT, alpha=0.75)
    median = float(np.median(overhead))
    ax_diff.axvline(median, color="black", ls=":", label=f"median {median:.2f} ms (n={len(overhead)})")
    ax_diff.set(xlabel="client TTFT (from sending) − engine TTFT (ms)", ylabel="requests",
                title="What HTTP and streaming add to the first token")
    ax_diff.set_xlim(left=0)
    ax_diff.legend(fontsize=8)
    for ax in (ax_pairs, ax_diff):
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
    return fig


def plot_wire_service_curve(table: pd.DataFrame) -> Figure:
    """Left: achieved against offered requests/s, rejections marked. Right: TTFT and E2E quantiles by load.

    ``table`` is ``kvlab.experiments.wire.wire_service_curve``: one row per offered rate. Below
    capacity the points follow the diagonal (the server keeps up); past it throughput flattens,
    the wait grows, and the bounded queue turns requests away with HTTP 429.
    """
    if table.empty:
        raise ValueError("the service-curve table has no rows; run wire_service_curve with at least one rate")
    t = table.sort_values("offered_rps")
    offered = t["offered_rps"].to_numpy(dtype=float)
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax_tput, ax_wait = fig.subplots(1, 2, sharex=True)
    lo, hi = offered.min() / 1.5, offered.max() * 1.5
    ax_tput.plot([lo, hi], [lo, hi], ls="--", color="#999999", lw=1, label="achieved = offered")
    ax_tput.plot(offered, t["requests_per_s"], "o-", color=CLIENT, label="completed requests/s")
    for x, y, row in zip(offered, t["requests_per_s"], t.itertuples(index=False)):
        note = f"{row.completed}/{row.sent} done" + (f"\n{row.rejected} rejected (429)" if row.rejected else "")
        ax_tput.annotate(note, (x, y), xytext=(4, -18 if row.rejected else 6), textcoords="offset points",
                         fontsize=7, color=REJECTED if row.rejected else "#333333")
    ax_tput.set(xscale="log", yscale="log", xlim=(lo, hi), xlabel="offered load (requests/s)",
                ylabel="achieved (requests/s)", title="Throughput at the client")
    ax_tput.legend(fontsize=8, loc="upper left")
    ms = 1e3
    for col, label, color, style in (("ttft_p50_s", "TTFT p50", CLIENT, "o-"), ("ttft_p90_s", "TTFT p90", CLIENT, "s--"),
                                     ("e2e_p50_s", "E2E p50", ENGINE, "o-"), ("e2e_p90_s", "E2E p90", ENGINE, "s--")):
        ax_wait.plot(offered, t[col] * ms, style, color=color, label=label, ms=4)
    if "ttft_n" in t.columns:  # every quantile with its sample size: the completed requests of that rate
        top = t[["ttft_p90_s", "e2e_p90_s"]].max(axis=1).to_numpy(dtype=float) * ms
        for x, y, n in zip(offered, top, t["ttft_n"]):
            ax_wait.annotate(f"n={n}", (x, y), xytext=(0, 6), textcoords="offset points", ha="center",
                             fontsize=7, color="#333333")
    ax_wait.set(yscale="log", xlabel="offered load (requests/s)", ylabel="ms (completed requests)",
                title="The wait at the client (n: completed requests behind each quantile)")
    if "ttft_n" in t.columns and np.isfinite(top).any():
        ax_wait.set_ylim(top=np.nanmax(top) * 1.8)  # room for the n labels above the highest point
    ax_wait.legend(fontsize=8, loc="upper left")
    for ax in (ax_tput, ax_wait):
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3, which="both")
    return fig


COLORS = {"kvlab serve": "#1f77b4", "transformers serve": "#ff7f0e", "vLLM": "#2ca02c"}
TTFT_P95 = "ttft_p95_sent_s"  # over every request sent, the unanswered at their wait so far (the knee reads it)


def plot_two_engines(frame: pd.DataFrame, slo_ttft_s: float | None = None) -> Figure:
    """Left: completed vs offered requests/s of each engine's sweep. Middle: TTFT p95. Right: TPOT p50.

    ``frame`` is ``kvlab.experiments.two_engines.compare_engines(...).frame``: its ``sweep`` rows are drawn (cold and
    warm rows are the table's). Each TTFT point is the p95 over every request sent, as the knee reads it, with
    completed/sent above it and how many had no first token at the close; the dotted line is the knee's TTFT bound
    (``slo_ttft_s``, default the run's setting).
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
