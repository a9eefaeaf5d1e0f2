"""Offloading under load, drawn: step times and times between tokens, on the device vs offloaded, as distributions."""
from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from .offload_load import OFFLOADED, ON_DEVICE, OffloadUnderLoad, paired_steps, spread_stats
from ..common.figure_style import cache_color

RUN_COLORS = {ON_DEVICE: cache_color("dynamic"), OFFLOADED: cache_color("offloaded")}
PLAIN = FuncFormatter(lambda v, _: f"{v:g}")  # 20, not 2 x 10^1, on a log axis


def _log_ms(ax: Axes) -> None:
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(PLAIN)
    ax.yaxis.set_minor_formatter(PLAIN)
    ax.tick_params(axis="y", which="minor", labelsize=7)


def _sorted(ax: Axes, values_s, label: str, color: str) -> None:
    """Every value sorted (x: share of values at most this long), with p50 and p95 marked and n, IQR in the label."""
    v = np.sort(np.asarray(values_s, dtype=float)) * 1e3
    q = spread_stats(v)
    share = np.arange(1, len(v) + 1) / len(v) * 100
    ax.plot(share, v, color=color, lw=1.6,
            label=f"{label}: n = {q['n']}, p50 {q['p50']:.1f}, p95 {q['p95']:.1f}, IQR {q['iqr']:.1f} ms")
    ax.axhspan(q["p25"], q["p75"], xmin=0.0, xmax=0.03, color=color, alpha=0.5)  # the IQR, on the left edge
    for p, marker in ((50, "o"), (95, "D")):
        ax.plot(p, q[f"p{p}"], marker=marker, color=color, ms=5)


def plot_offload_under_load(result: OffloadUnderLoad) -> Figure:
    """Three panels from ``offload_under_load``.

    1. Step times of both runs, each sorted from fastest to slowest (● p50, ◆ p95; the bar on the left edge
       spans p25-p75, the IQR); the legend gives n, p50, p95 and IQR.
    2. Times between tokens (TBT), the same way.
    3. The same steps in both runs against the bytes the offloaded pool moved in them, with the on-device
       time plus bytes / link rate (the least the link adds) for reference.
    """
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    ax_step, ax_tbt, ax_bytes = fig.subplots(1, 3)
    for run, color in RUN_COLORS.items():
        _sorted(ax_step, result.steps.loc[result.steps["run"] == run, "duration_s"], run, color)
        _sorted(ax_tbt, result.gaps.loc[result.gaps["run"] == run, "gap_s"], run, color)
    for ax, what in ((ax_step, "Step time"), (ax_tbt, "Time between tokens")):
        ax.set(title=f"{what}, fastest to slowest", xlabel="share of values at most this long (%)", ylabel="ms")
        _log_ms(ax)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper left")
        ax.title.set_fontsize(10)

    p = paired_steps(result)
    mib = p["bytes_moved"] / 2**20
    ax_bytes.scatter(mib, p["on_device_s"] * 1e3, s=10, color=RUN_COLORS[ON_DEVICE], label=ON_DEVICE)
    ax_bytes.scatter(mib, p["offloaded_s"] * 1e3, s=10, color=RUN_COLORS[OFFLOADED], label=OFFLOADED)
    rate = result.settings.get("link_gbps")
    if rate:
        order = np.argsort(mib.to_numpy())
        floor = (np.median(p["on_device_s"]) + p["bytes_moved"].to_numpy() / (rate * 1e9)) * 1e3
        ax_bytes.plot(mib.to_numpy()[order], floor[order], color="black", ls="--", lw=1,
                      label=f"on-device median + bytes / {rate:g} GB/s")
    ax_bytes.set(title=f"The same {len(p)} steps in both runs", xlabel="MiB the offloaded pool moved in the step",
                 ylabel="ms per step")
    _log_ms(ax_bytes)
    ax_bytes.grid(alpha=0.3, which="both")
    ax_bytes.legend(fontsize=7, loc="upper left")
    ax_bytes.title.set_fontsize(10)
    return fig


__all__ = ["plot_offload_under_load"]
