"""The five KV cache strategies behind one switch: make_cache("none" | "dynamic" | "static" | "quantized" | "offloaded")."""
from __future__ import annotations

from kvlab.cache.base import CacheMemory, KVCache, causal_attention, kv_cache_bytes, tensor_bytes
from kvlab.cache.dynamic import DynamicCache
from kvlab.cache.none import NoCache
from kvlab.cache.offloaded import OffloadedCache
from kvlab.cache.quantized import QuantizedCache
from kvlab.cache.registry import CACHE_NAMES, STRATEGIES, cache_class, check_cache_options, make_cache
from kvlab.cache.static import StaticCache

__all__ = ["CACHE_NAMES", "STRATEGIES", "CacheMemory", "DynamicCache", "KVCache", "NoCache", "OffloadedCache",
           "QuantizedCache", "StaticCache", "cache_class", "causal_attention", "check_cache_options",
           "kv_cache_bytes", "make_cache", "tensor_bytes"]
