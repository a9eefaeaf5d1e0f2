"""Notebook 04's figures: one request's journey, a clock's distribution, tokens per word, cold vs warm start."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from kvlab.clocks import RequestRecord, quantiles
from kvlab.lessons.common.gantt import SEGMENT_COLORS, gantt_segments

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
    """The four clocks drawn on one request's timeline.

    Top: the timeline (queued, prefill, decode, paused, as in the Gantt chart), token arrivals as ticks, and
    brackets for queue wait, TTFT, the decode span that TPOT averages, and E2E. Bottom: the gap before each token
    after the first, with its mean, TPOT = (E2E - TTFT) / (n - 1), and the largest gap.
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
    ax.set(xlim=(t0 - 0.03 * span, end + 0.03 * span), ylim=(-1.6, 0.75), yticks=[],
           xlabel="seconds since the run started")
    ax.legend(fontsize=7, loc="upper left", ncol=3, framealpha=0.9)
    ax.set_title(title or f"Request {r['request_id']}: {r.get('prompt_tokens', '?')} prompt tokens, "
                          f"{len(tokens)} output tokens ({r['status']})", fontsize=10)
    ax.grid(axis="x", alpha=0.3)

    gaps = np.diff(tokens) * 1e3
    if len(gaps):
        worst = int(np.argmax(gaps))
        colors = [SEGMENT_COLORS["decode"]] * len(gaps)
        colors[worst] = "#d62728"
        ax_gap.bar(np.arange(1, len(tokens)), gaps, color=colors, width=0.85, gid="journey-gaps")
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
            ax.text(0.5, 0.5, "no completed requests", transform=ax.transAxes, ha="center", va="center", color="#555")
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
    ax_sorted.set(xlabel="requests, fastest to slowest (%)", ylabel=f"{name} (ms)", title="Every request, sorted")
    for ax in (ax_hist, ax_sorted):
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
    return fig


TOKENIZER_COLORS = ["#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]  # bytes, BPE, a real one, ...


def _bars(ax, wide: pd.DataFrame, colors: list[str], fmt: str) -> None:
    """Grouped horizontal bars: one group per row of ``wide`` (top to bottom), one bar per column."""
    k = len(wide.columns)
    height = 0.8 / k
    y = np.arange(len(wide))
    for j, name in enumerate(wide.columns):
        values = wide[name].to_numpy(dtype=float)
        bars = ax.barh(y + (j - (k - 1) / 2) * height, np.nan_to_num(values), height=height, color=colors[j],
                       label=name)
        ax.bar_label(bars, labels=["" if np.isnan(v) else format(v, fmt) for v in values], fontsize=6, padding=2)
    labels = [t if not wide.loc[t].isna().all() else f"{t} (no spaces)" for t in wide.index]
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    top = np.nanmax(wide.to_numpy(dtype=float)) if wide.notna().any().any() else 1.0
    ax.set_xlim(0, top * 1.15)  # room for the labels
    ax.grid(axis="x", alpha=0.3)
    ax.title.set_fontsize(10)


def plot_tokens_per_word(counts: pd.DataFrame, rates: pd.DataFrame | None = None) -> Figure:
    """Left: tokens per word of each text, one bar per tokenizer. Middle: tokens per character.
    Right (when ``rates`` is given): the tokens/s each tokenizer counts when every language's paragraph
    is written at the same words/s (words of the English version: the same content per second).

    ``counts`` comes from ``kvlab.experiments.tokens_words.count_tokens``, ``rates`` from ``tokens_per_second``.
    """
    from kvlab.experiments.tokens_words import by_text

    toks = list(dict.fromkeys(counts["tokenizer"]))
    colors = [TOKENIZER_COLORS[i % len(TOKENIZER_COLORS)] for i in range(len(toks))]
    panels = 3 if rates is not None else 2
    fig = Figure(figsize=(5.0 * panels, 5.2), layout="constrained")
    axes = fig.subplots(1, panels, sharey=False)
    _bars(axes[0], by_text(counts, "tokens_per_word"), colors, ".1f")
    axes[0].set(xlabel="tokens per word", title="Tokens per word (words: what spaces separate)")
    _bars(axes[1], by_text(counts, "tokens_per_char"), colors, ".2f")
    axes[1].set(xlabel="tokens per character", title="Tokens per character")
    if rates is not None:
        wps = rates.attrs.get("words_per_s")
        _bars(axes[2], by_text(rates, "tokens_per_s"), colors, ".0f")
        axes[2].set(xlabel="tokens/s", title=f"The same {wps:g} words/s of content, in tokens/s")
    axes[0].legend(fontsize=8, loc="lower right")
    return fig


PHASE_COLORS = ["#bdbdbd", "#969696", "#9467bd", "#8c564b", "#e6550d"]


def plot_cold_warm(frame: pd.DataFrame) -> Figure:
    """Left: each start-up phase, their total (first token from a stopped service) and a warm request's TTFT,
    on a log scale (seconds against milliseconds). Right: the TTFT of each serving of the same request.

    ``frame`` comes from ``kvlab.experiments.four_clocks.cold_vs_warm`` (start-up phases in its attrs).
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
    ax_phase.set(xscale="log", xlim=(1e-3, max(v for _, v in rows) * 8), xlabel="seconds (log scale)",
                 title="Cold start, phase by phase, vs a warm request")
    colors = ["#e6550d" if s == "cold" else "#1f77b4" for s in frame["start"]]
    bars = ax_runs.bar(frame["run"].astype(str), frame["ttft_s"] * 1e3, color=colors)
    ax_runs.bar_label(bars, fmt="%.1f", fontsize=7)
    ax_runs.set(xlabel="serving of the same request (0 = first after start-up)", ylabel="TTFT (ms)",
                title="Same request, served again and again")
    for ax in (ax_phase, ax_runs):
        ax.title.set_fontsize(10)
        ax.grid(axis="x" if ax is ax_phase else "y", alpha=0.3)
    return fig


__all__ = ["plot_tokens_per_word"]
