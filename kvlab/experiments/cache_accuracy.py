"""Recall accuracy as a cache's precision falls: by bits, group size, residual window and fact-to-query distance.

``accuracy_by_distance()`` asks the shipped recall model the same held-out questions through each cache setting and
counts exact answers per distance bucket, beside the exact (dynamic) cache's count on the same questions, which is
scored once and shared. Its rows have the columns of ``kvlab.experiments.quality.recall_accuracy`` (setting,
distance_bucket, examples, accuracy, exact_accuracy) plus the setting's parts, so the plots read either.
``quality_prompts`` of the questions are also compared token by token with the exact cache (KL of next-token
distributions, top-1 agreement).

Every accuracy is shown with the number of questions behind it: ``accuracy_table`` writes each bucket as right / asked
(a bucket holds only a fraction of the questions, so one answer more or less moves its percentage a lot).
"""
from __future__ import annotations

import math
from typing import Sequence

import pandas as pd
import torch

from kvlab.cache import check_cache_options, make_cache
from kvlab.model.decoder import Decoder
from kvlab.experiments.quality import EXACT, compare_to_exact, describe_cache
from kvlab.progress import Progress, no_progress
from kvlab.threads import LESSON_THREADS, torch_threads


def cache_options(setting: dict, max_len: int | None = None) -> dict:
    """A setting's options for ``make_cache``; ``max_len`` sizes the caches that reserve every slot up front."""
    opts = {k: v for k, v in setting.items() if k != "cache"}
    if max_len is not None and setting["cache"] in ("static", "offloaded"):
        opts.setdefault("max_len", max_len)
    return opts


def checked_settings(settings: Sequence[dict]) -> list[dict]:
    """Copies of ``settings``, each checked to name a cache and options it takes (every check before any work)."""
    settings = [dict(s) for s in settings]
    for s in settings:
        if "cache" not in s:
            raise ValueError(f"setting {s} names no cache; write e.g. {{'cache': 'quantized', 'bits': 4}}")
        check_cache_options(s["cache"], cache_options(s))
    return settings


def accuracy_by_distance(model: Decoder | None = None, settings: Sequence[dict] = (
        {"cache": "quantized", "bits": 8, "residual": 0}, {"cache": "quantized", "bits": 4, "residual": 0},
        {"cache": "quantized", "bits": 2, "residual": 0}), pairs: int = 16, examples: int = 100, seed: int = 1000,
                         buckets: int = 4, quality_prompts: int = 4, threads: int | None = LESSON_THREADS,
                         progress: Progress = no_progress) -> pd.DataFrame:
    """One row per (setting, distance bucket): recall accuracy there, beside the exact cache's.

    The exact cache comes first (setting "dynamic"); ``settings`` add to it (a dynamic setting among them is not scored
    twice). Every setting gets the same questions, ``make_examples(examples, pairs, seed)``. kl_mean and top1_agreement
    are NaN with ``quality_prompts=0``; compared_positions counts the answer positions they are taken over.
    """
    from kvlab.experiments.recall import ANSWER_TOKENS, load_recall_model, make_examples, score

    settings = checked_settings(settings)
    if not isinstance(examples, int) or examples < buckets or buckets < 1:
        raise ValueError(f"need buckets >= 1 and at least one example per bucket: examples={examples!r}, "
                         f"buckets={buckets!r}; ask for more examples or fewer buckets")
    if not isinstance(quality_prompts, int) or quality_prompts < 0:
        raise ValueError(f"quality_prompts must be an integer >= 0, got {quality_prompts!r}")
    model = model if model is not None else load_recall_model()
    for s in settings:  # bad bits / group size / residual raise here, with the cache's own message
        if s["cache"] == "quantized":
            make_cache("quantized", model.config, batch=1, dtype=model.dtype, device=model.device, **cache_options(s))
    questions = make_examples(examples, pairs, seed=seed)  # raises for a bad number of pairs
    context = len(questions[0].prompt_ids)
    if context + ANSWER_TOKENS > model.config.max_position_embeddings:
        raise ValueError(f"{pairs} pairs ({context} tokens) + the answer exceed the model's context of "
                         f"{model.config.max_position_embeddings}; use fewer pairs")
    runs = [{"cache": EXACT}] + [s for s in settings if s != {"cache": EXACT}]
    element_bits = 8 * torch.empty(0, dtype=model.dtype).element_size()
    head_dim = model.config.head_dim
    assert model.tokenizer is not None  # every loader sets one
    stop = [model.tokenizer.encode(".")[0]]
    frames = []
    with torch_threads(threads), torch.inference_mode():
        for s in progress(runs, total=len(runs), desc="accuracy"):
            opts = cache_options(s, context + ANSWER_TOKENS)
            by = score(model, questions, s["cache"], buckets, **opts).by_distance
            kl, top1, positions = math.nan, math.nan, 0
            if quality_prompts and s["cache"] != EXACT:
                report = compare_to_exact(model, [q.prompt_ids for q in questions[:quality_prompts]], s["cache"],
                                          max_new_tokens=ANSWER_TOKENS, stop_tokens=stop, **opts)
                kl, top1, positions = report.kl_mean, report.top1_agreement, report.positions
            elif quality_prompts:
                kl, top1 = 0.0, 1.0  # the exact cache against itself
                positions = quality_prompts * ANSWER_TOKENS
            quantized = s["cache"] == "quantized"
            frames.append(by.assign(
                setting=describe_cache(s["cache"], cache_options(s)), strategy=s["cache"],
                bits=s.get("bits", 4) if quantized else element_bits,
                group_size=s.get("group_size", math.gcd(head_dim, 32)) if quantized else None,
                residual=s.get("residual", 64) if quantized else None,
                pairs=pairs, context_tokens=context, kl_mean=kl, top1_agreement=top1,
                quality_prompts=quality_prompts, compared_positions=positions))
    frame = pd.concat(frames, ignore_index=True)
    exact = frame[frame["setting"] == EXACT].set_index("distance_bucket")["accuracy"]
    frame["exact_accuracy"] = frame["distance_bucket"].map(exact).astype(float)
    frame["distance_mid"] = [iv.mid for iv in frame["distance_bucket"]]
    frame["correct"] = frame["correct"].astype(int)
    return frame[["setting", "strategy", "bits", "group_size", "residual", "pairs", "context_tokens",
                  "distance_bucket", "distance_mid", "examples", "correct", "accuracy", "exact_accuracy",
                  "kl_mean", "top1_agreement", "quality_prompts", "compared_positions"]]


