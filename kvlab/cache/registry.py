"""The switch between cache strategies: a name -> its class and options, and ``make_cache`` to build one.

``STRATEGIES`` names each strategy by module and class, so this one table lists every strategy and
the options it takes. ``kvlab.cache`` imports every strategy module when it is imported (its classes
are importable from there), so a strategy that fails to import fails ``import kvlab`` at once with
the file named, rather than the first run that asks for it by name, possibly inside a timed region.
"""
from __future__ import annotations

import importlib

import torch

from kvlab.cache.base import KVCache

# name -> (module, class, options the class accepts beyond the shape)
STRATEGIES: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "none": ("kvlab.cache.none", "NoCache", ()),
    "dynamic": ("kvlab.cache.dynamic", "DynamicCache", ()),
    "static": ("kvlab.cache.static", "StaticCache", ("max_len",)),
    "quantized": ("kvlab.cache.quantized", "QuantizedCache", ("bits", "group_size", "residual")),
    "offloaded": ("kvlab.cache.offloaded", "OffloadedCache", ("max_len", "prefetch", "storage_dir", "link_gbps")),
}
CACHE_NAMES: tuple[str, ...] = tuple(STRATEGIES)
# name -> (module, class) of the strategy's fixed-shape variant: every decode step has the same shapes,
# so ``torch.compile`` builds one program and replays it (``generate(..., compile=True)``, kvlab/compiled.py)
FIXED_SHAPE: dict[str, tuple[str, str]] = {"static": ("kvlab.cache.static", "FixedShapeStaticCache")}


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


def sized_options(name: str, options: dict, tokens: int) -> dict:
    """``options`` for strategy ``name``, with ``max_len`` set to ``tokens`` where the strategy takes one
    (it preallocates) and none was given: a cache sized to the prompt and the tokens it will generate."""
    if "max_len" in STRATEGIES[name][2]:
        return {**options, "max_len": options.get("max_len", tokens)}
    return dict(options)


def make_cache(name: str, config, batch: int = 1, dtype: torch.dtype = torch.float32,
               device: torch.device | str = "cpu", fixed_shape: bool = False, **options) -> KVCache:
    """Build an empty cache of strategy ``name`` shaped for a model ``config`` (a ModelConfig).

    ``fixed_shape=True`` builds the strategy's fixed-shape variant (``FIXED_SHAPE``), for a compiled decode step.
    """
    check_cache_options(name, options)
    if fixed_shape:
        if name not in FIXED_SHAPE:
            raise ValueError(f"cache {name!r} has no fixed-shape variant; {', '.join(FIXED_SHAPE)} has one")
        module, cls_name = FIXED_SHAPE[name]
        cls = getattr(importlib.import_module(module), cls_name)
    else:
        cls = cache_class(name)
    return cls(config.num_layers, config.num_kv_heads, config.head_dim, batch=batch, dtype=dtype,
               device=device, **options)


__all__ = ["CACHE_NAMES", "FIXED_SHAPE", "STRATEGIES", "cache_class", "check_cache_options", "make_cache",
           "sized_options"]
