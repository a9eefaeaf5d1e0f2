"""Gantt chart of requests: one row per request, coloured by what it was doing — queued, prefill, decode, paused.

The segments come from two tables of an engine run: the requests (scheduled arrival, first token, end, status) and the
(step, request) rows of ``Engine.step_requests_frame``. A request is *queued* from its scheduled arrival until its first
step, in *prefill* or *decode* while it is in a step's batch, and *paused* between two steps it was part of (a decode
stalled behind prompts, or a sequence preempted and waiting to be recomputed).
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from kvlab.clocks import RequestRecord, requests_frame

SEGMENT_KINDS = ("queued", "prefill", "decode", "paused")
SEGMENT_COLORS = {"queued": "#d9d9d9", "prefill": "#ff7f0e", "decode": "#1f77b4", "paused": "#f4a6a6"}
SEGMENT_LABELS = {"queued": "queued (not admitted yet)", "prefill": "prefill (prompt in the batch)",
                  "decode": "decode (one token per step)", "paused": "paused (stalled or preempted)"}
SEGMENT_COLUMNS = ["run", "request_id", "kind", "start_s", "end_s"]


def as_requests_frame(requests: pd.DataFrame | Iterable[RequestRecord]) -> pd.DataFrame:
    """A requests frame as ``kvlab.clocks.requests_frame`` makes it (records are converted)."""
    if isinstance(requests, pd.DataFrame):
        return requests
    records = list(requests)
    frame = requests_frame(records) if records else pd.DataFrame(
        columns=["request_id", "status", "fail_reason", "scheduled_s", "admitted_s", "first_token_s", "finished_s"])
    frame["token_s"] = [list(r.token_s) for r in records]
    return frame


def _key(row) -> tuple:
    return (getattr(row, "run", ""), row.request_id)


def gantt_segments(requests: pd.DataFrame | Iterable[RequestRecord], steps: pd.DataFrame) -> pd.DataFrame:
    """One row per bar: run, request_id, kind (one of SEGMENT_KINDS), start_s, end_s.

    Consecutive steps of the same phase merge into one bar. A request still waiting when the
    run ended is queued up to the last step's end.
    """
    req = as_requests_frame(requests)
    steps = steps if steps is not None else pd.DataFrame(columns=["step", "request_id", "phase", "start_s", "end_s"])
    has_run = "run" in steps.columns
    by_request: dict[tuple, pd.DataFrame] = {}
    if len(steps):
        ordered = steps.sort_values("step", kind="stable")
        runs = ordered["run"] if has_run else pd.Series("", index=ordered.index)
        for (run, rid), rows in ordered.groupby([runs, ordered["request_id"]], sort=False):
            by_request[(run, rid)] = rows
    run_end = float(steps["end_s"].max()) if len(steps) else np.nan
    out = []
    for row in req.itertuples(index=False):
        run, rid = _key(row)
        mine = by_request.get((run if has_run else "", rid))
        start = float(row.scheduled_s)
        if mine is None or not len(mine):
            end = row.finished_s if pd.notna(row.finished_s) else run_end
            if pd.notna(end) and end > start:
                out.append((run, rid, "queued", start, float(end)))
            continue
        first = float(mine["start_s"].iloc[0])
        if first > start:
            out.append((run, rid, "queued", start, first))
        cur = None  # [phase, last step, start, end]
        for s in mine.itertuples(index=False):
            if cur is not None and s.phase == cur[0] and s.step == cur[1] + 1:
                cur[1], cur[3] = s.step, float(s.end_s)
                continue
            if cur is not None:
                out.append((run, rid, cur[0], cur[2], cur[3]))
                if s.step != cur[1] + 1 and s.start_s > cur[3]:
                    out.append((run, rid, "paused", cur[3], float(s.start_s)))
            cur = [s.phase, s.step, float(s.start_s), float(s.end_s)]
        assert cur is not None  # mine has rows
        out.append((run, rid, cur[0], cur[2], cur[3]))
    return pd.DataFrame(out, columns=SEGMENT_COLUMNS)


def draw_gantt(ax: Axes, requests: pd.DataFrame | Iterable[RequestRecord], steps: pd.DataFrame,
               title: str | None = None, legend: bool = True) -> Axes:
    """Draw the Gantt chart of one run on ``ax`` (one row per request, the first at the top)."""
    req = as_requests_frame(requests)
    segments = gantt_segments(req, steps)
    keys = [_key(r) for r in req.itertuples(index=False)]
    y_of = {k: i for i, k in enumerate(keys)}
    for kind in SEGMENT_KINDS:
        seg = segments[segments["kind"] == kind]
        if len(seg):
            rows = [y_of[(r.run, r.request_id)] for r in seg.itertuples(index=False)]
            ax.barh(rows, seg["end_s"] - seg["start_s"], left=seg["start_s"], height=0.72,
                    color=SEGMENT_COLORS[kind], label=SEGMENT_LABELS[kind], gid=f"gantt-{kind}")
    handles: list[Artist] = [Patch(color=SEGMENT_COLORS[k], label=SEGMENT_LABELS[k]) for k in SEGMENT_KINDS
               if (segments["kind"] == k).any()]
    if "first_token_s" in req.columns:
        ft = req[pd.notna(req["first_token_s"])]
        if len(ft):
            ax.scatter(ft["first_token_s"], [y_of[_key(r)] for r in ft.itertuples(index=False)], marker="|",
                       s=90, color="black", zorder=3, label="first token")
            handles.append(Line2D([], [], color="black", marker="|", ls="", ms=9, label="first token"))
    failed = req[req["status"] == "failed"] if "status" in req.columns else req.iloc[:0]
    if len(failed):
        ys = [y_of[_key(r)] for r in failed.itertuples(index=False)]
        ax.scatter(failed["finished_s"], ys, marker="x", s=60, color="#b00020", zorder=4, label="failed")
        for r, y in zip(failed.itertuples(index=False), ys):
            ax.annotate(f" failed: {r.fail_reason}", (r.finished_s, y), fontsize=7, color="#b00020", va="center")
        handles.append(Line2D([], [], color="#b00020", marker="x", ls="", label="failed (reason shown)"))
    n = len(keys)
    every = max(1, int(np.ceil(n / 24)))
    ax.set_yticks(range(0, n, every), [f"req {k[1]}" for k in keys[::every]], fontsize=8)
    ax.set_ylim(n - 0.4, -0.6)  # the first request at the top
    ax.set_xlabel("seconds since the run started")
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlim(left=0)
    if title:
        ax.set_title(title, fontsize=10)
    if not n:
        ax.text(0.5, 0.5, "no requests", transform=ax.transAxes, ha="center", va="center", color="#555")
    if legend and handles:
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.005, 1), framealpha=0.9)
    return ax


def plot_gantt(requests: pd.DataFrame | Iterable[RequestRecord], steps: pd.DataFrame,
               title: str | None = None) -> Figure:
    """A Gantt chart of one run: a row per request, segments queued / prefill / decode / paused.

    ``requests``: a requests frame (``ServingRun.requests``) or the RequestRecords; ``steps``:
    ``Engine.step_requests_frame()``. First tokens are ticks, failed requests a red cross with their reason.
    """
    req = as_requests_frame(requests)
    fig = Figure(figsize=(10, 1.2 + 0.22 * max(len(req), 4)), layout="constrained")
    draw_gantt(fig.subplots(), req, steps, title)
    return fig


def plot_gantts(requests: pd.DataFrame, steps: pd.DataFrame, by: str = "run", titles: dict | None = None) -> Figure:
    """One Gantt chart per value of ``by`` (e.g. per policy), stacked on one shared time axis.

    The same time axis makes the comparison direct: the run whose bars end further left served its requests sooner.
    """
    if by not in requests.columns:
        raise ValueError(f"requests have no column {by!r} to split the charts by; columns: {list(requests.columns)}")
    groups = list(dict.fromkeys(requests[by]))
    if not groups:
        fig = Figure(figsize=(10, 2), layout="constrained")
        draw_gantt(fig.subplots(), requests, steps, "no requests")
        return fig
    rows = [int((requests[by] == g).sum()) for g in groups]
    fig = Figure(figsize=(10, 0.9 * len(groups) + 0.22 * sum(max(r, 3) for r in rows)), layout="constrained")
    axes = fig.subplots(len(groups), 1, sharex=True, squeeze=False, height_ratios=[max(r, 3) for r in rows])[:, 0]
    for i, (ax, g) in enumerate(zip(axes, groups)):
        sub_steps = steps[steps[by] == g] if by in steps.columns else steps
        draw_gantt(ax, requests[requests[by] == g], sub_steps, (titles or {}).get(g, str(g)), legend=i == 0)
        if i < len(groups) - 1:
            ax.set_xlabel("")
    ends = [requests["finished_s"].max() if "finished_s" in requests.columns else np.nan,
            steps["end_s"].max() if len(steps) else np.nan]
    end = np.nanmax([e for e in ends if pd.notna(e)] or [1.0])
    axes[0].set_xlim(0, end * 1.02 if end > 0 else 1.0)
    return fig
