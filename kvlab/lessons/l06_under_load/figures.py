"""Figures of a service under load: the service curve with its knee, and the A/B trade-off."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch

PROFILE_COLORS = {"short_short": "#1f77b4", "long_short": "#ff7f0e", "long_gen": "#2ca02c", "mixture": "#9467bd"}
_FALLBACK = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#d62728")


def _curves(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str, str]]:
    """(label, rows sorted by load, colour, line style) per curve: profiles by colour, 'source' by style."""
    keys = [k for k in ("profile", "policy") if k in frame and frame[k].nunique() > 1] or \
           [k for k in ("profile",) if k in frame]
    style_key = "source" if "source" in frame and frame["source"].nunique() > 1 else None
    groups = frame.groupby(keys + ([style_key] if style_key else []), sort=False) if keys or style_key else \
        [((), frame)]
    out: list[tuple[str, pd.DataFrame, str, str]] = []
    colors: dict[tuple, str] = {}
    for key, curve in groups:
        key = key if isinstance(key, tuple) else (key,)
        color_key = key[:len(keys)]
        if color_key not in colors:
            name = color_key[0] if color_key else ""
            colors[color_key] = PROFILE_COLORS.get(name, _FALLBACK[len(colors) % len(_FALLBACK)])
        label = " / ".join(str(k) for k in key)
        style = "--" if style_key and key[-1] == "simulated" else "-"
        out.append((label, curve.sort_values("offered_rps"), colors[color_key], style))
    return out


def _n_range(frame: pd.DataFrame, column: str) -> str:
    """The sample size behind each level's quantiles: "n = 200 per level" or "n = 157-200 per level"."""
    if column not in frame:
        return "n unknown"
    lo, hi = int(frame[column].min()), int(frame[column].max())
    return f"n = {lo} per level" if lo == hi else f"n = {lo}–{hi} per level"


def plot_service_curve(frame: pd.DataFrame, title: str | None = None) -> Figure:
    """Four panels against offered load (requests/s): TTFT p50 and p95, TPOT p50 and p95, achieved vs
    offered throughput, and the share of requests that failed. The knee (``is_knee``, from
    ``mark_knee``) is a dotted vertical line in the curve's colour; SLO targets are grey lines.

    ``frame`` is ``load_sweep`` / ``service_curve`` output: one curve per profile (and policy);
    a ``source`` column ("real" / "simulated") draws simulated curves dashed.
    """
    fig = Figure(figsize=(12, 7.5), layout="constrained")
    (ax_ttft, ax_tpot), (ax_thr, ax_fail) = fig.subplots(2, 2, sharex=True)
    rates = frame["offered_rps"].to_numpy(dtype=float)
    wide = rates.max() / rates.min() > 20  # curves of very different capacities: a log axis shows each one

    for label, c, color, style in _curves(frame):
        x = c["offered_rps"].to_numpy()
        ax_ttft.plot(x, c["ttft_p95_s"], style, color=color, marker="o", ms=3, lw=1.8, label=f"{label}: p95")
        ax_ttft.plot(x, c["ttft_p50_s"], style, color=color, lw=1, alpha=0.6)
        ax_tpot.plot(x, c["tpot_p95_s"], style, color=color, marker="o", ms=3, lw=1.8, label=f"{label}: p95")
        ax_tpot.plot(x, c["tpot_p50_s"], style, color=color, lw=1, alpha=0.6)
        ax_thr.plot(x, c["achieved_rps"], style, color=color, marker="o", ms=3, lw=1.8, label=label)
        ax_fail.plot(x, 100 * c["failure_rate"], style, color=color, marker="o", ms=3, lw=1.8, label=label)
        if "is_knee" in c and c["is_knee"].any():
            knee = float(c.loc[c["is_knee"], "offered_rps"].iloc[0])
            for ax in (ax_ttft, ax_tpot, ax_thr, ax_fail):
                ax.axvline(knee, color=color, ls=":", lw=1.3)
            ax_ttft.annotate(f"knee {knee:.3g}/s", (knee, float(c.loc[c["is_knee"], "ttft_p95_s"].iloc[0])),
                             textcoords="offset points", xytext=(4, 6), fontsize=8, color=color)
    top = float(np.nanmax(frame["offered_rps"])) * 1.05
    low = float(np.nanmin(frame["offered_rps"])) * 0.9
    ax_thr.plot([low, top], [low, top], color="#999", ls="--", lw=1, label="achieved = offered")
    for col, ax in (("slo_ttft_s", ax_ttft), ("slo_tpot_s", ax_tpot)):
        if col in frame and frame[col].notna().any():
            ax.axhline(float(frame[col].iloc[0]), color="#555", ls="-.", lw=1, label=f"SLO {frame[col].iloc[0]:g} s")
    ax_ttft.set(title=f"Time to first token (thick: p95, thin: p50; {_n_range(frame, 'ttft_n')})",
                ylabel="seconds (log scale)", yscale="log")
    ax_tpot.set(title=f"Time per output token, per request (thick: p95, thin: p50; {_n_range(frame, 'tpot_n')})",
                ylabel="seconds (log scale)", yscale="log")
    ax_thr.set(title="Throughput: achieved vs offered", ylabel="completed requests / s",
               xlabel="offered load (requests / s)" + (", log scale" if wide else ""))
    ax_fail.set(title="Failed requests (rejected: queue full, prompt too long)", ylabel="% of requests sent",
                xlabel="offered load (requests / s)" + (", log scale" if wide else ""))
    ax_fail.set_ylim(bottom=0, top=max(5.0, float(np.nanmax(100 * frame["failure_rate"])) * 1.15))
    for ax in (ax_ttft, ax_tpot, ax_thr, ax_fail):
        ax.grid(alpha=0.3)
        if wide:
            ax.set_xscale("log")
        else:
            ax.set_xlim(left=0)
    if wide:
        ax_thr.set_yscale("log")
    ax_ttft.legend(fontsize=7, loc="upper left")
    ax_thr.legend(fontsize=7, loc="upper left")
    n = frame["requests"].iloc[0] if "requests" in frame else "?"
    fig.suptitle(title or f"Service curve: {n} requests per level; dotted line = knee (highest load still "
                          "keeping up: >= 90% of the load served and p95 TTFT within the SLO)", fontsize=10)
    return fig


