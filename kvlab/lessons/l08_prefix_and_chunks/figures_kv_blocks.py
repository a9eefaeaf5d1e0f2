"""KV blocks over time: how much of the memory budget sequences hold, what the prefix cache keeps, what is free.

The pool has a fixed number of blocks (the budget). After each step the engine's trace records
blocks used by sequences, free blocks still holding a cached prefix, and free blocks. The tokens
actually held, divided by the block size, sit a little under the used blocks: the gap is the
unfilled tail of each sequence's last block (in-block waste). A preemption is marked where it
happened: the budget ran out.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

COLORS = {"used": "#1f77b4", "cached": "#2ca02c", "free": "#eeeeee"}


def plot_kv_blocks(trace: pd.DataFrame, by: str | None = None, block_size: int | None = None,
                   title: str | None = None) -> Figure:
    """Stacked blocks used / cached / free after every step, against time, with the budget line.

    ``trace`` is ``Engine.trace_frame()``; ``by="run"`` draws one panel per run (same y scale).
    With ``block_size`` a line shows the tokens held in blocks' worth. Red triangles mark steps that
    preempted sequences.
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
        ax.set_xlim(0, x[-1])
        ax.set_ylim(0, total * 1.08)
        ax.set_xlabel("seconds since the run started")
        ax.set_title(str(g) if g is not None else (title or "KV blocks in use"), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right", framealpha=0.9)
    axes[0].set_ylabel("KV blocks")
    if title and groups != [None]:
        fig.suptitle(title, fontsize=10)
    return fig
