"""Interleaved rounds on a shared machine: paired ratios with their spread, and the machine's load.

On a machine others share, one implementation measured after another compares two moments, not two implementations: a
neighbour's burst can halve either figure. So a benchmark runs every implementation once per *round*, in an order
rotated from round to round, and compares them *within* a round: the ratio A/B of round r pairs two runs a few seconds
apart, which a slow spell slows alike. What is reported is the median of those per-round ratios with their spread (the
interquartile range and min-max over rounds), never a ratio of two medians taken at different times; the load average
before and after says how busy the machine was.
"""
from __future__ import annotations

import os
from typing import Sequence, TypeVar

import numpy as np

T = TypeVar("T")


def rotated(items: Sequence[T], round_index: int) -> list[T]:
    """``items`` started at position ``round_index`` (mod len): over len(items) rounds each runs first once."""
    if not items:
        return []
    k = round_index % len(items)
    return list(items[k:]) + list(items[:k])


def spread(values: Sequence[float]) -> dict:
    """Median, interquartile range (q1, q3), min, max and count of ``values`` (NaN-free), and the values."""
    v = np.asarray([x for x in values if x is not None and np.isfinite(x)], dtype=float)
    if v.size == 0:
        return {"median": None, "q1": None, "q3": None, "min": None, "max": None, "n": 0, "values": []}
    q1, med, q3 = np.percentile(v, [25, 50, 75])
    return {"median": float(med), "q1": float(q1), "q3": float(q3), "min": float(v.min()), "max": float(v.max()),
            "n": int(v.size), "values": [float(x) for x in values]}


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> dict:
    """``spread`` of a[r] / b[r] over rounds r: each ratio pairs two runs of the same round."""
    if len(a) != len(b):
        raise ValueError(f"paired ratios need one value of each side per round; got {len(a)} and {len(b)}")
    return spread([x / y if y else float("nan") for x, y in zip(a, b)])


def load_average() -> dict:
    """The machine's load average over 1, 5 and 15 minutes (runnable processes; a 2-core machine is full at 2)."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:  # not available on this platform
        return {"1m": None, "5m": None, "15m": None}
    return {"1m": one, "5m": five, "15m": fifteen}


def format_spread(s: dict, fmt: str = "{:.2f}", unit: str = "") -> str:
    """``1.31x [IQR 1.25-1.40, min-max 1.10-1.52]``: a median never without its spread."""
    if not s or s.get("median") is None:
        return "-"
    f = fmt.format
    return f"{f(s['median'])}{unit} [IQR {f(s['q1'])}-{f(s['q3'])}, min-max {f(s['min'])}-{f(s['max'])}]"


def format_load(before: dict, after: dict) -> str:
    cpus = os.cpu_count() or 0
    b, a = before.get("1m"), after.get("1m")
    if b is None or a is None:
        return "load average: not available here"
    return (f"load average (1 min) before {b:.2f}, after {a:.2f} on {cpus} CPUs "
            f"(5 min: {before['5m']:.2f} -> {after['5m']:.2f})")


__all__ = ["format_load", "format_spread", "load_average", "paired_ratio", "rotated", "spread"]
