"""One request's journey: arrival, admission, first token, every token, finish — with the four clocks on it.

Top: the request's timeline (queued, prefill, decode, paused, as in the Gantt chart), its token
arrivals as ticks, and brackets for the clocks: queue wait (arrival -> admission), TTFT
(arrival -> first token), the decode span that TPOT averages, and E2E (arrival -> last token).
Bottom: the gap before each token after the first (what a reader sees as the text's pace), with
its mean, TPOT = (E2E - TTFT) / (n - 1), and the largest gap.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from ...clocks import RequestRecord
from ..common.gantt import SEGMENT_COLORS, gantt_segments

EVENT_STYLE = {  # event -> (marker, colour, label)
    "scheduled_s": ("v", "#333333", "arrival (scheduled)"),
    "admitted_s": ("o", "#6a3d9a", "admitted to the batch"),
    "first_token_s": ("*", "#e6550d", "first token"),
    "finished_s": ("s", "#2ca02c", "last token / finish"),
}


def _as_row(request: RequestRecord | pd.Series | dict) -> dict:
    if isinstance(request, RequestRecord):
        row = {k: getattr(request, k) for k in ("request_id", "prompt_tokens", "scheduled_s", "admitted_s",
                                                 "first_token_s", "finished_s", "status", "fail_reason")}
        row["token_s"] = list(request.token_s)
        return row
    row = dict(request)
    if "token_s" not in row:
        raise ValueError("the request row has no token_s column: pass a RequestRecord, or a row of "
                         "ServingRun.requests (which keeps every token's stamp)")
    for k in ("admitted_s", "first_token_s", "finished_s"):
        v = row.get(k)
        row[k] = None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
    return row


def _bracket(ax: Axes, a: float, b: float, y: float, text: str, color: str) -> None:
    ax.annotate("", xy=(a, y), xytext=(b, y), arrowprops=dict(arrowstyle="<->", color=color, lw=1.3,
                                                              shrinkA=0, shrinkB=0))
    ax.text((a + b) / 2, y + 0.07, text, ha="center", va="bottom", fontsize=8, color=color)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:,.0f} ms" if seconds >= 0.01 else f"{seconds * 1e3:,.2f} ms"


def plot_request_journey(request: RequestRecord | pd.Series | dict, steps: pd.DataFrame | None = None,
                         title: str | None = None) -> Figure:
    """The four clocks drawn on one request's timeline (see the module docstring).

    ``request``: a RequestRecord or a row of ``ServingRun.requests``; ``steps``: the run's
    ``step_requests_frame`` (optional: without it the queued / prefill / decode bars are left out).
    A failed request shows its arrival and its failure with the reason.
    """
    r = _as_row(request)
    tokens = list(r["token_s"])
    t0 = float(r["scheduled_s"])
    fig = Figure(figsize=(10, 5.2), layout="constrained")
    ax, ax_gap = fig.subplots(2, 1, height_ratios=[1.35, 1])
    if steps is not None and len(steps):
        mine = steps[steps["request_id"] == r["request_id"]]
        if "run" in steps.columns and "run" in r:
            mine = mine[mine["run"] == r["run"]]
        one = pd.DataFrame([{k: r.get(k) for k in ("request_id", "scheduled_s", "finished_s", "status")}])
        for seg in gantt_segments(one, mine.drop(columns="run", errors="ignore")).itertuples(index=False):
            ax.barh(0, seg.end_s - seg.start_s, left=seg.start_s, height=0.3, color=SEGMENT_COLORS[seg.kind],
                    label=seg.kind, gid=f"journey-{seg.kind}")
    if tokens:
        ax.scatter(tokens, [0.3] * len(tokens), marker="|", s=60, color="black", label=f"{len(tokens)} tokens")
    for key, (marker, color, label) in EVENT_STYLE.items():
        t = r.get(key)
        if t is not None and (key != "finished_s" or r["status"] == "completed"):
            ax.scatter([t], [0], marker=marker, s=110, color=color, zorder=5, edgecolor="white",
                       label=f"{label}: {t - t0:.3f} s")
    if r["status"] == "failed":
        ax.scatter([r["finished_s"]], [0], marker="x", s=90, color="#b00020", zorder=5,
                   label=f"failed: {r['fail_reason']}")
    ttft = r["first_token_s"] - t0 if r["first_token_s"] is not None else None
    e2e = r["finished_s"] - t0 if r["finished_s"] is not None and r["status"] == "completed" else None
    if r["admitted_s"] is not None and r["admitted_s"] > t0:
        _bracket(ax, t0, r["admitted_s"], -0.55, f"queue wait {_ms(r['admitted_s'] - t0)}", "#6a3d9a")
    if ttft is not None:
        _bracket(ax, t0, r["first_token_s"], -0.95, f"TTFT {_ms(ttft)}", "#e6550d")
    if e2e is not None:
        _bracket(ax, t0, r["finished_s"], -1.35, f"E2E {_ms(e2e)}", "#2ca02c")
        if len(tokens) >= 2:
            tpot = (e2e - ttft) / (len(tokens) - 1)
            _bracket(ax, r["first_token_s"], r["finished_s"], -0.55,
                     f"{len(tokens) - 1} gaps, mean (TPOT) {_ms(tpot)}", "#1f77b4")
    end = max([t0, *tokens, *(t for t in (r["finished_s"], r["admitted_s"]) if t is not None)])
    span = max(end - t0, 1e-3)
    ax.set_xlim(t0 - 0.03 * span, end + 0.03 * span)
    ax.set_ylim(-1.6, 0.75)
    ax.set_yticks([])
    ax.set_xlabel("seconds since the run started")
    ax.legend(fontsize=7, loc="upper left", ncol=3, framealpha=0.9)
    ax.set_title(title or f"Request {r['request_id']}: {r.get('prompt_tokens', '?')} prompt tokens, "
                          f"{len(tokens)} output tokens ({r['status']})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)

    gaps = np.diff(tokens) * 1e3
    if len(gaps):
        idx = np.arange(1, len(tokens))
        colors = [SEGMENT_COLORS["decode"]] * len(gaps)
        worst = int(np.argmax(gaps))
        colors[worst] = "#d62728"
        ax_gap.bar(idx, gaps, color=colors, width=0.85, gid="journey-gaps")
        if e2e is not None and ttft is not None:
            tpot_ms = (e2e - ttft) / (len(tokens) - 1) * 1e3
            ax_gap.axhline(tpot_ms, color="black", ls="--", lw=1, label=f"mean gap = TPOT = {tpot_ms:,.2f} ms")
        ax_gap.annotate(f"largest gap {gaps[worst]:,.1f} ms (before token {worst + 1})", (worst + 1, gaps[worst]),
                        xytext=(0, 4), textcoords="offset points", ha="center", fontsize=8, color="#d62728")
        ax_gap.set_ylim(0, gaps.max() * 1.25)
        ax_gap.legend(fontsize=8, loc="upper right")
    else:
        ax_gap.text(0.5, 0.5, "fewer than 2 tokens: no gaps between tokens", transform=ax_gap.transAxes,
                    ha="center", va="center", color="#555")
    ax_gap.set(xlabel="output token (index)", ylabel="gap before it (ms)",
               title="Time between tokens (each gap is what the reader waits for the next token)")
    ax_gap.title.set_fontsize(10)
    ax_gap.grid(axis="y", alpha=0.3)
    return fig
