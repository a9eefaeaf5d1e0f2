"""Memory, the price of the cache: measured bytes next to the formula, and a calculator for real models.

``measure_cache_memory`` generates with each cache strategy and reads the cache's own accounting after every step;
``formula_bytes`` is what ``2 x layers x kv_heads x head_dim x tokens x batch x bytes_per_element`` predicts for the
tokens it holds. ``kv_memory_table`` applies the same formula to published model shapes: gigabytes per context x batch,
and how many sequences fit on a GPU once the weights are loaded.
"""
from __future__ import annotations

import math
import tempfile
from typing import Sequence

import pandas as pd
import torch

from kvlab.cache import CACHE_NAMES, kv_cache_bytes, make_cache
from kvlab.generate import stream
from kvlab.model.config import PUBLISHED_CONFIGS, ModelConfig, tiny_llama
from kvlab.model.decoder import Decoder, build_model
from kvlab.progress import Progress, no_progress
from kvlab.experiments.slowdown import prompt_ids
from kvlab.threads import LESSON_THREADS, torch_threads
from kvlab.provenance import experiment

GIB = 2**30

# Bytes one stored K or V element takes, by the precision a serving stack keeps its cache in.
CACHE_PRECISIONS: dict[str, float] = {"fp32": 4, "fp16 / bf16": 2, "fp8 / int8": 1, "int4": 0.5}

_MEMORY_COLUMNS = ["cache", "token", "tokens", "allocated_bytes", "used_bytes", "reserved_bytes", "device_bytes",
                   "offloaded_bytes", "formula_bytes", "note"]


def measure_cache_memory(model: Decoder | None = None, prompt_tokens: int = 16, max_new_tokens: int = 48,
                         caches: Sequence[str] | None = None, seed: int = 0, threads: int | None = LESSON_THREADS,
                         progress: Progress = no_progress) -> pd.DataFrame:
    """Generate with each cache and record its memory accounting after every step.

    One row per (cache, step): tokens stored, the cache's allocated / used / reserved / device / offloaded bytes, and
    ``formula_bytes`` for the tokens stored at the model's precision. For dynamic, allocated == formula; for static,
    used == formula and the rest of the capacity (prompt + max_new_tokens) is reserved. A strategy that cannot be built
    here gets one row whose ``note`` says why. ``caches`` defaults to every strategy that stores something (all of
    CACHE_NAMES but "none").
    """
    model = build_model(tiny_llama(), seed=seed) if model is None else model
    caches = tuple(c for c in CACHE_NAMES if c != "none") if caches is None else tuple(caches)
    unknown = [c for c in caches if c not in CACHE_NAMES]
    if unknown:
        raise ValueError(f"unknown cache {unknown[0]!r}; choose from {', '.join(CACHE_NAMES)}")
    if not isinstance(prompt_tokens, int) or prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be a positive integer, got {prompt_tokens!r}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    total = prompt_tokens + max_new_tokens
    if total > model.config.max_position_embeddings:
        raise ValueError(f"prompt_tokens ({prompt_tokens}) + max_new_tokens ({max_new_tokens}) = {total} exceeds "
                         f"the model's context of {model.config.max_position_embeddings}; lower one of them")
    cfg = model.config
    elem = torch.tensor([], dtype=model.dtype).element_size()
    ids = prompt_ids(model, prompt_tokens, seed)
    rows: list[dict] = []
    options: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="kvlab-offload-") as storage_dir, torch_threads(threads):
        for name in progress(caches, total=len(caches), desc="measuring", unit="cache"):
            opts: dict = {"max_len": total} if name in ("static", "offloaded") else {}
            if name == "offloaded":
                opts["storage_dir"] = storage_dir
            try:
                cache = make_cache(name, cfg, batch=1, dtype=model.dtype, device=model.device, **opts)
            except (ImportError, NotImplementedError, RuntimeError) as exc:
                rows.append(dict(cache=name, note=f"not measured: {type(exc).__name__}: {exc}"))
                continue
            options[name] = {k: getattr(cache, k) for k in ("bits", "group_size", "residual", "max_len")
                             if hasattr(cache, k)}
            for event in stream(model, ids, cache=cache, max_new_tokens=max_new_tokens):
                mem, stored = cache.memory(), cache.seq_len
                rows.append(dict(cache=name, token=event.index, tokens=stored, **mem.to_dict(), note="",
                                 formula_bytes=kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim,
                                                              stored, 1, elem)))
            close = getattr(cache, "close", None)
            if callable(close):
                close()
    out = pd.DataFrame(rows, columns=_MEMORY_COLUMNS)
    int_cols = [c for c in _MEMORY_COLUMNS if c not in ("cache", "note")]
    out[int_cols] = out[int_cols].astype("Int64")  # integers, with <NA> on "not measured" rows
    out.attrs.update(model=cfg.name, bytes_per_element=elem, prompt_tokens=prompt_tokens,
                     max_new_tokens=max_new_tokens, capacity=total, options=options)
    return out