def accuracy_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per setting of an ``accuracy_by_distance`` (or ``recall_accuracy``) frame: overall accuracy
    (correct answers over all questions) with its counts, the exact cache's, and the nearest and farthest
    buckets' accuracy, each beside its number of questions (``nearest_n``, ``farthest_n``)."""
    rows = []
    for setting, g in frame.groupby("setting", sort=False):
        n = g["examples"].sum()
        correct = g["correct"].sum() if "correct" in g else (g["accuracy"].fillna(0) * g["examples"]).sum()
        row = dict(setting=setting, examples=int(n), correct=int(round(float(correct))),
                   accuracy=float((g["accuracy"].fillna(0) * g["examples"]).sum() / n),
                   exact_accuracy=float((g["exact_accuracy"].fillna(0) * g["examples"]).sum() / n),
                   nearest_accuracy=float(g["accuracy"].iloc[0]), nearest_n=int(g["examples"].iloc[0]),
                   farthest_accuracy=float(g["accuracy"].iloc[-1]), farthest_n=int(g["examples"].iloc[-1]))
        row.update({col: g[col].iloc[0] for col in ("bits", "group_size", "residual", "kl_mean", "top1_agreement",
                                                    "quality_prompts", "compared_positions") if col in g})
        rows.append(row)
    return pd.DataFrame(rows)


def bucket_label(interval: pd.Interval, n: int) -> str:
    """A distance bucket as a reader sees it: ``13–74 tokens (n=11)`` (tokens between fact and query)."""
    return f"{int(interval.left) + 1}–{int(interval.right)} tokens (n={n})"


def accuracy_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Right answers / questions asked, per setting (rows) and distance bucket (columns, each naming its n),
    with all buckets together last: ``accuracy_by_distance``'s frame as a learner reads it."""
    buckets = frame.drop_duplicates("distance_bucket").sort_values("distance_mid")
    columns = {b: bucket_label(b, int(n)) for b, n in zip(buckets["distance_bucket"], buckets["examples"])}
    table = {}
    for setting, g in frame.groupby("setting", sort=False):
        cells = {columns[b]: f"{int(c)}/{int(n)}" for b, c, n in zip(g["distance_bucket"], g["correct"], g["examples"])}
        cells["all"] = f"{int(g['correct'].sum())}/{int(g['examples'].sum())}"
        table[setting] = cells
    out = pd.DataFrame.from_dict(table, orient="index")[list(columns.values()) + ["all"]]
    out.index.name = "setting"
    return out


__all__ = ["accuracy_by_distance", "accuracy_summary", "accuracy_table", "bucket_label"]
