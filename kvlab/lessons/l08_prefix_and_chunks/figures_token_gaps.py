"""Time between tokens, as it happens: every gap of every request against the moment it ended.

A steady stream is a flat band of dots; a step that did much more work than the others (a long
prompt computed in one go) shows as a spike shared by every request that was decoding then.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure


def plot_token_gaps(requests: pd.DataFrame, by: str | None = "run", exclude: Iterable = (),
                    marks: dict[str, float] | None = None, title: str | None = None) -> Figure:
    """Gap before each token (ms) vs when it arrived, one panel per ``by`` value (shared y axis).

    ``requests`` is a requests frame with ``token_s`` (``ServingRun.requests``); requests whose id
    is in ``exclude`` are left out (e.g. the long prompt itself); ``marks`` draws labelled vertical
    lines (e.g. {"long prompt arrives": 0.08}). Each panel's largest gap is labelled.
    """
    if "token_s" not in requests.columns:
        raise ValueError("requests need a token_s column (ServingRun.requests keeps every token's stamp)")
    exclude = set(exclude)
    groups = list(dict.fromkeys(requests[by])) if by is not None and len(requests) else [None]
    fig = Figure(figsize=(5.2 * len(groups) + 1, 3.6), layout="constrained")
    axes = fig.subplots(1, len(groups), sharey=True, squeeze=False)[0]
    for ax, g in zip(axes, groups):
        sub = requests if g is None else requests[requests[by] == g]
        worst = (0.0, np.nan)
        for row in sub.itertuples(index=False):
            if row.request_id in exclude:
                continue
            t = np.asarray(row.token_s, dtype=float)
            if len(t) < 2:
                continue
            gaps = np.diff(t) * 1e3
            ax.plot(t[1:], gaps, marker=".", ms=4, ls="", alpha=0.7, label=f"req {row.request_id}")
            i = int(np.argmax(gaps))
            if gaps[i] > worst[0]:
                worst = (float(gaps[i]), float(t[1:][i]))
        for label, x in (marks or {}).items():
            ax.axvline(x, color="#555", ls=":", lw=1)
            ax.annotate(label, (x, 1), xycoords=("data", "axes fraction"), xytext=(3, -3),
                        textcoords="offset points", va="top", fontsize=7, color="#555", rotation=90)
        if worst[0] > 0:
            ax.annotate(f"largest gap {worst[0]:,.0f} ms", (worst[1], worst[0]), xytext=(6, -2),
                        textcoords="offset points", fontsize=8, color="#d62728")
        ax.set(xlabel="seconds since the run started", title=str(g) if g is not None else (title or ""))
        ax.title.set_fontsize(10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if not ax.lines:
            ax.text(0.5, 0.5, "no gaps (fewer than 2 tokens)", transform=ax.transAxes, ha="center", va="center",
                    color="#555")
    axes[0].set_ylabel("gap before the token (ms)\n(one dot per token)")
    if title and groups != [None]:
        fig.suptitle(title, fontsize=10)
    return fig
