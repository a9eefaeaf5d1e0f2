"""What a batching policy delivers: throughput against the wait for the first token, and the batch-wait knob."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

POLICY_COLORS = {"static": "#2ca02c", "continuous": "#1f77b4"}


def _color(run: str, policy: str | None) -> str:
    key = policy or next((p for p in POLICY_COLORS if str(run).startswith(p)), None)
    return POLICY_COLORS.get(key, "#7f7f7f")


def plot_policy_tradeoff(table: pd.DataFrame) -> Figure:
    """Left: output tokens/s per run. Right: TTFT p50 (bar) and p95 (whisker) per run, with n.

    ``table`` is ``kvlab.lessons.l05_batching.batching.batching_table`` (or ``runs_table``): one row per run.
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
