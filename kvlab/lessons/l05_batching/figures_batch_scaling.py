"""Why batching works, drawn: decode step time against batch size over the machine's two floors, and batched prefill."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .batch_scaling import BatchScaling, crossover_batch

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
