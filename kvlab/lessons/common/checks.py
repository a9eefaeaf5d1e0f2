"""Checks that several claims share: "rises over every level" and "more than the run's own noise".

A wall-clock sentence that says a quantity *rises* with the load is checked at every level, not
only at the ends; one that says a policy serves *more* is checked against the noise the same run
measured. Both are kvlab's conventions for its claims, stated here once with their tolerances.
"""
from __future__ import annotations

from typing import Iterable

__all__ = ["TIE", "listing", "rises_at_every_level", "series"]

# Two neighbouring levels that barely differ in load (both below capacity, say) give the same quantile up
# to the machine's jitter: a p50 or p95 of a dozen requests rests on one or two of them, and a step on a
# shared CPU varies by some percent. A later level may come out below the one before by up to this share
# and still count as a tie, not a fall. A real fall (0.11 s -> 0.017 s) is far outside it.
TIE = 0.10


def rises_at_every_level(values: Iterable[float], tie: float = TIE, overall: float = 1.05) -> bool:
    """True when no level is below ``(1 - tie)`` × the one before and the last is above ``overall`` × the first.

    ``values`` in the order of the levels (lowest load first). Fewer than two values: False (nothing rises).
    """
    if not 0 <= tie < 1:
        raise ValueError(f"tie must be in [0, 1), got {tie}")
    v = [float(x) for x in values]
    return len(v) >= 2 and all(b >= (1 - tie) * a for a, b in zip(v, v[1:])) and v[-1] > overall * v[0]


def series(values: Iterable[float], fmt: str = "{:.1f}", scale: float = 1.0, sep: str = " → ") -> str:
    """``"1.2 → 3.4 → 5.6"``: a level-by-level series, each value times ``scale``."""
    return sep.join(fmt.format(float(x) * scale) for x in values)


def listing(items: Iterable[object]) -> str:
    """``"a, b and c"``: the items as a sentence lists them."""
    *rest, last = map(str, items)
    return f"{', '.join(rest)} and {last}" if rest else last
