"""Figures of prefix caching on a replayed trace: hit ratio against KV capacity, and caching on vs off."""
from __future__ import annotations

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


__all__ = ["ON_OFF_COLORS", "plot_prefix_cache"]
