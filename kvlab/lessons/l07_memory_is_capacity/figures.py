"""Figures of KV capacity: sequences that fit a budget and where its tokens go, block size, and the capacity levers."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

PARTS = (  # column, label, colour, hatch
    ("tokens_held", "K/V of real tokens", "#1f77b4", None),
    ("in_block_waste_tokens", "in-block waste (unfilled last blocks)", "#ff7f0e", None),
    ("reserved_unused_tokens", "reserved, never used", "#d62728", "//"),
    ("free_tokens", "free", "#eeeeee", None),
)
SCHEME_COLORS = {"reserve max length": "#d62728", "paged blocks": "#1f77b4"}


def plot_paged_vs_reserved(table: pd.DataFrame) -> Figure:
    """Left: sequences that fit the same budget per scheme. Right: where the budget's token slots go.

    ``table`` comes from ``kvlab.experiments.capacity.paged_vs_reserved``.
    """
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    ax_fit, ax_parts = fig.subplots(1, 2, width_ratios=[1, 2])
    names = list(table["scheme"])
    bars = ax_fit.bar(names, table["sequences_fit"], color=[SCHEME_COLORS.get(n, "#7f7f7f") for n in names])
    ax_fit.bar_label(bars, fontsize=9)
    ax_fit.set(ylabel="sequences that fit", title="Sequences held at once, same budget")
    y = np.arange(len(names))
    left = np.zeros(len(names))
    for col, label, color, hatch in PARTS:
        values = table[col].to_numpy(dtype=float)
        ax_parts.barh(y, values, left=left, color=color, hatch=hatch, edgecolor="white" if hatch is None else "#7f0000",
                      label=label)
        left += values
    for i, row in enumerate(table.itertuples(index=False)):
        ax_parts.text(left[i] * 1.01, i, f" waste {row.waste_share:.0%}", va="center", fontsize=9)
    ax_parts.set_yticks(y, names)
    ax_parts.invert_yaxis()
    ax_parts.set_xlim(0, left.max() * 1.18)
    ax_parts.set(xlabel="token slots of the budget", title="Where the budget goes (waste = share of the slots taken)")
    ax_parts.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, frameon=False)
    for ax in (ax_fit, ax_parts):
        ax.title.set_fontsize(10)
        ax.grid(axis="x" if ax is ax_parts else "y", alpha=0.3)
    return fig


def plot_block_size(table: pd.DataFrame) -> Figure:
    """Left: in-block waste per sequence vs block size, measured and the (block_size - 1) / 2 rule.

    Right: sequences that fit the budget.

    ``table`` comes from ``kvlab.experiments.capacity.block_size_table``.
    """
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    ax_waste, ax_fit = fig.subplots(1, 2)
    bs = table["block_size"]
    ax_waste.plot(bs, table["waste_per_sequence"], marker="o", color="#ff7f0e", label="measured on the workload")
    ax_waste.plot(bs, table["rule_of_thumb"], ls="--", color="black", label="(block_size − 1) / 2")
    ax_waste.set(xscale="log", xlabel="block size (tokens)", ylabel="wasted slots per sequence",
                 title="Unfilled tail of the last block")
    ax_fit.plot(bs, table["sequences_fit"], marker="o", color="#1f77b4")
    ax_fit.set(xscale="log", xlabel="block size (tokens)", ylabel="sequences that fit",
               title="Sequences held at once, same budget")
    for ax in (ax_waste, ax_fit):
        ax.set_xticks(list(bs), [str(b) for b in bs])
        ax.minorticks_off()
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_waste.legend(fontsize=8)
    return fig


def plot_capacity_levers(table: pd.DataFrame) -> Figure:
    """One panel per max context: sequences that fit vs max new tokens, reserved vs paged, with the worst case.

    ``table`` comes from ``kvlab.experiments.capacity.capacity_levers``.
    """
    contexts = list(dict.fromkeys(table["max_model_len"]))
    fig = Figure(figsize=(4 * max(len(contexts), 1) + 1, 3.6), layout="constrained")
    axes = fig.subplots(1, max(len(contexts), 1), sharey=True, squeeze=False)[0]
    for ax, C in zip(axes, contexts):
        t = table[table["max_model_len"] == C]
        ax.plot(t["max_new_tokens"], t["paged_fit"], marker="o", color=SCHEME_COLORS["paged blocks"],
                label="paged: blocks for tokens reached")
        ax.plot(t["max_new_tokens"], t["reserved_fit"], marker="s", color=SCHEME_COLORS["reserve max length"],
                label="reserved: prompt + max new tokens")
        ax.plot(t["max_new_tokens"], t["worst_case_fit"], ls="--", color="black", label="every request at full context")
        ax.set(xscale="log", xlabel="max new tokens", title=f"max context {C} tokens")
        ax.set_xticks(list(t["max_new_tokens"]), [str(m) for m in t["max_new_tokens"]])
        ax.minorticks_off()
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].set_ylabel("sequences that fit")
    axes[0].legend(fontsize=7, loc="lower left")
    return fig
