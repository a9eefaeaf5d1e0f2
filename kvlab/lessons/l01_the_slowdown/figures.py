"""Figures of the slowdown: time per token and cumulative time, with and without a KV cache."""
from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from kvlab.lessons.common.figure_style import cache_color


def _curves(frame: pd.DataFrame) -> pd.DataFrame:
    """Per (cache, token): the fastest step over repeats and the median cumulative time.

    The same rule as experiments.slowdown.step_curves (plots sit below experiments, so no import).
    """
    return (frame.groupby(["cache", "token"], sort=False)
            .agg(step_ms=("step_ms", "min"), time_s=("time_s", "median")).reset_index())


def plot_slowdown(frame: pd.DataFrame, summary: pd.DataFrame | None = None) -> Figure:
    """Left: time of each decode step vs the token's index. Right: seconds since the request started.

    ``frame`` comes from ``run_slowdown`` (with repeats: the fastest step, the median cumulative time); with
    ``summary`` from ``slowdown_summary`` the early and late tokens are marked and the legend carries their ratio.
    The prefill (token 0) is left out of the left panel: it is one big step of a different kind.
    """
    med = _curves(frame)
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_step, ax_total = fig.subplots(1, 2)
    ratios = {} if summary is None else summary.set_index("cache").to_dict("index")
    for cache, curve in med.groupby("cache", sort=False):
        color = cache_color(cache)
        decode = curve[curve["token"] >= 1]
        label = f"cache={cache}"
        if cache in ratios:
            r = ratios[cache]
            label += (f": token {r['late_token']} took {r['measured_ratio']:.1f}× token {r['early_token']}"
                      f" (work {r['work_ratio']:.1f}×)")
        ax_step.plot(decode["token"], decode["step_ms"], color=color, lw=1.2, label=label)
        ax_total.plot(curve["token"], curve["time_s"], color=color, lw=2, label=f"cache={cache}")
    if summary is not None and len(summary):
        for t in (int(summary["early_token"].iloc[0]), int(summary["late_token"].iloc[0])):
            ax_step.axvline(t, color="#999", ls=":", lw=1)
    repeats = frame.attrs.get("repeats", 1)
    ax_step.set(title="Time per generated token" + (f" (fastest of {repeats} runs)" if repeats > 1 else ""),
                xlabel="generated token (index)", ylabel="step time (ms)")
    ax_step.set_ylim(bottom=0)
    ax_step.legend(fontsize=8, loc="upper left")
    ax_total.set(title="Cumulative time: when each token arrived", xlabel="generated token (index)",
                 ylabel="seconds since generation started")
    ax_total.set_ylim(bottom=0)
    ax_total.legend(fontsize=8, loc="upper left")
    for ax in (ax_step, ax_total):
        ax.grid(alpha=0.3)
    a = frame.attrs
    if a:
        threads = a.get("threads")
        fig.suptitle(f"{a.get('model', 'model')} ({a.get('parameters', 0) / 1e6:.1f}M parameters), prompt of "
                     f"{a.get('prompt_tokens')} tokens, on {a.get('device')} with {threads} "
                     f"thread{'' if threads == 1 else 's'}", fontsize=10)
    return fig
