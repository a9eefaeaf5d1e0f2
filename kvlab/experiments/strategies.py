"""Cache strategies side by side: memory held, latency paid and quality kept, at several context lengths.

``run_strategies()`` runs every cache setting on the shipped recall model (kvlab.experiments.recall) at a few context
lengths and returns one tidy DataFrame, one row per (setting, context):

- memory after prompt + new tokens: allocated = used (holding tokens) + reserved (empty), the part on the compute device
  and the part offloaded, and the ratio to dynamic's allocation beside the ideal ratio of the quantized format (bits /
  element bits + scale and zero-point per group);
- latency: prefill ms, per-token decode latency p50 / p95, the ms per step spent inside the cache's ``update``
  (quantizing, dequantizing, copying between tiers; on CUDA timed with the compute stream synchronised), bytes moved per
  step;
- for the offloaded cache, the link: the ms per step its copies took (a throttled link's wait included: ``link_gbps``,
  see kvlab.cache.offloaded), the ms the stated link needs for the mean bytes moved, and bytes moved per second of
  copying and of a whole decode step (medians over the steps, like the p50 latency);
- quality vs the exact (dynamic) cache: recall accuracy, KL of next-token distributions on the answer tokens, top-1 and
  greedy agreement.

``run_strategy_comparison()`` is what a panel's Run calls: ``run_strategies`` over the settings ``strategy_settings``
makes of the panel's choices, and the recall accuracy of the inexact ones at the longest context
(``kvlab.experiments.cache_accuracy``).

Timed runs go round-robin over the settings (a slow moment on a shared machine hits all alike). Static and offloaded
caches are sized for the longest context of the sweep, as a server sizes them for the longest request it accepts:
shorter contexts show the bytes they reserve and leave empty.
"""
from __future__ import annotations

import functools
import math
import time
from typing import Any, Sequence

import numpy as np
import pandas as pd
import torch

from kvlab.cache import KVCache, make_cache
from kvlab.cache.base import kv_cache_bytes
from kvlab.device import pick_device
from kvlab.generate import generate
from kvlab.model.decoder import Decoder
from kvlab.experiments.quality import EXACT, compare_to_exact, describe_cache
from kvlab.experiments.cache_accuracy import accuracy_by_distance, accuracy_summary, cache_options, checked_settings
from kvlab.progress import Progress, no_progress
from kvlab.threads import LESSON_THREADS, torch_threads

DEFAULT_PAIRS: tuple[int, ...] = (4, 8, 16)  # 37, 69 and 133 prompt tokens
DEFAULT_SETTINGS: tuple[dict, ...] = (
    {"cache": "dynamic"},
    {"cache": "static"},
    {"cache": "quantized", "bits": 8, "residual": 0},
    {"cache": "quantized", "bits": 4, "residual": 0},
    {"cache": "quantized", "bits": 4, "residual": 0, "group_size": 8},
    {"cache": "quantized", "bits": 2, "residual": 0},
    {"cache": "quantized", "bits": 2, "residual": 0, "group_size": 8},
    {"cache": "quantized", "bits": 2, "residual": 32},
    {"cache": "offloaded"},
)

STRATEGIES = ("dynamic", "static", "quantized", "offloaded")
EXACT_STRATEGIES = ("dynamic", "static", "offloaded")
DEFAULT_LINK_GBPS = 1.0  # the slow link the offloaded cache also runs over (GB/s); see OffloadedCache


def default_settings(device: torch.device | str = "cpu") -> list[dict]:
    """DEFAULT_SETTINGS, plus offloaded without prefetch on CUDA (where prefetching on a side stream
    can hide part of the copy; on CPU the copies are synchronous and prefetch changes nothing)."""
    out = [dict(s) for s in DEFAULT_SETTINGS]
    if torch.device(device).type == "cuda":
        out.append({"cache": "offloaded", "prefetch": False})
    return out


def ideal_memory_ratio(setting: dict, head_dim: int, tokens: int, element_bytes: int = 4) -> float:
    """Bytes a quantized cache needs per stored value over full precision's (1.0 for the exact caches).

    Codes take bits / 8 bytes, each group of ``group_size`` values adds a scale and a zero-point in the model dtype, and
    the newest ``residual`` tokens stay at full precision.
    """
    if setting["cache"] != "quantized":
        return 1.0
    group = setting.get("group_size") or math.gcd(head_dim, 32)  # the cache's own default
    packed = setting.get("bits", 4) / (8 * element_bytes) + 2 / group
    window = min(setting.get("residual", 64), tokens)
    return ((tokens - window) * packed + window) / tokens


