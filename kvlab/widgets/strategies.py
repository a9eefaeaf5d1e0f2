"""The panel of lesson 03: cache strategies side by side (memory, latency, bytes, accuracy) behind a Run button."""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import pandas as pd
import torch

from ..cache.base import kv_cache_bytes
from ..device import pick_device
from ..experiments.cache_accuracy import accuracy_by_distance, accuracy_summary
from ..experiments.progress import Progress, no_progress
from ..experiments.strategies import run_strategies
from ..model.decoder import Decoder
from ..plots.strategies import plot_strategies
from .panel import ExperimentPanel

STRATEGIES = ("dynamic", "static", "quantized", "offloaded")
EXACT_STRATEGIES = ("dynamic", "static", "offloaded")
DEFAULT_LINK_GBPS = 1.0  # the slow link the offloaded cache also runs over (GB/s); see OffloadedCache
_WIDE = dict(style={"description_width": "150px"}, layout=widgets.Layout(width="480px"))


def strategy_settings(strategies: Sequence[str], bits: Sequence[int] = (8, 4, 2), residual: int = 0,
                      group_size: int | None = None, link_gbps: float | None = None,
                      device: torch.device | str = "cpu") -> list[dict]:
    """The settings ``run_strategies`` takes, from the panel's choices: one quantized setting per bits value.

    dynamic always comes first (every ratio is taken against it), whether chosen or not. With
    ``link_gbps``, offloaded runs twice: over the tier's own speed and over a link of that many GB/s
    (``OffloadedCache(link_gbps=...)``), the same bytes moved at two speeds. On a CUDA ``device``
    offloaded also runs with ``prefetch=False``: prefetched copies overlap compute on a side stream and
    go untimed, synchronous ones are timed (the tier's own speed, which a claim of notebook 03 reads).
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r}; choose among {', '.join(STRATEGIES)}")
    if not strategies:
        raise ValueError("choose at least one strategy (hold Ctrl or Cmd to pick several)")
    if "quantized" in strategies and not bits:
        raise ValueError("quantized is chosen but no bits are: pick one or more of 8, 4, 2")
    settings = [{"cache": "dynamic"}]
    for name in STRATEGIES[1:]:
        if name not in strategies:
            continue
        if name == "quantized":
            for b in sorted(set(bits), reverse=True):
                s = {"cache": "quantized", "bits": int(b), "residual": int(residual)}
                if group_size is not None:
                    s["group_size"] = int(group_size)
                settings.append(s)
        else:
            settings.append({"cache": name})
            if name == "offloaded" and torch.device(device).type == "cuda":
                settings.append({"cache": "offloaded", "prefetch": False})
            if name == "offloaded" and link_gbps is not None:
                settings.append({"cache": "offloaded", "link_gbps": float(link_gbps)})
    return settings


def run_strategy_comparison(model: Decoder | None = None, strategies: Sequence[str] = STRATEGIES,
                            bits: Sequence[int] = (8, 4, 2), residual: int = 0, group_size: int | None = None,
                            pairs: Sequence[int] = (4, 16, 32), new_tokens: int = 16, repeats: int = 2,
                            examples: int = 60, quality_prompts: int = 3, seed: int = 1000, threads: int | None = 1,
                            link_gbps: float | None = DEFAULT_LINK_GBPS,
                            progress: Progress = no_progress) -> pd.DataFrame:
    """Memory and latency of every chosen setting at every context (``run_strategies``), and recall
    accuracy of the dynamic and quantized settings at the longest context (``accuracy_by_distance``).
    ``link_gbps``: offloaded also runs over a link of that many GB/s (None: only at the tier's speed).
    On CUDA offloaded also runs with ``prefetch=False`` (``strategy_settings``).

    The frame is run_strategies' with the accuracy columns filled in at the longest context
    (static and offloaded are exact strategies and are not scored again; their quality columns
    stay empty), beside the counts behind each accuracy: ``correct`` and ``examples``, and
    ``exact_correct`` (the exact cache's, as "right/asked"). ``frame.attrs``: "accuracy" (the by-distance frame), "bytes_per_token" (the
    formula's bytes for one token, all layers, K and V), model, new_tokens, repeats.
    """
    from ..tasks.recall import load_recall_model, make_examples

    settings = strategy_settings(strategies, bits, residual, group_size, link_gbps,
                                 device=model.device if model is not None else pick_device())
    pairs = sorted(set(pairs))
    if not pairs:
        raise ValueError("choose at least one context length")
    if examples < 4:
        raise ValueError(f"examples must be at least 4 (one per distance bucket), got {examples}")
    for p in pairs:
        make_examples(1, p)  # a bad number of pairs raises here, before any work
    model = model if model is not None else load_recall_model()
    frame = run_strategies(model, settings, pairs=pairs, new_tokens=new_tokens, repeats=repeats, examples=0,
                           seed=seed, threads=threads, progress=progress)
    scored = [s for s in settings if s["cache"] not in EXACT_STRATEGIES]
    accuracy = accuracy_by_distance(model, scored, pairs=pairs[-1], examples=examples, seed=seed,
                                    quality_prompts=quality_prompts, threads=threads, progress=progress)
    summary = accuracy_summary(accuracy).set_index("setting")
    longest = frame["pairs"] == pairs[-1]
    for col in ("accuracy", "exact_accuracy", "kl_mean", "top1_agreement"):
        frame.loc[longest, col] = frame.loc[longest, "setting"].map(summary[col]).astype(float)
    for col in ("correct", "examples"):  # the counts behind the accuracy, so every percentage shows its n
        frame[col] = frame["setting"].map(summary[col]).where(longest).astype("Int64")
    exact = summary.loc["dynamic"] if "dynamic" in summary.index else None
    frame["exact_correct"] = (f"{int(exact['correct'])}/{int(exact['examples'])}" if exact is not None else None)
    frame.loc[~longest | frame["accuracy"].isna(), "exact_correct"] = None
    frame.attrs.update(accuracy=accuracy, new_tokens=new_tokens, repeats=repeats)
    return with_bytes_per_token(frame, model)


def with_bytes_per_token(frame: pd.DataFrame, model: Decoder) -> pd.DataFrame:
    """Name the model in ``frame.attrs`` and give the formula's bytes for one token (all layers, K and V)."""
    cfg = model.config
    element = torch.empty(0, dtype=model.dtype).element_size()
    frame.attrs.update(model=getattr(cfg, "name", None) or "model",
                       bytes_per_token=kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 1, 1, element))
    return frame


def learner_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The longest context of a ``run_strategy_comparison`` frame, in columns a learner reads at a glance."""
    rows = frame[frame["pairs"] == frame["pairs"].max()]
    exact = rows["strategy"].isin(EXACT_STRATEGIES) & (rows["setting"] != "dynamic")
    counts = zip(rows.get("correct", [pd.NA] * len(rows)), rows.get("examples", [pd.NA] * len(rows)))
    accuracy = [("= exact" if ex else f"{a:.0%}" + (f" ({c}/{n})" if pd.notna(n) else ""))
                if (ex or pd.notna(a)) else "" for ex, a, (c, n) in zip(exact, rows["accuracy"], counts)]
    return pd.DataFrame({
        "setting": rows["setting"],
        "prompt tokens": rows["context_tokens"],
        "KiB allocated": rows["allocated_bytes"] / 1024,
        "× dynamic": rows["memory_ratio"],
        "ideal ×": rows["ideal_memory_ratio"],
        "KiB reserved, empty": rows["reserved_bytes"] / 1024,
        "ms/token p50": rows["token_ms_p50"],
        "ms/token p95": rows["token_ms_p95"],
        "p50 × dynamic": rows["latency_ratio"],
        "ms in cache/step": rows["cache_ms_per_step"],
        "KiB moved/step": rows["bytes_moved_per_step"] / 1024,
        "recall accuracy": accuracy,
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
    from ..tasks.recall import PAIR_TOKENS, QUERY_TOKENS, load_recall_model

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


__all__ = ["DEFAULT_LINK_GBPS", "EXACT_STRATEGIES", "STRATEGIES", "learner_table", "run_strategy_comparison", "strategies_panel",
           "strategy_settings", "with_bytes_per_token"]
