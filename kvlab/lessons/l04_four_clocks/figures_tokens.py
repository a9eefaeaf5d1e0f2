"""Tokens are not words: tokens per word and per character by language, and the tokens/s of the same words/s."""
from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

TOKENIZER_COLORS = ["#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"]  # bytes, BPE, a real one, ...


def _bars(ax, wide: pd.DataFrame, colors: list[str], fmt: str) -> None:
    """Grouped horizontal bars: one group per row of ``wide`` (top to bottom), one bar per column."""
    k = len(wide.columns)
    height = 0.8 / k
    y = np.arange(len(wide))
    for j, name in enumerate(wide.columns):
        values = wide[name].to_numpy(dtype=float)
        bars = ax.barh(y + (j - (k - 1) / 2) * height, np.nan_to_num(values), height=height, color=colors[j],
                       label=name)
        ax.bar_label(bars, labels=["" if np.isnan(v) else format(v, fmt) for v in values], fontsize=6, padding=2)
    labels = [t if not wide.loc[t].isna().all() else f"{t} (no spaces)" for t in wide.index]
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    top = np.nanmax(wide.to_numpy(dtype=float)) if wide.notna().any().any() else 1.0
    ax.set_xlim(0, top * 1.15)  # room for the labels
    ax.grid(axis="x", alpha=0.3)
    ax.title.set_fontsize(10)


def plot_tokens_per_word(counts: pd.DataFrame, rates: pd.DataFrame | None = None) -> Figure:
    """Left: tokens per word of each text, one bar per tokenizer. Middle: tokens per character.
    Right (when ``rates`` is given): the tokens/s each tokenizer counts when every language's paragraph
    is written at the same words/s (words of the English version: the same content per second).

    ``counts`` comes from ``kvlab.lessons.l04_four_clocks.tokens_words.count_tokens``, ``rates`` from ``tokens_per_second``.
    """
    from .tokens_words import by_text

    toks = list(dict.fromkeys(counts["tokenizer"]))
    colors = [TOKENIZER_COLORS[i % len(TOKENIZER_COLORS)] for i in range(len(toks))]
    panels = 3 if rates is not None else 2
    fig = Figure(figsize=(5.0 * panels, 5.2), layout="constrained")
    axes = fig.subplots(1, panels, sharey=False)
    _bars(axes[0], by_text(counts, "tokens_per_word"), colors, ".1f")
    axes[0].set(xlabel="tokens per word", title="Tokens per word (words: what spaces separate)")
    _bars(axes[1], by_text(counts, "tokens_per_char"), colors, ".2f")
    axes[1].set(xlabel="tokens per character", title="Tokens per character")
    if rates is not None:
        wps = rates.attrs.get("words_per_s")
        _bars(axes[2], by_text(rates, "tokens_per_s"), colors, ".0f")
        axes[2].set(xlabel="tokens/s", title=f"The same {wps:g} words/s of content, in tokens/s")
    axes[0].legend(fontsize=8, loc="lower right")
    return fig


__all__ = ["plot_tokens_per_word"]
