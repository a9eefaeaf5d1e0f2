"""The knee of a service curve: one rule, the same wherever a knee is printed.

Walk up the loads tested. A load **keeps up** when at least ``KEEPS_UP_RATIO`` (90%) of what was sent is served
and, given a TTFT target, the p95 time to first token is within it (a p95 that could not be read, because nothing
completed, does not keep up). The **knee** is the highest load tested before the first load that does not keep
up: the capacity at the target, known to one step of the grid of loads. So:

- a curve that falls behind and then keeps up again at a higher load has its knee before the first fall (a
  recovery past it is luck of the moment, not capacity to count on);
- a curve that keeps up at every load tested has no knee on its grid: the capacity is **at least** the highest
  load tested (``≥``; raise the loads to find it);
- a curve that is behind at its lowest load has no knee either: the capacity lies **below** the lowest load.

Every knee in kvlab comes from ``find_knee``: the lessons' service curves (``sweep.mark_knee``), the HTTP sweeps
of two and three engines and ``bench serve`` (``two_engines.knee``), the ``sweep`` command and the room view.
vLLM's and SGLang's benchmarks report the same quantities per request rate (throughput, TTFT and TPOT
percentiles) and leave the capacity to the reader; a knee rule is each team's own choice.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

KEEPS_UP_RATIO = 0.9  # a load keeps up when at least 90% of what was sent is served

KneeCase = Literal["knee", "kept_up", "behind_from_the_start"]


@dataclass(frozen=True)
class Knee:
    """Where a curve's knee is, and which of the three cases the curve is (the module docstring)."""

    case: KneeCase
    rps: float | None  # the knee's load; None when the curve has no knee on its grid
    index: int | None  # the knee's level; None when there is no knee
    lowest_rps: float  # the lowest and the highest load tested
    highest_rps: float

    @property
    def at_least(self) -> float | None:
        """The capacity's lower bound: the knee, or the highest load when every load kept up; None when behind."""
        return self.highest_rps if self.case == "kept_up" else self.rps

    def __str__(self) -> str:
        if self.case == "knee":
            return f"{self.rps:.3g} req/s"
        if self.case == "kept_up":
            return f"≥ {self.highest_rps:.3g} req/s (every load tested kept up: the knee lies beyond)"
        return f"< {self.lowest_rps:.3g} req/s (behind already at the lowest load tested)"


def keeps_up(served: float, ttft_p95_s: float | None = None, slo_ttft_s: float | None = None,
             min_served: float = KEEPS_UP_RATIO) -> bool:
    """One load's verdict: ``served``, the share of what was sent that was served (requests, or requests per
    second), at least ``min_served``, and, given ``slo_ttft_s``, ``ttft_p95_s`` within it (NaN or None: not)."""
    if not 0 < min_served <= 1:
        raise ValueError(f"min_served={min_served} must be in (0, 1], e.g. 0.9 for 90% served")
    ok = served is not None and math.isfinite(served) and served >= min_served
    if slo_ttft_s is not None:
        ok = ok and ttft_p95_s is not None and math.isfinite(ttft_p95_s) and ttft_p95_s <= slo_ttft_s
    return bool(ok)


def find_knee(offered: Sequence[float], keeps: Sequence[bool]) -> Knee:
    """The knee of a curve: ``offered`` loads, rising, and whether each ``keeps`` up (``keeps_up``)."""
    if len(offered) != len(keeps):
        raise ValueError(f"offered ({len(offered)}) and keeps ({len(keeps)}) must have one entry per load")
    if not len(offered):
        raise ValueError("a curve needs at least one load to have a knee")
    if any(b <= a for a, b in zip(offered, offered[1:])):
        raise ValueError("offered loads must rise strictly from level to level")
    low, high = float(offered[0]), float(offered[-1])
    for i, ok in enumerate(keeps):
        if not ok:
            if i == 0:
                return Knee("behind_from_the_start", None, None, low, high)
            return Knee("knee", float(offered[i - 1]), i - 1, low, high)
    return Knee("kept_up", None, None, low, high)


__all__ = ["KEEPS_UP_RATIO", "Knee", "KneeCase", "find_knee", "keeps_up"]
