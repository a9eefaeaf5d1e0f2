"""What `bench decode` times and records: a Mode (implementation, cache, compiled), a Run (one timed generate call), and kvlab's runs.

A Mode names one row of the benchmark; a Run holds what one generate call measured (its wall time, every step's time,
its tokens, its cache's bytes and the K/V bytes one step reads). kvlab's side is here (``kvlab_modes``, ``run_kvlab``:
timed by kvlab's own timeline); transformers' side, timed from outside its ``generate``, is
``kvlab/benchmarks/transformers_runs.py``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from kvlab.cache import cache_class
from kvlab.device import now
from kvlab.generate import generate
from kvlab.model.decoder import Decoder

KVLAB_OPTIONS = {"quantized": {"bits": 4}}  # options per kvlab cache; the rest run with their defaults


@dataclass
class Mode:
    """One thing to time: an implementation, a cache strategy, compiled or not, its options, why it cannot run."""

    impl: str  # "kvlab" | "transformers"
    cache: str
    options: dict = field(default_factory=dict)
    reason: str | None = None  # None: runnable
    compiled: bool = False

    @property
    def label(self) -> str:
        return f"{self.impl}/{self.cache}" + (" compiled" if self.compiled else "")


@dataclass
class Run:
    """One timed generate call."""

    wall_s: float
    step_s: list[float]  # step 0 is the prefill
    tokens: list[int]
    cache_bytes: int
    kv_read_bytes: float  # K/V bytes one decode step reads, at the mean position
    compile_s: float | None = None

    @property
    def decode_s(self) -> float:
        return statistics.median(self.step_s[1:])  # the median decode step (runs have >= 2 tokens)


def kvlab_modes(names: list[str], compile_: bool) -> list[Mode]:
    modes = []
    for name in names:
        try:
            cache_class(name)
            reason = None
        except ImportError as e:  # the strategy's module has not landed
            reason = f"kvlab/cache/{name}.py cannot be imported ({type(e).__name__}: {e})"
        modes.append(Mode("kvlab", name, dict(KVLAB_OPTIONS.get(name, {})), reason))
    if compile_ and "static" in names:
        modes.append(Mode("kvlab", "static", {}, None, compiled=True))
    return modes


def kv_tokens_read(mode: Mode, prompt: int, new: int) -> float:
    """Tokens of K/V one decode step reads, on average over the run (see the module docstring)."""
    if mode.cache == "none":
        return 0.0  # recomputes K/V from the tokens: reads no cache
    if mode.cache == "static" and (mode.compiled or mode.impl == "transformers"):
        return float(prompt + new)  # fixed shapes: attends over every slot, the empty ones masked
    return prompt + new / 2  # what is stored, at the mean position


def run_kvlab(model: Decoder, prompt: list[int], mode: Mode, new: int, kv_per_token: int, backend: str) -> Run:
    extra: dict[str, Any] = {"compile": True, "compile_backend": backend} if mode.compiled else {}
    t0 = now(model.device)
    result = generate(model, prompt, cache=mode.cache, max_new_tokens=new, **mode.options, **extra)
    wall = now(model.device) - t0
    bytes_ = result.cache.memory().allocated_bytes
    kv_read = (float(result.timeline.cache_bytes[len(result.timeline.cache_bytes) // 2])  # quantized: what it stores
               if mode.cache == "quantized" else kv_per_token * kv_tokens_read(mode, len(prompt), new))
    if hasattr(result.cache, "close"):
        result.cache.close()  # the offloaded cache's file
    return Run(wall, list(result.timeline.step_s), result.tokens, bytes_, kv_read, result.settings.get("compile_s"))


__all__ = ["KVLAB_OPTIONS", "Mode", "Run", "kv_tokens_read", "kvlab_modes", "run_kvlab"]