def _clock(device: torch.device) -> float:
    """``perf_counter()`` once the compute stream's queued kernels have run (CUDA), so an update's time is its own
    work; copies an offloaded cache prefetches on a side stream keep overlapping, untimed."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()
    return time.perf_counter()


def _timed_updates(cache: KVCache) -> tuple[list[float], list[float]]:
    """Wrap the cache's ``update`` so each call's seconds are recorded, and the seconds of copying between tiers
    for a cache that counts them (``copy_s_total``). On CUDA the step times then include the waits of ``_clock``
    (and lose the overlap of launching kernels with running them), for every setting alike."""
    spent: list[float] = []
    copied: list[float] = []
    inner = cache.update

    @functools.wraps(inner)
    def update(layer_idx, k, v):
        c0, t0 = getattr(cache, "copy_s_total", 0.0), _clock(cache.device)
        out = inner(layer_idx, k, v)
        spent.append(_clock(cache.device) - t0)
        copied.append(getattr(cache, "copy_s_total", 0.0) - c0)
        return out

    setattr(cache, "update", update)  # an instance attribute shadows the class's method
    return spent, copied


def _per_step(per_call: list[float], layers: int) -> list[float]:
    """Per-update-call seconds summed per step (each step calls update once per layer)."""
    return [sum(per_call[i:i + layers]) for i in range(0, len(per_call), layers)]


def _timed_run(model: Decoder, prompt: list[int], setting: dict, new_tokens: int, max_len: int) -> dict:
    opts = cache_options(setting, max_len)
    cache = make_cache(setting["cache"], model.config, batch=1, dtype=model.dtype, device=model.device, **opts)
    # Copies are timed where they are synchronous (the cache synchronises before its clock starts): on CPU,
    # over a throttled link, and on CUDA without prefetch. Prefetched copies run on a side stream, untimed.
    copies_timed = hasattr(cache, "copy_s_total") and not getattr(cache, "prefetch", False)
    spent, copied = _timed_updates(cache)
    try:
        layers = model.config.num_layers
        result = generate(model, prompt, cache=cache, max_new_tokens=new_tokens)
        steps = result.timeline.step_s
        mem, extra = cache.memory(), cache.memory_breakdown() if hasattr(cache, "memory_breakdown") else {}
        return dict(prefill_s=steps[0], decode_s=steps[1:], update_s=_per_step(spent, layers)[1:],
                    copy_s=_per_step(copied, layers)[1:] if copies_timed else [],
                    moved=result.timeline.bytes_moved[1:], memory=mem, breakdown=extra)
    finally:
        if hasattr(cache, "close"):
            cache.close()  # the offloaded cache's file


def run_strategies(model: Decoder | None = None, settings: Sequence[dict] = DEFAULT_SETTINGS,
                   pairs: Sequence[int] = DEFAULT_PAIRS, new_tokens: int = 32, repeats: int = 3,
                   examples: int = 100, quality_prompts: int = 20, seed: int = 0, threads: int | None = LESSON_THREADS,
                   progress: Progress = no_progress) -> pd.DataFrame:
    """Every cache setting at every context size: memory, latency and quality vs exact, one row each.

    ``settings`` are dicts like ``{"cache": "quantized", "bits": 2, "residual": 32}``; ``pairs`` the recall contexts
    (``8 * pairs + 5`` prompt tokens). ``repeats`` timed generations of ``new_tokens`` per row; ``examples`` recall
    questions per context for accuracy (0: skip the quality columns); ``quality_prompts`` of them also compared token by
    token with the exact cache.
    """
    from kvlab.experiments.recall import ANSWER_TOKENS, load_recall_model, make_examples, score

    settings = checked_settings(settings)
    if not pairs or any(not isinstance(p, int) or p < 1 for p in pairs):
        raise ValueError(f"pairs must be positive integers (pairs per recall context), got {pairs!r}")
    if new_tokens < 2 or repeats < 1 or examples < 0 or quality_prompts < 0:
        raise ValueError(f"need new_tokens >= 2, repeats >= 1, examples >= 0, quality_prompts >= 0; got "
                         f"{new_tokens}, {repeats}, {examples}, {quality_prompts}")
    model = model if model is not None else load_recall_model()
    cfg = model.config
    questions = {p: make_examples(max(examples, quality_prompts, repeats), p, seed=seed) for p in pairs}
    longest = max(len(q[0].prompt_ids) for q in questions.values()) + new_tokens
    if longest > cfg.max_position_embeddings:
        raise ValueError(f"{max(pairs)} pairs + {new_tokens} new tokens = {longest} tokens exceed the model's "
                         f"context of {cfg.max_position_embeddings}; use fewer pairs or new tokens")
    for s in settings:
        if s["cache"] == "quantized":  # the cache checks bits / group size / residual on construction
            make_cache("quantized", cfg, batch=1, dtype=model.dtype, device=model.device, **cache_options(s))
    element_bytes = torch.empty(0, dtype=model.dtype).element_size()

    runs: dict[tuple[int, int], list[dict]] = {}
    jobs = [(rep, p) for rep in range(repeats + 1) for p in pairs]  # rep 0: a cold run, not kept
    with torch_threads(threads) as used_threads, torch.inference_mode():
        for rep, p in progress(jobs, total=len(jobs), desc="timing"):
            prompt = questions[p][rep % len(questions[p])].prompt_ids
            for i, s in enumerate(settings):
                run = _timed_run(model, prompt, s, new_tokens, longest)
                if rep:
                    runs.setdefault((i, p), []).append(run)
        quality: dict[tuple[int, int], dict] = {}
        if examples:
            assert model.tokenizer is not None  # every loader sets one
            stop = [model.tokenizer.encode(".")[0]]
            for (i, s), p in progress([(x, p) for x in enumerate(settings) for p in pairs],
                                      total=len(settings) * len(pairs), desc="quality"):
                opts = cache_options(s, longest)
                acc = score(model, questions[p][:examples], s["cache"], **opts).accuracy
                q = dict(accuracy=acc)
                if quality_prompts:
                    prompts = [e.prompt_ids for e in questions[p][:quality_prompts]]
                    q.update(compare_to_exact(model, prompts, s["cache"], max_new_tokens=ANSWER_TOKENS,
                                              stop_tokens=stop, **opts).to_dict())
                quality[(i, p)] = q

    rows = []
    for (i, p), rs in runs.items():
        s = settings[i]
        tokens = len(questions[p][0].prompt_ids) + new_tokens - 1  # the last new token is never fed back
        decode_ms = 1e3 * np.concatenate([r["decode_s"] for r in rs])
        moved = np.concatenate([r["moved"] for r in rs]).astype(float)  # bytes per decode step
        copy_s = np.concatenate([r["copy_s"] for r in rs]) if rs[0]["copy_s"] else None
        link = s.get("link_gbps") if s["cache"] == "offloaded" else None
        m, b = rs[-1]["memory"], rs[-1]["breakdown"]
        row = dict(setting=describe_cache(s["cache"], cache_options(s)),
                   strategy=s["cache"], bits=s.get("bits", 8 * element_bytes) if s["cache"] == "quantized"
                   else 8 * element_bytes,
                   group_size=s.get("group_size", math.gcd(cfg.head_dim, 32)) if s["cache"] == "quantized" else None,
                   residual=s.get("residual", 64) if s["cache"] == "quantized" else None,
                   pairs=p, context_tokens=len(questions[p][0].prompt_ids), stored_tokens=tokens,
                   allocated_bytes=m.allocated_bytes, used_bytes=m.used_bytes, reserved_bytes=m.reserved_bytes,
                   device_bytes=m.device_bytes, offloaded_bytes=m.offloaded_bytes,
                   payload_bytes=b.get("payload_bytes"), scale_bytes=b.get("scale_bytes"),
                   residual_bytes=b.get("residual_bytes"),
                   ideal_memory_ratio=ideal_memory_ratio(s, cfg.head_dim, tokens, element_bytes),
                   prefill_ms=1e3 * float(np.median([r["prefill_s"] for r in rs])),
                   token_ms_p50=float(np.percentile(decode_ms, 50)), token_ms_p95=float(np.percentile(decode_ms, 95)),
                   cache_ms_per_step=(1e3 * float(np.mean(np.concatenate([r["update_s"] for r in rs])))
                                      if rs[0]["update_s"] else float("nan")),
                   bytes_moved_per_step=float(np.mean(moved)),
                   link_gbps=float(link) if link is not None else float("nan"),
                   link_ms_per_step=1e3 * float(np.mean(moved)) / (link * 1e9) if link is not None else float("nan"),
                   copy_ms_per_step=1e3 * float(np.median(copy_s)) if copy_s is not None else float("nan"),
                   copy_gb_per_s=(float(np.median(moved / copy_s)) / 1e9 if copy_s is not None and (copy_s > 0).all()
                                  else float("nan")),
                   moved_gb_per_s=float(np.median(moved / (1e-3 * decode_ms))) / 1e9,
                   device=str(model.device), threads=used_threads)
        q = quality.get((i, p), {})
        row.update({k: q.get(k, float("nan"))
                    for k in ("accuracy", "kl_mean", "kl_max", "top1_agreement", "greedy_agreement")})
        rows.append(row)
    frame = pd.DataFrame(rows)
    # Ratios to the exact dynamic cache at the same context (NaN when dynamic was not run).
    base = frame[frame["setting"] == EXACT].set_index("pairs")
    for col, ratio in (("allocated_bytes", "memory_ratio"), ("token_ms_p50", "latency_ratio")):
        ref = frame["pairs"].map(base[col]) if len(base) else np.nan
        frame[ratio] = frame[col] / ref
    frame["exact_accuracy"] = frame["pairs"].map(base["accuracy"]) if len(base) else np.nan
    return frame


def strategy_settings(strategies: Sequence[str], bits: Sequence[int] = (8, 4, 2), residual: int = 0,
                      group_size: int | None = None, link_gbps: float | None = None,
                      device: torch.device | str = "cpu") -> list[dict]:
    """The settings ``run_strategies`` takes, from the panel's choices: one quantized setting per bits value.

    dynamic always comes first (every ratio is taken against it), whether chosen or not. With ``link_gbps``, offloaded
    runs twice: over the tier's own speed and over a link of that many GB/s (``OffloadedCache(link_gbps=...)``), the
    same bytes moved at two speeds. On a CUDA ``device`` offloaded also runs with ``prefetch=False``: prefetched copies
    overlap compute on a side stream and go untimed, synchronous ones are timed (the tier's own speed).
    """
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategy {unknown[0]!r}; choose among {', '.join(STRATEGIES)}")
    if not strategies:
        raise ValueError("choose at least one strategy (hold Ctrl or Cmd to pick several)")
    if "quantized" in strategies and not bits:
        raise ValueError("quantized is chosen but no bits are: pick one or more of 8, 4, 2")
    settings: list[dict[str, Any]] = [{"cache": "dynamic"}]
    for name in STRATEGIES[1:]:
        if name not in strategies:
            continue
        if name == "quantized":
            for b in sorted(set(bits), reverse=True):
                s: dict[str, Any] = {"cache": "quantized", "bits": int(b), "residual": int(residual)}
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
                            examples: int = 60, quality_prompts: int = 3, seed: int = 1000, threads: int | None = LESSON_THREADS,
                            link_gbps: float | None = DEFAULT_LINK_GBPS,
                            progress: Progress = no_progress) -> pd.DataFrame:
    """Memory and latency of every chosen setting at every context (``run_strategies``), and recall
    accuracy of the dynamic and quantized settings at the longest context (``accuracy_by_distance``); the
    settings are ``strategy_settings``'.

    The frame is run_strategies' with the accuracy columns filled in at the longest context (static and offloaded are
    exact strategies and are not scored again; their quality columns stay empty), beside the counts behind each
    accuracy: ``correct`` and ``examples``, and ``exact_correct`` (the exact cache's, as "right/asked").
    ``frame.attrs``: "accuracy" (the by-distance frame), "bytes_per_token" (the formula's bytes for one token, all
    layers, K and V), model, new_tokens, repeats.
    """
    from kvlab.experiments.recall import load_recall_model, make_examples

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


def quantized_memory_ratio(frame: pd.DataFrame, bits: int = 4) -> float:
    """Bytes of the ``bits``-bit quantized cache over the dynamic cache's, at the longest context of the run."""
    q = frame[(frame["strategy"] == "quantized") & (frame["bits"] == bits)]
    if not len(q):
        ran = sorted(set(frame.loc[frame["strategy"] == "quantized", "bits"].astype(int)))
        raise ValueError(f"no {bits}-bit quantized cache in this run (quantized bits run: {ran or 'none'}); "
                         f"choose quantized with {bits} bits and run again")
    return float(q.loc[q["context_tokens"].idxmax(), "memory_ratio"])


def four_bit_memory_ratio(result: Any) -> tuple[float, dict[str, float]]:
    """The 4-bit cache's bytes over the dynamic cache's at the longest context.

    ``result`` is the panel's result (or its frame). Returns ``(ratio, inputs)``, the two byte counts the ratio is
    computed from, for ``guess.against(result, four_bit_memory_ratio)``: no output before the question may show them.
    """
    frame = getattr(result, "frame", result)
    ratio = quantized_memory_ratio(frame, bits=4)
    longest = frame[frame["context_tokens"] == frame["context_tokens"].max()]
    q = longest[(longest["strategy"] == "quantized") & (longest["bits"] == 4)]
    dyn = longest[longest["setting"] == "dynamic"]
    inputs = {"4-bit cache bytes": float(q["allocated_bytes"].iloc[0])}
    if len(dyn):
        inputs["dynamic cache bytes"] = float(dyn["allocated_bytes"].iloc[0])
    return ratio, inputs


__all__ = ["DEFAULT_LINK_GBPS", "DEFAULT_PAIRS", "DEFAULT_SETTINGS", "EXACT_STRATEGIES", "STRATEGIES", "default_settings",
           "four_bit_memory_ratio", "ideal_memory_ratio", "quantized_memory_ratio", "run_strategies", "run_strategy_comparison",
           "strategy_settings", "with_bytes_per_token"]
