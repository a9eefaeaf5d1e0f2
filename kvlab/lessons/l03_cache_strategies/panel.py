"""Notebook 03's panels: the strategies side by side, and kvlab's caches beside transformers'."""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import pandas as pd

from kvlab.experiments.strategies import DEFAULT_LINK_GBPS, EXACT_STRATEGIES, STRATEGIES, run_strategy_comparison
from kvlab.experiments.transformers_caches import QUANTO_BITS, pair_table, run_transformers_caches
from kvlab.experiments.transformers_caches import STRATEGIES as COMPARED_STRATEGIES
from kvlab.lessons.common.panel import ExperimentPanel
from kvlab.lessons.l03_cache_strategies.figures import plot_strategies, plot_transformers_caches
from kvlab.model.decoder import Decoder

_WIDE = dict(style={"description_width": "150px"}, layout=widgets.Layout(width="480px"))


def learner_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The longest context of a ``run_strategy_comparison`` frame, in columns a learner reads at a glance."""
    rows = frame[frame["pairs"] == frame["pairs"].max()]
    exact = rows["strategy"].isin(EXACT_STRATEGIES) & (rows["setting"] != "dynamic")
    counts = zip(rows.get("correct", [pd.NA] * len(rows)), rows.get("examples", [pd.NA] * len(rows)))
    accuracy = [("= exact" if ex else f"{a:.0%}" + (f" ({c}/{n})" if pd.notna(n) else ""))
                if (ex or pd.notna(a)) else "" for ex, a, (c, n) in zip(exact, rows["accuracy"], counts)]
    return pd.DataFrame({
        "setting": rows["setting"], "prompt tokens": rows["context_tokens"],
        "KiB allocated": rows["allocated_bytes"] / 1024, "× dynamic": rows["memory_ratio"],
        "ideal ×": rows["ideal_memory_ratio"], "KiB reserved, empty": rows["reserved_bytes"] / 1024,
        "ms/token p50": rows["token_ms_p50"], "ms/token p95": rows["token_ms_p95"],
        "p50 × dynamic": rows["latency_ratio"], "ms in cache/step": rows["cache_ms_per_step"],
        "KiB moved/step": rows["bytes_moved_per_step"] / 1024, "recall accuracy": accuracy,
    })


def strategies_panel(model: Decoder | None = None, strategies: Sequence[str] = STRATEGIES,
                     bits: Sequence[int] = (8, 4, 2), residual: int = 0, group_size: int = 32,
                     pairs: Sequence[int] = (4, 16, 32), new_tokens: int = 16, examples: int = 60,
                     repeats: int = 2, link_gbps: float | None = DEFAULT_LINK_GBPS,
                     title: str = "Cache strategies side by side") -> ExperimentPanel:
    """Choose strategies, bits, residual window, group size, the offload link and context lengths; Run
    measures them all.

    ``model`` defaults to the shipped recall model (``load_recall_model()``), whose head_dim (32)
    the group sizes offered divide. The result's frame comes from ``run_strategy_comparison``; its
    figure is ``plot_strategies``; its summary is the longest context in ``learner_table``'s columns.
    """
    from kvlab.experiments.recall import PAIR_TOKENS, QUERY_TOKENS, load_recall_model

    model = model if model is not None else load_recall_model()
    head_dim = model.config.head_dim
    groups = [g for g in (4, 8, 16, 32) if head_dim % g == 0] or [head_dim]
    contexts = [(f"{p * PAIR_TOKENS + QUERY_TOKENS} tokens ({p} pairs)", p) for p in (2, 4, 8, 16, 24, 32)]
    links = [("none (the tier's own speed only)", None)] + [(f"{g:g} GB/s", g) for g in (4.0, 1.0, 0.25)]
    if link_gbps is not None and link_gbps not in dict(links).values():
        links.append((f"{link_gbps:g} GB/s", float(link_gbps)))
    controls = {
        "strategies": widgets.SelectMultiple(options=list(STRATEGIES), value=tuple(strategies), rows=4,
                                             description="strategies", **_WIDE),
        "bits": widgets.SelectMultiple(options=[8, 4, 2], value=tuple(bits), rows=3,
                                       description="quantized: bits", **_WIDE),
        "residual": widgets.Dropdown(options=[0, 8, 16, 32, 64, 128], value=residual,
                                     description="residual window", **_WIDE),
        "group_size": widgets.Dropdown(options=groups, value=group_size if group_size in groups else groups[-1],
                                       description="group size", **_WIDE),
        "link_gbps": widgets.Dropdown(options=links, value=link_gbps if link_gbps in dict(links).values() else None,
                                      description="offloaded: slow link", **_WIDE),
        "pairs": widgets.SelectMultiple(options=contexts, value=tuple(pairs), rows=6,
                                        description="contexts", **_WIDE),
        "new_tokens": widgets.IntSlider(value=new_tokens, min=4, max=64, step=4, continuous_update=False,
                                        description="tokens per timed run", **_WIDE),
        "examples": widgets.IntSlider(value=examples, min=20, max=400, step=20, continuous_update=False,
                                      description="recall questions", **_WIDE),
    }

    def run(progress, strategies, bits, residual, group_size, link_gbps, pairs, new_tokens,
            examples) -> pd.DataFrame:
        return run_strategy_comparison(model, strategies, bits, residual, group_size, pairs, new_tokens=new_tokens,
                                       repeats=repeats, examples=examples, link_gbps=link_gbps, progress=progress)

    return ExperimentPanel(controls, run, figure=lambda frame, _p: plot_strategies(frame),
                           summary=lambda frame, _p: learner_table(frame), title=title)


def transformers_caches_panel(model: Decoder | None = None, strategies: Sequence[str] = COMPARED_STRATEGIES, pairs: int = 16,
                              questions: int = 4, new_tokens: int = 24, bits: int = 4, residual: int = 16,
                              group_size: int = 32, title: str = "kvlab's caches beside transformers'") -> ExperimentPanel:
    """Choose strategies, the context, the tokens and the quantized settings; Run generates with each
    strategy in kvlab and in transformers on the same weights (``run_transformers_caches``).

    Its summary is ``pair_table`` (one row per strategy, both libraries side by side), its figure
    ``plot_transformers_caches``; a transformers cache that cannot run here is named in one line each.
    """
    from kvlab.experiments.recall import PAIR_TOKENS, QUERY_TOKENS, load_recall_model

    model = model if model is not None else load_recall_model()
    contexts = [(f"{p * PAIR_TOKENS + QUERY_TOKENS} tokens ({p} pairs)", p) for p in (4, 8, 16, 32)]
    controls = {
        "strategies": widgets.SelectMultiple(options=list(COMPARED_STRATEGIES), value=tuple(strategies), rows=4,
                                             description="strategies", **_WIDE),
        "pairs": widgets.Dropdown(options=contexts, value=pairs, description="context", **_WIDE),
        "new_tokens": widgets.IntSlider(value=new_tokens, min=8, max=64, step=8, continuous_update=False,
                                        description="tokens per run", **_WIDE),
        "bits": widgets.Dropdown(options=list(QUANTO_BITS)[::-1], value=bits, description="quantized: bits", **_WIDE),
        "residual": widgets.Dropdown(options=[0, 8, 16, 32], value=residual, description="residual window", **_WIDE),
    }

    def run(progress, strategies, pairs, new_tokens, bits, residual) -> pd.DataFrame:
        return run_transformers_caches(model, strategies, pairs=pairs, questions=questions, new_tokens=new_tokens,
                                       bits=bits, group_size=group_size, residual=residual, progress=progress)

    return ExperimentPanel(controls, run, figure=lambda frame, _p: plot_transformers_caches(frame),
                           summary=lambda frame, _p: pair_table(frame), title=title)


__all__ = ["learner_table", "strategies_panel", "transformers_caches_panel"]
