"""The switch between cache strategies: a name -> its class and options, and ``make_cache`` to build one.

Each strategy is imported only when it is asked for by name, so a strategy module that fails to
import (or does not exist yet) costs only that strategy, with an error naming it.
"""
from __future__ import annotations

import importlib

import torch

from .base import KVCache

# name -> (module, class, options the class accepts beyond the shape)
STRATEGIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "none": ("kvlab.cache.none", "NoCache", ()),
    "dynamic": ("kvlab.cache.dynamic", "DynamicCache", ()),
    "static": ("kvlab.cache.static", "StaticCache", ("max_len",)),
    "quantized": ("kvlab.cache.quantized", "QuantizedCache", ("bits", "group_size", "residual")),
    "offloaded": ("kvlab.cache.offloaded", "OffloadedCache", ("max_len", "prefetch", "storage_dir", "link_gbps")),
}
CACHE_NAMES: tuple[str, ...] = tuple(STRATEGIES)


def cache_class(name: str) -> type[KVCache]:
    """The class implementing cache strategy ``name``."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown cache {name!r}; choose one of {', '.join(CACHE_NAMES)}")
    module, cls, _ = STRATEGIES[name]
    return getattr(importlib.import_module(module), cls)


def check_cache_options(name: str, options: dict) -> None:
    """Raise a clear error for an unknown cache name or an option that strategy does not take."""
    cache_class(name)
    allowed = STRATEGIES[name][2]
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        hint = ", ".join(allowed) if allowed else "no options"
        raise ValueError(f"cache {name!r} does not take option(s) {unknown}; it takes {hint}")


def make_cache(name: str, config, batch: int = 1, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", **options) -> KVCache:
    """Build an empty cache of strategy ``name`` shaped for a model ``config`` (a ModelConfig)."""
    check_cache_options(name, options)
    cls = cache_class(name)
    return cls(config.num_layers, config.num_kv_heads, config.head_dim, batch=batch, dtype=dtype,
               device=device, **options)


__all__ = ["CACHE_NAMES", "STRATEGIES", "cache_class", "check_cache_options", "make_cache"]