def plot_ab_example(frame: pd.DataFrame) -> Figure:
    """The A/B example: per load (column ``load``, when there are several) and policy, three panels.

    Output tokens/s in the window (with requests completed of those sent); time to first token and time per output
    token, p50 (bar) and p95 (◆), each with its n. ``frame`` is ``ab_example`` (one load) or ``ab_at_two_loads`` (below
    capacity and overloaded). The time axes are logarithmic: overloaded and light loads differ by an order of magnitude.
    """
    loads = list(dict.fromkeys(frame["load"])) if "load" in frame else [None]
    policies = list(dict.fromkeys(frame["policy"]))
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    colors = {p: palette[i % len(palette)] for i, p in enumerate(policies)}
    rules = dict(zip(frame["policy"], frame["rule"]))
    width = 0.8 / len(policies)
    fig = Figure(figsize=(13, 4.4), layout="constrained")
    ax_tps, ax_ttft, ax_tpot = fig.subplots(1, 3)
    ticks = []
    for i, load in enumerate(loads):
        rows = frame if load is None else frame[frame["load"] == load]
        rate = float(rows["offered_rps"].iloc[0])
        ticks.append(f"{load}\n{rate:.3g} req/s" if load else f"{rate:.3g} req/s")
        for row in rows.itertuples(index=False):
            x = i + (policies.index(row.policy) - (len(policies) - 1) / 2) * width
            color = colors[row.policy]
            ax_tps.bar(x, row.output_tokens_per_s, width, color=color)
            ax_tps.annotate(f"{row.output_tokens_per_s:.1f}\n{row.completed}/{row.sent} done",
                            (x, row.output_tokens_per_s), ha="center", va="bottom", fontsize=8)
            for ax, clock in ((ax_ttft, "ttft"), (ax_tpot, "tpot")):
                p50, p95, n = getattr(row, f"{clock}_p50_s"), getattr(row, f"{clock}_p95_s"), getattr(row, f"{clock}_n")
                ax.bar(x, p50, width, color=color, alpha=0.6)
                ax.plot([x], [p95], "D", color="black", ms=5)
                ax.annotate(f"{p95:.2g} s\nn={n}", (x, p95), ha="center", va="bottom", fontsize=8,
                            xytext=(0, 4), textcoords="offset points")
    lo, hi = float(frame["window_s"].min()), float(frame["window_s"].max())
    window = f"{hi:.0f}" if round(lo) == round(hi) else f"{lo:.0f}–{hi:.0f}"
    ax_tps.set(title=f"Output tokens/s in the window ({window} s)", ylabel="output tokens / s")
    ax_tps.set_ylim(top=float(frame["output_tokens_per_s"].max()) * 1.3)
    ax_ttft.set(title="Time to first token: p50 (bar), p95 (◆)", ylabel="seconds (log scale)", yscale="log")
    ax_tpot.set(title="Time per output token: p50 (bar), p95 (◆)", ylabel="seconds (log scale)", yscale="log")
    for ax, clock in ((ax_ttft, "ttft"), (ax_tpot, "tpot")):
        ax.set_ylim(top=float(frame[f"{clock}_p95_s"].max()) * 4)
    for ax in (ax_tps, ax_ttft, ax_tpot):
        ax.set_xticks(range(len(loads)), ticks)
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3, axis="y")
    handles = [Patch(color=colors[p], label=f"{p}: {rules[p]}") for p in policies]
    ax_tps.legend(handles=handles, fontsize=8, loc="upper left")
    return fig


__all__ = ["PROFILE_COLORS", "plot_ab_example", "plot_service_curve"]