def resolve_config(config: ModelConfig | str) -> ModelConfig:
    """A ModelConfig, or the name of one in PUBLISHED_CONFIGS."""
    if isinstance(config, ModelConfig):
        return config
    if config not in PUBLISHED_CONFIGS:
        raise ValueError(f"unknown model {config!r}; choose one of {', '.join(PUBLISHED_CONFIGS)} "
                         "or pass a ModelConfig")
    return PUBLISHED_CONFIGS[config]


def max_sequences(config: ModelConfig | str, context: int, gpu_gib: float, bytes_per_element: float = 2,
                  weight_bytes_per_element: float | None = None) -> int:
    """How many sequences of ``context`` tokens fit in ``gpu_gib`` of memory once the weights are loaded.

    Weights take parameters x ``weight_bytes_per_element`` (default: the cache's precision); what is left is divided by
    one sequence's KV bytes. Activations and fragmentation are ignored, so real servers fit somewhat fewer.
    """
    cfg = resolve_config(config)
    weights = cfg.num_parameters() * (bytes_per_element if weight_bytes_per_element is None
                                      else weight_bytes_per_element)
    per_seq = kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, context, 1, bytes_per_element)
    return max(0, math.floor((gpu_gib * GIB - weights) / per_seq))


def kv_memory_table(config: ModelConfig | str, contexts: Sequence[int], batches: Sequence[int],
                    bytes_per_element: float = 2, gpu_gib: float | None = None,
                    weight_bytes_per_element: float | None = None) -> pd.DataFrame:
    """The memory formula over a grid of context lengths x batch sizes for one model shape.

    One row per (context, batch): kv_bytes and kv_gib (GiB = 2**30 bytes), weights_gib, and with ``gpu_gib`` given:
    total_gib (weights + cache), fits (total <= gpu_gib), and max_batch, the sequences of that context that fit beside
    the weights. ``over_model_context`` flags contexts longer than the model was trained for (the formula still applies;
    the model would not).
    """
    cfg = resolve_config(config)
    contexts, batches = list(contexts), list(batches)
    for label, values in (("contexts", contexts), ("batches", batches)):
        bad = [v for v in values if not isinstance(v, int) or v < 1]
        if not values or bad:
            raise ValueError(f"{label} must be a non-empty list of positive integers, got {values!r}")
    if not bytes_per_element > 0:
        raise ValueError(f"bytes_per_element must be > 0 (e.g. 2 for fp16), got {bytes_per_element!r}")
    if gpu_gib is not None and not gpu_gib > 0:
        raise ValueError(f"gpu_gib must be > 0 (e.g. 80 for an 80 GB GPU), got {gpu_gib!r}")
    wbytes = bytes_per_element if weight_bytes_per_element is None else weight_bytes_per_element
    weights_gib = cfg.num_parameters() * wbytes / GIB
    rows = []
    for context in contexts:
        fit = None if gpu_gib is None else max_sequences(cfg, context, gpu_gib, bytes_per_element, wbytes)
        for batch in batches:
            kv = kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, context, batch, bytes_per_element)
            row = dict(model=cfg.name, context=context, batch=batch, bytes_per_element=bytes_per_element,
                       kv_bytes=int(kv), kv_gib=kv / GIB, weights_gib=weights_gib,
                       over_model_context=context > cfg.max_position_embeddings)
            if gpu_gib is not None:
                row.update(gpu_gib=gpu_gib, total_gib=weights_gib + kv / GIB,
                           fits=weights_gib + kv / GIB <= gpu_gib, max_batch=fit)
            rows.append(row)
    out = pd.DataFrame(rows)
    out.attrs.update(model=cfg.name, kv_bytes_per_token=cfg.kv_bytes_per_token(1) * bytes_per_element,
                     num_kv_heads=cfg.num_kv_heads, num_heads=cfg.num_heads, num_layers=cfg.num_layers,
                     head_dim=cfg.head_dim, gpu_gib=gpu_gib)
    return out


@experiment
def published_kv_table(tokens: int = 4096, bytes_per_element: float = 2) -> pd.DataFrame:
    """The memory formula for every published shape (``PUBLISHED_CONFIGS``): one row per model with its layers,
    key/value heads and head dimension, the KiB one token's K and V take, and the GiB ``tokens`` tokens take."""
    out = pd.DataFrame([{"model": name, "layers": c.num_layers, "kv_heads": c.num_kv_heads, "head_dim": c.head_dim,
                         "KiB per token": c.kv_bytes_per_token(bytes_per_element) / 1024,
                         f"GiB for {tokens:,} tokens": c.kv_bytes_per_token(bytes_per_element) * tokens / GIB}
                        for name, c in PUBLISHED_CONFIGS.items()]).set_index("model")
    out.attrs.update(tokens=tokens, bytes_per_element=bytes_per_element)
    return out


def gib_for(model: str):
    """The answer a prediction reads from ``published_kv_table``'s result: ``model``'s GiB for the table's tokens,
    with the bytes one token takes, the number it is computed from."""
    def measure(table: pd.DataFrame) -> tuple[float, dict]:
        row = table.loc[model]
        per_token = float(row["KiB per token"]) * 1024
        return float(row[f"GiB for {table.attrs['tokens']:,} tokens"]), {"bytes per token": per_token}
    return measure
