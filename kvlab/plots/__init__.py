"""matplotlib figures from the experiments' DataFrames (each function returns a Figure, no pyplot state)."""
from __future__ import annotations

from .memory import plot_cache_memory, plot_kv_memory
from .slowdown import plot_slowdown
from .style import CACHE_COLORS, cache_color

__all__ = ["CACHE_COLORS", "cache_color", "plot_cache_memory", "plot_kv_memory", "plot_slowdown"]
