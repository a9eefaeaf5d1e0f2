"""Notebook 08's figures: prefix hits against KV capacity, KV blocks over time, the gaps between tokens.

Figures of prefix caching on a replayed trace: hit ratio against KV capacity, and caching on vs off.

KV blocks over time: how much of the memory budget sequences hold, what the prefix cache keeps, what is free.

The pool has a fixed number of blocks (the budget). After each step the engine's trace records blocks used by sequences,
free blocks still holding a cached prefix, and free blocks. The tokens actually held, divided by the block size, sit a
little under the used blocks: the gap is the unfilled tail of each sequence's last block (in-block waste). A preemption
is marked where it happened: the budget ran out.

Time between tokens, as it happens: every gap of every request against the moment it ended.

A steady stream is a flat band of dots; a step that did much more work than the others (a long
prompt computed in one go) shows as a spike shared by every request that was decoding then.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

ON_OFF_COLORS = {True: "#2ca02c", False: "#d62728"}  # caching on: green; off: red, the baseline that recomputes


def plot_prefix_cache(curve: pd.DataFrame, on_off: pd.DataFrame | None = None, title: str | None = None) -> Figure:
    """Left: the engine's prefix-cache hit ratio against its KV capacity, under the ideal ones.

    ``curve`` is ``capacity_curve`` output: the engine's share of prompt tokens (solid) and of
    prompt blocks (dashed, the engine's blocks) found in the cache, per KV capacity in tokens (log
    scale); grey lines: the ideal (every block ever seen kept) in tokens and in the trace's blocks,
    and, where it differs, the ideal at the engine's block size (dotted). With ``on_off`` (``caching_on_off`` output) two more panels: time to first token p50 /
    p95 / p99 with n, and prompt tokens computed against the prompt tokens sent.
    """
    panels = 3 if on_off is not None else 1
    fig = Figure(figsize=(5.2 * panels, 4.4), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False)[0]
    ax = axes[0]
    c = curve.sort_values("kv_tokens")
    x = c["kv_tokens"]
    ax.plot(x, 100 * c["token_hit_ratio"], "-o", color=ON_OFF_COLORS[True], ms=4, lw=1.8, label="engine: tokens")
    ax.plot(x, 100 * c["block_hit_ratio"], "--", color=ON_OFF_COLORS[True], lw=1.2, label="engine: blocks")
    ideal = float(c["ideal_token_hit_ratio"].iloc[0])
    ideal_blocks = float(c["ideal_block_hit_ratio"].iloc[0])
    reach = float(c["reachable_token_hit_ratio"].iloc[0])
    ax.axhline(100 * ideal, color="#555", lw=1.2, label=f"ideal (every block kept): tokens {ideal:.0%}")
    ax.axhline(100 * ideal_blocks, color="#555", ls="--", lw=1, label=f"ideal: the trace's blocks {ideal_blocks:.0%}")
    if abs(reach - ideal) > 1e-9:
        ax.axhline(100 * reach, color="#999", ls=":", lw=1.2, label=f"ideal, engine blocks: {reach:.0%}")
    if "kv_share_of_footprint" in c:
        full = c[c["kv_share_of_footprint"] >= 1]
        if len(full):
            ax.axvline(float(full["kv_tokens"].iloc[0]), color="#bbb", ls="-.", lw=1)
            ax.annotate("holds the whole trace", (float(full["kv_tokens"].iloc[0]), 5), fontsize=8, color="#777",
                        ha="right", xytext=(-4, 0), textcoords="offset points")
    ax.set(xscale="log", xlabel="KV capacity (tokens, log scale)", ylabel="% of prompt reused from the cache",
           title=f"Prefix-cache hits vs KV memory ({int(c['requests'].iloc[0])} requests)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8, loc="upper left")
    if on_off is not None:
        _plot_on_off(on_off, axes[1], axes[2])
    for a in axes:
        a.grid(alpha=0.3)
        a.title.set_fontsize(10)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _plot_on_off(frame: pd.DataFrame, ax_ttft, ax_work) -> None:
    qs = [q for q in ("p50", "p95", "p99") if f"ttft_{q}_s" in frame]
    width = 0.8 / len(frame)
    for i, row in enumerate(frame.itertuples(index=False)):
        on = bool(row.prefix_caching)
        label = f"caching {'on' if on else 'off'}"
        xs = [j + (i - (len(frame) - 1) / 2) * width for j in range(len(qs))]
        values = [getattr(row, f"ttft_{q}_s") for q in qs]
        ax_ttft.bar(xs, values, width, color=ON_OFF_COLORS[on], label=f"{label} (n={row.ttft_n})")
        for x_, v in zip(xs, values):
            ax_ttft.annotate(f"{v:.2g}", (x_, v), ha="center", va="bottom", fontsize=8)
        ax_work.bar(i, row.prefill_tokens_computed, 0.6, color=ON_OFF_COLORS[on])
        ax_work.annotate(f"{row.prefill_tokens_computed:,}\n{row.achieved_output_tokens_per_s:.1f} out tok/s",
                         (i, row.prefill_tokens_computed), ha="center", va="bottom", fontsize=8)
    rate = float(frame["sent_rps"].iloc[0])
    ax_ttft.set_xticks(range(len(qs)), qs)
    ax_ttft.set(title=f"Time to first token at {rate:.3g} requests/s", ylabel="seconds")
    ax_ttft.legend(fontsize=8)
    sent = int(frame["prompt_tokens"].iloc[0])
    ax_work.axhline(sent, color="#555", lw=1, ls="--", label=f"prompt tokens sent: {sent:,}")
    ax_work.set_xticks(range(len(frame)), [f"caching {'on' if on else 'off'}" for on in frame["prefix_caching"]])
    ax_work.set(title="Prompt tokens computed (and throughput)", ylabel="tokens")
    ax_work.set_ylim(top=max(sent, int(frame["prefill_tokens_computed"].max())) * 1.25)
    ax_work.legend(fontsize=8, loc="upper left")


COLORS = {"used": "#1f77b4", "cached": "#2ca02c", "free": "#eeeeee"}


def plot_kv_blocks(trace: pd.DataFrame, by: str | None = None, block_size: int | None = None,
                   title: str | None = None) -> Figure:
    """Stacked blocks used / cached / free after every step, against time, with the budget line.

    ``trace`` is ``Engine.trace_frame()``; ``by="run"`` draws one panel per run (same y scale). With ``block_size`` a
    line shows the tokens held in blocks' worth. Red triangles mark steps that preempted sequences.
    """
    if by is not None and by not in trace.columns:
        raise ValueError(f"trace has no column {by!r}; columns: {list(trace.columns)}")
    groups = list(dict.fromkeys(trace[by])) if by is not None and len(trace) else [None]
    fig = Figure(figsize=(5.2 * len(groups) + 1.5, 3.8), layout="constrained")
    axes = fig.subplots(1, len(groups), squeeze=False)[0]  # own y axis each: budgets may differ
    for ax, g in zip(axes, groups):
        t = trace if g is None else trace[trace[by] == g]
        if not len(t):
            ax.text(0.5, 0.5, "no steps", transform=ax.transAxes, ha="center", va="center", color="#555")
            ax.set(xlabel="seconds since the run started", ylabel="KV blocks")
            continue
        total = int(t["kv_blocks_used"].iloc[0] + t["kv_blocks_free"].iloc[0])
        x = np.concatenate([[0.0], t["end_s"].to_numpy()])
        used = np.concatenate([[0], t["kv_blocks_used"].to_numpy()])
        cached = np.concatenate([[0], t["kv_blocks_cached"].to_numpy()])
        free = total - used - cached
        ax.stackplot(x, used, cached, free, step="post", colors=[COLORS["used"], COLORS["cached"], COLORS["free"]],
                     labels=["used by sequences", "free, holding a cached prefix", "free"])
        ax.axhline(total, color="black", ls="--", lw=1.2, label=f"budget: {total} blocks")
        if block_size:
            held = np.concatenate([[0], t["kv_tokens_held"].to_numpy()]) / block_size
            ax.step(x, held, where="post", color="#08306b", lw=1, label="tokens held ÷ block size")
        pre = t[t["num_preempted"] > 0]
        if len(pre):
            ax.scatter(pre["end_s"], [total * 1.03] * len(pre), marker="v", color="#d62728", s=30, zorder=4,
                       label=f"preemption ({int(pre['num_preempted'].sum())} in all)")
        ax.set(xlim=(0, x[-1]), ylim=(0, total * 1.08), xlabel="seconds since the run started")
        ax.set_title(str(g) if g is not None else (title or "KV blocks in use"), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    axes[0].set_ylabel("KV blocks")
    if title and groups != [None]:
        fig.suptitle(title, fontsize=10)
    return fig


def plot_token_gaps(requests: pd.DataFrame, by: str | None = "run", exclude: Iterable = (),
                    marks: dict[str, float] | None = None, title: str | None = None) -> Figure:
    """Gap before each token (ms) vs when it arrived, one panel per ``by`` value (shared y axis).

    ``requests`` is a requests frame with ``token_s`` (``ServingRun.requests``); requests whose id
    is in ``exclude`` are left out (e.g. the long prompt itself); ``marks`` draws labelled vertical
    lines (e.g. {"long prompt arrives": 0.08}). Each panel's largest gap is labelled.
    """
    if "token_s" not in requests.columns:
        raise ValueError("requests need a token_s column (ServingRun.requests keeps every token's stamp)")
    exclude = set(exclude)
    groups = list(dict.fromkeys(requests[by])) if by is not None and len(requests) else [None]
    fig = Figure(figsize=(5.2 * len(groups) + 1, 3.6), layout="constrained")
    axes = fig.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    for ax, g in zip(axes, groups):
        sub = requests if g is None else requests[requests[by] == g]
        worst = (0.0, np.nan)
        for row in sub.itertuples(index=False):
            if row.request_id in exclude:
                continue
            t = np.asarray(row.token_s, dtype=float)
            if len(t) < 2:
                continue
            gaps = np.diff(t) * 1e3
            ax.plot(t[1:], gaps, marker=".", ms=4, ls="", alpha=0.7, label=f"req {row.request_id}")
            i = int(np.argmax(gaps))
            if gaps[i] > worst[0]:
                worst = (float(gaps[i]), float(t[1:][i]))
        for label, x in (marks or {}).items():
            ax.axvline(x, color="#555", ls=":", lw=1)
            ax.annotate(label, (x, 1), xycoords=("data", "axes fraction"), xytext=(3, -3),
                        textcoords="offset points", va="top", fontsize=7, color="#555", rotation=90)
        if worst[0] > 0:
            ax.annotate(f"largest gap {worst[0]:,.0f} ms", (worst[1], worst[0]), xytext=(6, -2),
                        textcoords="offset points", fontsize=8, color="#d62728")
        ax.set(xlabel="seconds since the run started", title=str(g) if g is not None else (title or ""))
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if not ax.lines:
            ax.text(0.5, 0.5, "no gaps (fewer than 2 tokens)", transform=ax.transAxes, ha="center", va="center",
                    color="#555")
    axes[0].set_ylabel("gap before the token (ms)\n(one dot per token)")
    if title and groups != [None]:
        fig.suptitle(title, fontsize=10)
    return fig


__all__ = ["ON_OFF_COLORS", "plot_prefix_cache"]
