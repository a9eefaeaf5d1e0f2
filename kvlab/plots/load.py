"""Figures of a service under load: the service curve with its knee, and the A/B trade-off."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

PROFILE_COLORS = {"short_short": "#1f77b4", "long_short": "#ff7f0e", "long_gen": "#2ca02c", "mixture": "#9467bd"}
_FALLBACK = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#d62728")


def _curves(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame, str, str]]:
    """(label, rows sorted by load, colour, line style) per curve: profiles by colour, 'source' by style."""
    keys = [k for k in ("profile", "policy") if k in frame and frame[k].nunique() > 1] or \
           [k for k in ("profile",) if k in frame]
    style_key = "source" if "source" in frame and frame["source"].nunique() > 1 else None
    groups = frame.groupby(keys + ([style_key] if style_key else []), sort=False) if keys or style_key else \
        [((), frame)]
    out, colors = [], {}
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
    ax_ttft.set(title="Time to first token (thick: p95, thin: p50)", ylabel="seconds (log scale)", yscale="log")
    ax_tpot.set(title="Time per output token, per request (thick: p95, thin: p50)", ylabel="seconds (log scale)",
                yscale="log")
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
    """Two bars per policy: completed requests in the window (throughput) and TTFT p50 / p95 of those."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    ax_done, ax_ttft = fig.subplots(1, 2)
    labels = [f"{p}: {r}" for p, r in zip(frame["policy"], frame["rule"])]
    colors = ["#1f77b4", "#d62728"][:len(frame)]
    bars = ax_done.bar(labels, frame["completed"], color=colors)
    for bar, tps in zip(bars, frame["output_tokens_per_s"]):
        ax_done.annotate(f"{bar.get_height():.0f} done\n{tps:.1f} tokens/s", (bar.get_x() + bar.get_width() / 2,
                         bar.get_height()), ha="center", va="bottom", fontsize=9)
    window = frame["window_s"].iloc[0]
    ax_done.set(title=f"Completed in the {window:g} s window (same requests, same load)", ylabel="requests")
    ax_done.set_ylim(top=float(frame["completed"].max()) * 1.3)
    x = np.arange(len(frame))
    ax_ttft.bar(x - 0.2, frame["ttft_p50_s"], 0.4, color=colors, alpha=0.5, label="p50")
    ax_ttft.bar(x + 0.2, frame["ttft_p95_s"], 0.4, color=colors, label="p95")
    for i, (p50, p95, n) in enumerate(zip(frame["ttft_p50_s"], frame["ttft_p95_s"], frame["ttft_n"])):
        ax_ttft.annotate(f"{p95:.2f} s\n(n={n})", (i + 0.2, p95), ha="center", va="bottom", fontsize=9)
        ax_ttft.annotate(f"{p50:.2f}", (i - 0.2, p50), ha="center", va="bottom", fontsize=8)
    ax_ttft.set_xticks(x, labels)
    ax_ttft.set(title="Time to first token of those requests", ylabel="seconds")
    ax_ttft.set_ylim(top=float(frame["ttft_p95_s"].max()) * 1.35)
    ax_ttft.legend(fontsize=8, loc="upper left")
    for ax in (ax_done, ax_ttft):
        ax.grid(alpha=0.3, axis="y")
    return fig


__all__ = ["PROFILE_COLORS", "plot_ab_example", "plot_service_curve"]
