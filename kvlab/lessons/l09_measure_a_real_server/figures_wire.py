"""Figures of measurements over the wire: client clocks next to engine clocks, and the service curve at the client."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

CLIENT, ENGINE, REJECTED = "#1f77b4", "#2ca02c", "#d62728"


def plot_client_vs_engine(frame: pd.DataFrame) -> Figure:
    """Left: each request's TTFT at the client against inside the engine. Right: the difference.

    ``frame`` is ``kvlab.lessons.l09_measure_a_real_server.wire.client_vs_engine`` (``kvlab.http.compare.compare_clocks``).
    Points on the dashed line would mean HTTP and streaming cost nothing; the gap above it is
    what the wire adds.
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
    bins = max(8, min(30, len(overhead) // 2))
    ax_diff.hist(overhead, bins=bins, color=CLIENT, alpha=0.75)
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

    ``table`` is ``kvlab.lessons.l09_measure_a_real_server.wire.wire_service_curve``: one row per offered rate. Below
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
        note = f"{row.completed}/{row.sent} done"
        if row.rejected:
            note += f"\n{row.rejected} rejected (429)"
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
