"""Figures of KV cache memory: measured bytes against the formula, and the calculator for real models."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from kvlab.lessons.common.figure_style import cache_color


def plot_cache_memory(frame: pd.DataFrame) -> Figure:
    """Left: each cache's allocated bytes as tokens are stored, over the formula (dashed).

    Right: where the bytes are after the last step, per cache: holding tokens, reserved but empty,
    and kept in the slower tier (offloaded). ``frame`` comes from ``measure_cache_memory``.
    """
    measured = frame.dropna(subset=["tokens"])
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_grow, ax_split = fig.subplots(1, 2)
    if len(measured):
        first = measured[measured["cache"] == measured["cache"].iloc[0]]
        ax_grow.plot(first["tokens"], first["formula_bytes"] / 1024, color="black", ls="--", lw=2.5,
                     label="formula: 2 × layers × kv_heads × head_dim × tokens × bytes", zorder=3)
    for cache, rows in measured.groupby("cache", sort=False):
        ax_grow.plot(rows["tokens"], rows["allocated_bytes"] / 1024, color=cache_color(cache), lw=1.5,
                     marker=".", ms=3, label=f"{cache}: allocated")
    ax_grow.set(title="Cache memory as tokens are stored", xlabel="tokens in the cache", ylabel="KiB allocated")
    ax_grow.set_ylim(bottom=0)
    ax_grow.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)  # below: lines stay visible
    last = measured.groupby("cache", sort=False).tail(1)
    names = list(last["cache"])
    used = (last["used_bytes"] / 1024).astype(float).to_numpy()
    reserved = (last["reserved_bytes"] / 1024).astype(float).to_numpy()
    offloaded = (last["offloaded_bytes"] / 1024).astype(float).to_numpy()
    on_device = (last["device_bytes"] / 1024).astype(float).to_numpy()
    ax_split.bar(names, on_device, color=[cache_color(c) for c in names], label="on the compute device")
    ax_split.bar(names, offloaded, bottom=on_device, color="white", edgecolor=[cache_color(c) for c in names],
                 hatch="//", label="in the slower tier (offloaded)")
    ax_split.scatter(names, used, marker="_", s=600, color="black", zorder=3, label="bytes holding tokens")
    for i, r in enumerate(reserved):
        if r > 0:
            ax_split.annotate(f"{_kib(r)} reserved,\nnot holding tokens", (i, used[i]), textcoords="offset points",
                              xytext=(0, -28), ha="center", fontsize=7)
    ax_split.set(title=f"Where the bytes are after {int(last['tokens'].max()) if len(last) else 0} tokens",
                 ylabel="KiB")
    ax_split.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=2)
    missing = frame[frame["tokens"].isna()]
    if len(missing):
        fig.text(0.01, -0.02, "not measured: " + "; ".join(f"{c}" for c in missing["cache"]), fontsize=8)
    for ax in (ax_grow, ax_split):
        ax.grid(alpha=0.3)
    a = frame.attrs
    if a:
        fig.suptitle(f"{a.get('model')} at {a.get('bytes_per_element')} bytes per element, batch 1", fontsize=10)
    return fig


def _kib(kib: float) -> str:
    return f"{kib:,.0f} KiB" if kib >= 10 else f"{kib * 1024:,.0f} bytes"


def _gib_label(x: float, _pos=None) -> str:
    if x >= 1:
        return f"{x:,.0f} GiB"
    if x >= 1e-3:
        return f"{x:g} GiB"
    return f"{x * 1024:.3g} MiB"


def plot_kv_memory(table: pd.DataFrame, context: int | None = None, batch: int | None = None) -> Figure:
    """KV cache size vs context length, one line per batch size (log-log), for one model shape.

    With ``gpu_gib`` in the table (from ``kv_memory_table``), a horizontal line marks the memory
    left for the cache once the weights are loaded; ``context`` and ``batch`` mark one point.
    """
    a = table.attrs
    fig = Figure(figsize=(9, 4.6), layout="constrained")
    ax = fig.subplots()
    for b, rows in table.groupby("batch"):
        chosen = batch is not None and b == batch
        ax.plot(rows["context"], rows["kv_gib"], marker="o", ms=3, lw=2.5 if chosen else 1.2,
                label=f"batch {b}", alpha=1 if chosen else 0.75)
    gpu = table["gpu_gib"].iloc[0] if "gpu_gib" in table else None
    if gpu is not None:
        room = gpu - table["weights_gib"].iloc[0]
        ax.axhline(room, color="black", ls="--", lw=1.2)
        ax.text(table["context"].min(), room * 1.15,
                f"room for the cache: {gpu:g} GiB GPU − {table['weights_gib'].iloc[0]:.1f} GiB of weights",
                fontsize=8)
    if context is not None and batch is not None:
        row = table[(table["context"] == context) & (table["batch"] == batch)]
        if len(row):
            y = float(row["kv_gib"].iloc[0])
            ax.scatter([context], [y], s=120, facecolor="none", edgecolor="black", lw=2, zorder=4)
            ax.annotate(_gib_label(y), (context, y), textcoords="offset points", xytext=(8, -14), fontsize=9)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(_gib_label))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _p: f"{x / 1024:g}K" if x >= 1024 else f"{x:g}"))
    ax.set(xlabel="context length (tokens per sequence)", ylabel="KV cache size",
           title=f"{a.get('model', '')}: {a.get('num_layers')} layers × {a.get('num_kv_heads')} KV heads × "
                 f"{a.get('head_dim')} head_dim → {a.get('kv_bytes_per_token', 0) / 1024:,.0f} KiB per token")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left")
    return fig
