"""Why batching works, measured: one decode step's time against the batch size, beside this machine's limits.

A decode step multiplies every weight matrix by one new row per sequence. With one sequence the step reads all the
weights to do two floating-point operations per weight: it waits on memory. With B sequences it reads the same weights
once and does B times the arithmetic, so the step costs about the same until the arithmetic, not the reading, takes the
longer time. ``decode_scaling`` times that step on the real decoder for each batch size and puts beside it, measured in
the same run:

- ``memory_floor_s``: the bytes a step must read (the weights it streams, ``weight_bytes_per_step``, plus the stored K/V
  it attends over) / this machine's memory bandwidth (``machine_bandwidth``: a matrix-vector product over a 256 MB
  matrix, the way decode reads memory);
- ``compute_floor_s``: the step's arithmetic (2 x weights x batch) / this machine's speed on a large matrix product
  (``matmul_gflops``).

A step can be no faster than either; where the two lines cross is where decode stops being memory-bound.
``achieved_GBps`` is bytes read / measured step time, to read against the bandwidth (a small model's step is often bound
by neither: by the fixed cost of launching its operations).

``prefill_batching`` does the same for prompts: N prompts prefilled one after the other (the i-th gets its first token
after i prefills) against all N in one batch (all get theirs together).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from kvlab.experiments.bandwidth import StepProductsProbe, best_seconds, machine_bandwidth, weight_bytes_per_step
from kvlab.cache.static import StaticCache
from kvlab.device import now
from kvlab.model.decoder import Decoder
from kvlab.threads import LESSON_THREADS, check_threads, torch_threads
from kvlab.experiments.serving_run import check_positive_int, resolve_model

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class BatchScaling:
    """What ``batch_scaling`` measured: ``decode`` one row per batch size (``decode_scaling``, with the floors),
    ``prefill`` one row per way (``prefill_batching``), and ``machine``: this machine's bandwidth (GB/s) and
    matrix-product speed (GFLOP/s), measured in the run, and ``products_ms`` (``StepProductsProbe``), to set
    beside the batch-1 step."""

    decode: pd.DataFrame
    prefill: pd.DataFrame
    machine: dict
    settings: dict = field(default_factory=dict)


def matmul_gflops(device: torch.device, size: int | None = None, repeats: int = 3) -> float:
    """This machine's speed on one large fp32 matrix product, (size, size) @ (size, size), best of ``repeats``."""
    size = size or (4096 if device.type == "cuda" else 512)
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    return 2 * size**3 / best_seconds(lambda: a @ b, device, repeats) / 1e9


def measure_machine(device: torch.device, bandwidth_mb: int | None = None) -> dict:
    """Memory bandwidth (``machine_bandwidth``, GB/s) and matrix-product speed (GFLOP/s) of ``device``."""
    bandwidth_mb = bandwidth_mb or (1024 if device.type == "cuda" else 64)
    out = machine_bandwidth(device, bandwidth_mb, repeats=3)
    out["matmul_GFLOPs"] = matmul_gflops(device)
    out["bandwidth_GBps"] = out["matvec_GBps"]  # the floor uses the way decode reads memory
    return out


def _check(model: Decoder, sizes: Sequence[int], prompt_tokens: int, steps: int, repeats: int,
           threads: int | None) -> list[int]:
    check_threads(threads)
    sizes = sorted({int(b) for b in sizes})
    if not sizes:
        raise ValueError("batch_sizes is empty; give at least one batch size, e.g. (1, 8, 64)")
    for b in sizes:
        check_positive_int("each batch size", b)
    for name, v in (("prompt_tokens", prompt_tokens), ("steps", steps), ("repeats", repeats)):
        check_positive_int(name, v)
    if prompt_tokens + steps * repeats + 1 > model.config.max_position_embeddings:
        raise ValueError(f"prompt_tokens ({prompt_tokens}) + steps x repeats ({steps * repeats}) exceeds the model's "
                         f"{model.config.max_position_embeddings} positions; lower them")
    return sizes


