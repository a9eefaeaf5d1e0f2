"""Notebook 05's figures: each step's batch, what a policy delivers, why batching works.

A step computes some prompt tokens (prefill, maybe a chunk) and one token for each decoding sequence; stacking
the two per step shows a policy at work: a static batch thins out as its members finish, continuous batching
keeps the batch full, chunked prefill caps the prompt part.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from kvlab.experiments.batch_scaling import BatchScaling, crossover_batch
from kvlab.lessons.common.gantt import SEGMENT_COLORS

X_AXES = ("step", "time")


def plot_batch_composition(trace: pd.DataFrame, by: str | None = None, x: str = "step",
                           max_batch_tokens: int | None = None, max_seqs: int | None = None) -> Figure:
    """Top: tokens computed per step, decode tokens (one per decoding sequence) under prompt tokens.

    Bottom: sequences in the step's batch (decoding, prefilling) and the queue length. ``trace`` is
    ``Engine.trace_frame()`` (with a ``run`` column to draw one column of panels per run with
    ``by="run"``). ``x="step"`` draws one bar per step; ``x="time"`` draws each step as wide as it
    lasted. ``max_batch_tokens`` and ``max_seqs`` draw the scheduler's limits.
    """
    if x not in X_AXES:
        raise ValueError(f"x={x!r}: choose one of {', '.join(X_AXES)}")
    if by is not None and by not in trace.columns:
        raise ValueError(f"trace has no column {by!r}; columns: {list(trace.columns)}")
    groups = list(dict.fromkeys(trace[by])) if by is not None and len(trace) else [None]
    fig = Figure(figsize=(5.2 * len(groups) + 1.2, 5.2), layout="constrained")
    axes = fig.subplots(2, len(groups), squeeze=False, sharex="col", sharey="row")
    for j, g in enumerate(groups):
        t = trace if g is None else trace[trace[by] == g]
        ax_tok, ax_seq = axes[0, j], axes[1, j]
        if x == "step":
            pos, width, align = t["step"].to_numpy(), 0.9, "center"
        else:
            pos, width, align = t["start_s"].to_numpy(), t["duration_s"].to_numpy(), "edge"
        decode = t["num_decode_seqs"].to_numpy()
        prefill = t["num_prefill_tokens"].to_numpy()
        ax_tok.bar(pos, decode, width=width, align=align, color=SEGMENT_COLORS["decode"], linewidth=0,
                   label="decode tokens (1 per decoding sequence)")
        ax_tok.bar(pos, prefill, width=width, align=align, bottom=decode, color=SEGMENT_COLORS["prefill"],
                   linewidth=0, label="prompt tokens (prefill / recompute)")
        if max_batch_tokens:
            ax_tok.axhline(max_batch_tokens, color="black", ls="--", lw=1,
                           label=f"max_batch_tokens = {max_batch_tokens}")
        ax_tok.set_title(str(g) if g is not None else "Tokens computed per step", fontsize=10)
        ax_seq.bar(pos, decode, width=width, align=align, color=SEGMENT_COLORS["decode"], linewidth=0,
                   label="decoding sequences")
        ax_seq.bar(pos, t["num_prefill_seqs"].to_numpy(), width=width, align=align, bottom=decode,
                   color=SEGMENT_COLORS["prefill"], linewidth=0, label="prefilling sequences")
        xs = pos + (np.asarray(width) if x == "time" else 0)
        ax_seq.step(xs, t["num_waiting"].to_numpy(), where="pre" if x == "time" else "mid", color="#555",
                    lw=1.2, label="waiting in the queue")
        if max_seqs:
            ax_seq.axhline(max_seqs, color="black", ls="--", lw=1, label=f"max_seqs = {max_seqs}")
        ax_tok.set_ylabel("tokens in the step" if j == 0 else "")
        ax_seq.set_ylabel("sequences" if j == 0 else "")
        ax_seq.set_xlabel("step" if x == "step" else "seconds since the run started")
        for ax in (ax_tok, ax_seq):
            ax.grid(axis="y", alpha=0.3)
            ax.set_ylim(bottom=0)
        if not len(t):
            ax_tok.text(0.5, 0.5, "no steps", transform=ax_tok.transAxes, ha="center", va="center", color="#555")
    axes[0, 0].legend(fontsize=7, loc="upper right")
    axes[1, 0].legend(fontsize=7, loc="upper right")
    return fig


POLICY_COLORS = {"static": "#2ca02c", "continuous": "#1f77b4"}


def _color(run: str, policy: str | None) -> str:
    key = policy or next((p for p in POLICY_COLORS if str(run).startswith(p)), None)
    return POLICY_COLORS.get(key or "", "#7f7f7f")  # None: no policy known, grey


def plot_policy_tradeoff(table: pd.DataFrame) -> Figure:
    """Left: output tokens/s per run. Right: TTFT p50 (bar) and p95 (whisker) per run, with n.

    ``table`` is ``kvlab.experiments.batching.batching_table`` (or ``runs_table``): one row per run.
    Higher on the left is more work done; lower on the right is a sooner first token.
    """
    fig = Figure(figsize=(11, 0.6 + 0.45 * max(len(table), 2) + 1.4), layout="constrained")
    ax_tput, ax_ttft = fig.subplots(1, 2, sharey=True)
    runs = list(table["run"])
    policies = table["policy"] if "policy" in table.columns else [None] * len(table)
    colors = [_color(r, p) for r, p in zip(runs, policies)]
    y = range(len(runs))
    bars = ax_tput.barh(y, table["output_tokens_per_s"], color=colors)
    ax_tput.bar_label(bars, fmt="%.0f", fontsize=8, padding=2)
    ax_tput.set_yticks(list(y), runs)
    ax_tput.invert_yaxis()
    ax_tput.set(xlabel="output tokens per second (whole run)", title="Throughput")
    ms = 1e3
    ax_ttft.barh(y, table["ttft_p50_s"] * ms, color=colors, alpha=0.6, label="p50")
    ax_ttft.errorbar(table["ttft_p95_s"] * ms, list(y), fmt="D", color="black", ms=5, label="p95")
    for i, row in enumerate(table.itertuples(index=False)):
        ax_ttft.annotate(f"n={row.ttft_n}", (row.ttft_p95_s * ms, i), xytext=(6, 0), textcoords="offset points",
                         va="center", fontsize=7)
    ax_ttft.set(xlabel="time to first token (ms)", title="Wait for the first token: p50 (bar), p95 (◆)")
    ax_ttft.legend(fontsize=8, loc="lower right")
    for ax in (ax_tput, ax_ttft):
        ax.title.set_fontsize(10)
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlim(left=0, right=ax.get_xlim()[1] * 1.12)
    return fig


def plot_batch_wait(table: pd.DataFrame) -> Figure:
    """The batch-wait knob: TTFT (p50, p95) and work per second of compute against ``batch_wait_s``.

    ``table`` is ``batching_table(batch_wait_runs(...))``; static runs make the curves, a
    continuous run (if present) is drawn as a dotted reference line.
    """
    static = table[table["policy"] == "static"].sort_values("batch_wait_s")
    cont = table[table["policy"] == "continuous"]
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax_ttft, ax_work = fig.subplots(1, 2)
    w = static["batch_wait_s"] * 1e3
    ax_ttft.plot(w, static["ttft_p50_s"] * 1e3, marker="o", color=POLICY_COLORS["static"], label="static: p50")
    ax_ttft.plot(w, static["ttft_p95_s"] * 1e3, marker="D", ls="--", color=POLICY_COLORS["static"], label="static: p95")
    ax_work.plot(w, static["tokens_per_busy_s"], marker="o", color=POLICY_COLORS["static"],
                 label="static: tokens per second of compute")
    ax_batch = ax_work.twinx()
    ax_batch.plot(w, static["mean_batch"], marker="s", ls=":", color="#555", label="static: sequences per step")
    ax_batch.set_ylabel("mean sequences per step", color="#555")
    ax_batch.set_ylim(bottom=0)
    if len(cont):
        c = cont.iloc[0]
        ax_ttft.axhline(c["ttft_p50_s"] * 1e3, color=POLICY_COLORS["continuous"], ls=":", label="continuous: p50")
        ax_ttft.axhline(c["ttft_p95_s"] * 1e3, color=POLICY_COLORS["continuous"], ls="-.", label="continuous: p95")
        ax_work.axhline(c["tokens_per_busy_s"], color=POLICY_COLORS["continuous"], ls=":", label="continuous")
    ax_ttft.set(xlabel="batch_wait_s: longest wait for a fuller batch (ms)", ylabel="time to first token (ms)",
                title=f"Wait for the first token (n = {int(static['ttft_n'].iloc[0]) if len(static) else 0} per run)")
    ax_work.set(xlabel="batch_wait_s (ms)", ylabel="output tokens per second of compute",
                title="Work done per second the model is busy")
    for ax in (ax_ttft, ax_work):
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, loc="lower right")
    return fig


MEASURED, MEMORY, COMPUTE = "#1f77b4", "#2ca02c", "#d62728"
WAYS = {"one by one": "#7f7f7f", "batched": "#1f77b4"}


def plot_batch_scaling(result: BatchScaling) -> Figure:
    """Four panels from ``batch_scaling``'s result.

    1. Decode step time (median, band p25-p75, n steps per size) against batch size, over the memory floor
       (bytes a step reads / measured bandwidth) and the compute floor (its arithmetic / measured matrix speed);
       the dotted vertical line is where the floors cross.
    2. Time per sequence (step time / batch): what batching buys.
    3. Achieved GB/s (bytes a step reads / its time) beside the bandwidth measured in the same run.
    4. Prefill of several prompts, one by one vs batched: until all have a first token, the mean, the first's.
    """
    d, m = result.decode, result.machine
    fig = Figure(figsize=(12, 7.4), layout="constrained")
    (ax_step, ax_seq), (ax_bw, ax_pre) = fig.subplots(2, 2)
    b = d["batch"].to_numpy()
    ms = 1e3

    ax_step.fill_between(b, d["step_p25_s"] * ms, d["step_p75_s"] * ms, color=MEASURED, alpha=0.2, lw=0)
    ax_step.plot(b, d["step_s"] * ms, marker="o", color=MEASURED, label=f"measured step (median, n = {d['n'].iloc[0]} "
                                                                         "per size; band p25-p75)")
    ax_step.plot(b, d["memory_floor_s"] * ms, ls="--", color=MEMORY,
                 label=f"memory floor: bytes read / {m['bandwidth_GBps']:.0f} GB/s")
    ax_step.plot(b, d["compute_floor_s"] * ms, ls=":", lw=2, color=COMPUTE,
                 label=f"compute floor: 2 × weights × batch / {m['matmul_GFLOPs']:.0f} GFLOP/s")
    cross = crossover_batch(result)
    if b.min() <= cross <= b.max():
        ax_step.axvline(cross, color="#555", ls=":", lw=1)
        ax_step.annotate(f"floors cross\nnear batch {cross:.0f}", (cross, 0.02), xycoords=("data", "axes fraction"),
                         xytext=(4, 0), textcoords="offset points", fontsize=7, color="#555")
    ax_step.set(title="One decode step vs batch size", ylabel="ms per step")

    ax_seq.plot(b, d["per_seq_s"] * ms, marker="o", color=MEASURED, label="measured: step / batch")
    ax_seq.plot(b, np.maximum(d["memory_floor_s"], d["compute_floor_s"]) / b * ms, ls="--", color="#555",
                label="the larger floor / batch")
    ax_seq.set(title="Time per sequence: the price of one token", ylabel="ms per sequence per step")

    ax_bw.plot(b, d["achieved_GBps"], marker="o", color=MEASURED, label="achieved: bytes read / step time")
    for key, ls, name in (("matvec_GBps", "--", "matrix-vector"), ("sum_read_GBps", ":", "sum"),
                          ("copy_GBps", "-.", "copy")):
        ax_bw.axhline(m[key], color=MEMORY, ls=ls, lw=1.2, label=f"this machine, {name}: {m[key]:.1f} GB/s")
    ax_bw.set(title=f"Bandwidth: weights {d['weight_bytes'].iloc[0] / 2**20:.1f} MiB per step (+ K/V)",
              ylabel="GB/s")
    ax_bw.set_ylim(0, 1.15 * max(d["achieved_GBps"].max(), m["matvec_GBps"], m["sum_read_GBps"], m["copy_GBps"]))

    for ax in (ax_step, ax_seq, ax_bw):
        ax.set_xscale("log", base=2)
        ax.set_xticks(b, [str(x) for x in b])
        ax.set_xlabel("batch size (sequences decoded together)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper left" if ax is ax_step else "best")
        ax.title.set_fontsize(10)
    for ax in (ax_step, ax_seq):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))  # 0.1, not 10^-1

    p = result.prefill.set_index("way")
    measures = (("all_first_s", "all prompts have\na first token"), ("mean_ttft_s", "mean time to\nfirst token"),
                ("first_ttft_s", "the first prompt's\nfirst token"))
    x = np.arange(len(measures))
    width = 0.38
    for i, (way, color) in enumerate(WAYS.items()):
        if way not in p.index:
            continue
        vals = [p.loc[way, k] * ms for k, _ in measures]
        bars = ax_pre.bar(x + (i - 0.5) * width, vals, width, color=color, label=way)
        ax_pre.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
    row = result.prefill.iloc[0]
    ax_pre.set_xticks(x, [label for _, label in measures], fontsize=8)
    ax_pre.set(title=f"Prefill: {row['prompts']} prompts of {row['prompt_tokens']} tokens (medians of "
                     f"{row['n']} runs)", ylabel="ms")
    ax_pre.title.set_fontsize(10)
    ax_pre.legend(fontsize=8)
    ax_pre.grid(axis="y", alpha=0.3)
    return fig


__all__ = ["plot_batch_scaling"]
