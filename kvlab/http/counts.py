"""Where every completion request is, counted so the counts always add up: sent = ended + waiting + running.

Each request the server receives is counted once as sent and is, at every instant, in exactly one place: waiting
(received, no token answered yet: being read and checked, queued in the engine, or prefilling), running (its answer is
streaming), or ended with one outcome. The outcomes fold into four kinds: completed, failed (the engine could not
finish it), cancelled (the client left) and rejected (refused before any work: bad input, a full queue, a stopped
engine, no API key). Every change happens on the event loop, with no await between the two halves of a move, so a
`/metrics` read anywhere sees counts that add up.
"""

from __future__ import annotations

import collections
from typing import Literal, get_args

# outcome -> kind. The outcomes are the `kvlab_requests_total{outcome=...}` series (notebook 09 reads them).
Outcome = Literal["completed", "failed", "cancelled", "rejected_queue_full", "rejected_unavailable", "invalid_request",
                  "model_not_found", "unauthorized"]
Kind = Literal["completed", "failed", "cancelled", "rejected"]
OUTCOMES: dict[Outcome, Kind] = {
    "completed": "completed", "failed": "failed", "cancelled": "cancelled",
    "rejected_queue_full": "rejected", "rejected_unavailable": "rejected", "invalid_request": "rejected",
    "model_not_found": "rejected", "unauthorized": "rejected",
}
KINDS: tuple[Kind, ...] = get_args(Kind)
PLACES = ("waiting", "running")
assert set(get_args(Outcome)) == set(OUTCOMES) and set(OUTCOMES.values()) == set(KINDS)  # one list of each


class RequestCounts:
    """The server's request counters: `outcomes` by name, and the places of the requests in flight."""

    def __init__(self) -> None:
        self.outcomes: collections.Counter = collections.Counter({k: 0 for k in OUTCOMES})
        self.sent = 0
        self.in_place = {p: 0 for p in PLACES}

    def arrive(self) -> "Tally":
        """A request was received: counted as sent, and waiting."""
        self.sent += 1
        self.in_place["waiting"] += 1
        return Tally(self)

    def totals(self) -> dict[str, int]:
        """sent, each kind of end, waiting and running (sent is the sum of the rest)."""
        kinds: dict[str, int] = {k: sum(n for o, n in self.outcomes.items() if OUTCOMES[o] == k) for k in KINDS}
        return {"sent": self.sent, **kinds, **self.in_place}

    def add_up(self) -> bool:
        t = self.totals()
        return t["sent"] == sum(t[k] for k in (*KINDS, *PLACES))


class Tally:
    """One request's place in the counts: waiting, then (maybe) running, then ended once with its outcome."""

    __slots__ = ("counts", "place", "outcome")
    counts: RequestCounts
    place: str
    outcome: Outcome | None

    def __init__(self, counts: RequestCounts) -> None:
        self.counts, self.place, self.outcome = counts, "waiting", None

    @property
    def ended(self) -> bool:
        return self.outcome is not None

    def running(self) -> None:
        """Its first token is on the way to the client."""
        if self.place == "waiting":
            self.counts.in_place["waiting"] -= 1
            self.counts.in_place["running"] += 1
            self.place = "running"

    def end(self, outcome: Outcome) -> bool:
        """Count the request's outcome; only its first end counts (False for any later one)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"unknown outcome {outcome!r}; one of {', '.join(OUTCOMES)}")
        if self.outcome is not None:
            return False
        self.counts.in_place[self.place] -= 1
        self.counts.outcomes[outcome] += 1
        self.place, self.outcome = "ended", outcome
        return True