@torch.inference_mode()
def decode_scaling(model: Decoder, batch_sizes: Sequence[int] = BATCH_SIZES, prompt_tokens: int = 8,
                   steps: int = 4, repeats: int = 3, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """Time ``steps`` greedy decode steps per batch size, ``repeats`` rounds taking turns (a busy moment on a
    shared machine hits every size alike); each batch holds ``prompt_tokens`` prefilled tokens first.

    Returns one row per batch size (see ``BatchScaling.decode``, without the floors) and the timings' raw lists.
    """
    cfg, device = model.config, model.device
    gen = torch.Generator().manual_seed(seed)
    caches, last = {}, {}
    for b in batch_sizes:  # (B, P) prompts into a cache sized for every step of every round
        cache = StaticCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, batch=b, dtype=model.dtype,
                            device=device, max_len=prompt_tokens + steps * repeats + 1)
        ids = torch.randint(0, cfg.vocab_size, (b, prompt_tokens), generator=gen).to(device)  # (B, P)
        last[b] = model(ids, cache, last_only=True)[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        caches[b] = cache
    times: dict[int, list[float]] = {b: [] for b in batch_sizes}
    for _ in range(repeats):
        for b in batch_sizes:
            for _ in range(steps):
                t0 = now(device)
                last[b] = model(last[b], caches[b])[:, -1].argmax(-1, keepdim=True)  # (B, 1): one token each
                times[b].append(now(device) - t0)
    weights = weight_bytes_per_step(model)
    per_token = cfg.kv_bytes_per_token(model.dtype.itemsize)
    context = prompt_tokens + (steps * repeats + 1) / 2  # tokens attended over, averaged across the steps
    rows = []
    for b in batch_sizes:
        t = np.array(times[b])
        med = float(np.median(t))
        kv = b * context * per_token
        rows.append(dict(batch=b, n=len(t), step_s=med, step_p25_s=float(np.quantile(t, 0.25)),
                         step_p75_s=float(np.quantile(t, 0.75)), per_seq_s=med / b, tokens_per_s=b / med,
                         weight_bytes=weights, kv_bytes=kv, achieved_GBps=(weights + kv) / med / 1e9))
    return pd.DataFrame(rows), times


@torch.inference_mode()
def prefill_batching(model: Decoder, prompts: int = 8, prompt_tokens: int = 32, repeats: int = 3,
                     seed: int = 0) -> pd.DataFrame:
    """``prompts`` prompts of ``prompt_tokens`` tokens, prefilled one by one and all in one batch, taking turns.

    One by one, prompt i has its first token when prefills 1..i are done; batched, every prompt has it when the one
    batched prefill is done. Medians over ``repeats`` of: until all have it, the mean, the first's.
    """
    for name, v in (("prompts", prompts), ("prompt_tokens", prompt_tokens), ("repeats", repeats)):
        check_positive_int(name, v)
    cfg, device = model.config, model.device
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (prompts, prompt_tokens), generator=gen).to(device)  # (N, P)

    def cache(b: int) -> StaticCache:
        return StaticCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, batch=b, dtype=model.dtype,
                           device=device, max_len=prompt_tokens)

    def one_by_one() -> list[float]:
        t0, ttft = now(device), []
        for i in range(prompts):
            model(ids[i:i + 1], cache(1), last_only=True)[:, -1].argmax(-1)  # (1,): its first token
            ttft.append(now(device) - t0)
        return ttft

    def batched() -> list[float]:
        t0 = now(device)
        model(ids, cache(prompts), last_only=True)[:, -1].argmax(-1)  # (N,): every first token at once
        return [now(device) - t0] * prompts

    one_by_one(), batched()  # warm-up: first allocations of these shapes
    runs: dict[str, list[list[float]]] = {"one by one": [], "batched": []}
    for _ in range(repeats):
        runs["one by one"].append(one_by_one())
        runs["batched"].append(batched())
    med = statistics.median
    return pd.DataFrame([dict(way=way, prompts=prompts, prompt_tokens=prompt_tokens, n=len(r),
                              all_first_s=med(max(x) for x in r), mean_ttft_s=med(sum(x) / len(x) for x in r),
                              first_ttft_s=med(x[0] for x in r)) for way, r in runs.items()])


def batch_scaling(model: Decoder | None = None, batch_sizes: Sequence[int] = BATCH_SIZES, prompt_tokens: int = 8,
                  steps: int = 4, repeats: int = 3, prompts: int = 8, prefill_tokens: int = 32,
                  threads: int | None = LESSON_THREADS, seed: int = 0, bandwidth_mb: int | None = None) -> BatchScaling:
    """This machine's limits, the decode step against the batch size, and batched against one-by-one prefill.

    ``threads`` CPU threads throughout, the limits' measurements included. A few seconds on 2 CPU cores.
    """
    model = resolve_model(model)
    sizes = _check(model, batch_sizes, prompt_tokens, steps, repeats, threads)
    with torch_threads(threads):
        machine = measure_machine(model.device, bandwidth_mb)
        machine.update(StepProductsProbe(model).measure(repeats))
        decode, _ = decode_scaling(model, sizes, prompt_tokens, steps, repeats, seed)
        prefill = prefill_batching(model, prompts, prefill_tokens, repeats, seed)
        machine["threads"] = torch.get_num_threads()
    bytes_per_step = decode["weight_bytes"] + decode["kv_bytes"]
    decode["memory_floor_s"] = bytes_per_step / (machine["bandwidth_GBps"] * 1e9)
    flops = 2 * decode["weight_bytes"] / model.dtype.itemsize * decode["batch"]  # a multiply-add per weight and row
    decode["compute_floor_s"] = flops / (machine["matmul_GFLOPs"] * 1e9)
    settings = dict(model=model.config.name, parameters=model.num_parameters(), device=str(model.device),
                    dtype=str(model.dtype), batch_sizes=sizes, prompt_tokens=prompt_tokens, steps=steps,
                    repeats=repeats, prompts=prompts, prefill_tokens=prefill_tokens, threads=machine["threads"],
                    seed=seed)
    return BatchScaling(decode, prefill, machine, settings)


def crossover_batch(result: BatchScaling) -> float:
    """The batch size where the compute floor meets the weights' memory floor (this machine's ridge point).

    = (weight bytes / bandwidth) / (arithmetic time per sequence); K/V reads are left out (they grow with the batch as
    the arithmetic does).
    """
    d = result.decode.iloc[0]
    weights_s = d["weight_bytes"] / (result.machine["bandwidth_GBps"] * 1e9)
    return float(weights_s / (d["compute_floor_s"] / d["batch"]))


__all__ = ["BATCH_SIZES", "BatchScaling", "batch_scaling", "crossover_batch", "decode_scaling",
           "matmul_gflops", "measure_machine", "prefill_batching"]
