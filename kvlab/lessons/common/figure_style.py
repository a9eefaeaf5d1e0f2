"""One colour per cache strategy, so every figure of the lab speaks the same visual language."""
from __future__ import annotations

CACHE_COLORS: dict[str, str] = {
    "none": "#d62728",  # red: the baseline that recomputes
    "dynamic": "#1f77b4",
    "static": "#2ca02c",
    "quantized": "#9467bd",
    "offloaded": "#ff7f0e",
}


def cache_color(name: str) -> str:
    """The lab's colour for cache ``name`` (grey for anything else)."""
    return CACHE_COLORS.get(name, "#7f7f7f")
