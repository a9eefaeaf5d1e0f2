"""What each step's batch held: prompt tokens vs decoding sequences, step by step.

A step computes some prompt tokens (prefill, maybe a chunk) and one token for each decoding
sequence. Stacking the two per step shows a policy at work: a static batch thins out as its
members finish, continuous batching keeps the batch full, chunked prefill caps the prompt part.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..common.gantt import SEGMENT_COLORS

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
