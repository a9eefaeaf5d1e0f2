"""transformers' generate timed per step, the way kvlab's timeline times kvlab, and the bytes its caches hold.

``timed_generate`` runs ``model.generate`` greedily (batch 1, exactly ``new_tokens`` tokens) and stamps the clock where
kvlab's ``TokenLog`` does: a forward pre-hook stamps the start of the prefill, and a LogitsProcessor stamps the moment
each step's logits arrive (after the device's queued work), then reads the bytes of the cache it was handed (after the
stamp, so reading them falls in the next step, as ``cache.memory()`` does in kvlab's loop). ``transformers_cache_bytes``
counts those bytes as allocated: the storage behind every tensor a cache layer holds, quantized tensors opened down to
their packed codes, scales and shifts. ``kvlab.benchmarks`` (bench decode) and ``transformers_caches`` both time
transformers with it.
"""
from __future__ import annotations

import importlib.util
import inspect
from dataclasses import dataclass, field
from typing import Any

import torch

from kvlab.device import now

# A layer's position counter (StaticLayer: one int64 tensor), not keys or values: kvlab counts its own in Python ints.
COUNTERS = ("cumulative_length",)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def _storages(value: Any, found: dict[int, int]) -> None:
    """Record (data pointer -> bytes) of the storage behind every plain tensor inside ``value``."""
    if isinstance(value, torch.Tensor):
        if type(value) is not torch.Tensor and hasattr(value, "__tensor_flatten__"):
            inner, _ = value.__tensor_flatten__()  # a wrapper (quanto's QBitsTensor, PackedTensor): open it
            for name in inner:
                _storages(getattr(value, name), found)
        elif value.numel():
            storage = value.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()  # the whole storage, also behind a view
    elif isinstance(value, (tuple, list, dict)):  # HQQ keeps its scales and zeros in a dict
        for v in value.values() if isinstance(value, dict) else value:
            _storages(v, found)


def transformers_cache_bytes(cache: Any) -> int:
    """Bytes of the distinct storages a transformers cache's layers hold, as allocated.

    Every tensor attribute of every layer counts but ``COUNTERS``, each storage once, in full even when only a view of
    it is held.
    """
    found: dict[int, int] = {}
    for layer in getattr(cache, "layers", []):
        for name, value in vars(layer).items():
            if name not in COUNTERS:
                _storages(value, found)
    return sum(found.values())


@dataclass
class TransformersRun:
    """One timed ``generate``: its tokens, each step's seconds and the cache's bytes after each step."""

    tokens: list[int]
    step_s: list[float]  # step 0: the prefill and the first token; then one decode step per token
    wall_s: float
    cache: Any  # the cache generate used (the one passed in, or the one it made)
    cache_bytes: list[int] = field(default_factory=list)  # after each step; empty when no cache was passed in


def timed_generate(hf, prompt: list[int], new_tokens: int, device: torch.device | str = "cpu", cache: Any = None,
                   cache_implementation: str | None = None, cache_config: dict | None = None) -> TransformersRun:
    """Greedy ``hf.generate`` of exactly ``new_tokens`` tokens after ``prompt``, timed per step.

    Pass a cache object (``cache``; its bytes are then read after every step) or a ``cache_implementation`` name (with
    ``cache_config`` for "quantized": generate edits that dict in place, so a fresh copy is passed each call).
    """
    import transformers

    device = torch.device(device)
    stamps: list[float] = []
    starts: list[float] = []
    sizes: list[int] = []

    class Stamp(transformers.LogitsProcessor):
        """Records the time each step's logits arrive, then the bytes of the cache handed in."""

        def __call__(self, input_ids, scores):
            stamps.append(now(device))
            if cache is not None:
                sizes.append(transformers_cache_bytes(cache))
            return scores

    extra: dict[str, Any] = {}
    if cache is not None:  # the argument's name: `cache` in recent transformers, `past_key_values` before
        extra["cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"] = cache
    if cache_implementation is not None:
        extra["cache_implementation"] = cache_implementation
    if cache_config is not None:
        extra["cache_config"] = dict(cache_config)
    hook = hf.register_forward_pre_hook(lambda *_: starts.append(now(device)) if not starts else None)
    ids = torch.tensor([prompt], device=device)  # (1, T)
    try:
        t0 = now(device)
        # an explicit mask: without one, transformers masks every prompt token equal to pad_token_id
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                          logits_processor=transformers.LogitsProcessorList([Stamp()]),
                          return_dict_in_generate=True, **extra)
        wall = now(device) - t0
    finally:
        hook.remove()
    steps = [stamps[0] - starts[0]] + [b - a for a, b in zip(stamps, stamps[1:])]
    return TransformersRun(out.sequences[0, len(prompt):].tolist(), steps, wall,
                           cache if cache is not None else out.cache, sizes)


__all__ = ["COUNTERS", "TransformersRun", "timed_generate", "transformers_cache_bytes"]
