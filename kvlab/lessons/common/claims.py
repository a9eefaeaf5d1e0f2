"""Claims: a sentence about a measurement, checked on the learner's own run and shown with its verdict.

A notebook never types a measured number into its prose. It states a claim, and the claim is
evaluated on the results the learner just produced::

    from kvlab.lessons import verdicts
    verdicts(result, "later_tokens_cost_more")

shows ``✓ on your run: token 194 took 2.5× as long as token 20 (work 4.3×)`` or
``✗ not on your run: … — what to look at, and why it can happen``.

Writing a claim (notebook authors): in the lesson's ``kvlab/lessons/lNN_<notebook>/claims.py``::

    @claim("01_the_slowdown.ipynb", clock="wall",
           says="token {late} took {measured:.1f}× as long as token {early} (work {work:.1f}×)",
           otherwise="a busy machine makes single steps jump; press Run again, or raise repeats")
    def later_tokens_cost_more(result) -> dict:
        ...
        return {"late": 194, "early": 20, "measured": m, "work": w, "holds": m > 1.2}

The function reads the experiment's result and returns the numbers the sentence quotes plus
``holds``, the check. ``says`` and ``otherwise`` may be triple-quoted paragraphs: ``claim`` folds their
whitespace into single spaces. ``clock`` says what the claim rests on: ``"deterministic"`` (virtual time,
counts, byte formulas: the same on every machine, so nbval checks the verdict) or ``"wall"`` (measured time: a
qualitative fact with a margin, whose hold rate is recorded by ``scripts/claims_robustness.py``). ``otherwise``
tells the learner what to look at when the claim does not hold on their run.

Then register its example and, for a wall-clock claim that asserts, its counterexample (a copy of that result
edited so that the sentence is false) in ``tests/claim_examples/lNN_<notebook>.py`` with ``@example(name)`` and
``@counterexample(name)``; ``tests/test_claims.py`` checks that the counterexample is marked ✗, so a check looser
than its sentence is caught.
"""
from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping

from kvlab.lessons.common.fold import folded
from kvlab.lessons.common.session import note_verdicts

__all__ = ["CLAIMS", "Claim", "Verdict", "Verdicts", "claim", "claims_for", "frame_of", "median_se", "verdicts"]

Clock = Literal["deterministic", "wall"]


@dataclass(frozen=True)
class Verdict:
    """One claim checked on one run: whether it holds and the sentence with that run's numbers."""

    claim: "Claim"
    holds: bool | None  # None: the run does not hold what the claim needs (say, a skipped step)
    text: str
    values: Mapping[str, Any] = field(default_factory=dict)
    asserted: bool = True  # False: shown with its n, never ✓ or ✗ (an observation, or a run that cannot refute it)

    def __bool__(self) -> bool:
        return bool(self.holds)

    def __str__(self) -> str:
        if self.holds is None:
            return f"· not checked on your run: {self.text}"
        if not self.asserted:
            return f"• on your run: {self.text}"
        if self.holds:
            return f"✓ on your run: {self.text}"
        return f"✗ not on your run: {self.text} — {self.claim.otherwise}"

    __repr__ = __str__

    def _repr_html_(self) -> str:
        color = {True: "#1b7f3b", False: "#b00020", None: "#555"}[self.holds if self.asserted else None]
        return f'<div class="kvlab-claim" style="color:{color}">{html.escape(str(self))}</div>'


class Verdicts(list):
    """Several verdicts, shown one per line (a notebook cell's last expression).

    ``fold``: lines off the main path, shown folded under "every check on your run" (the plain text stays whole,
    for nbval and a terminal). ``after``: a prediction box (anything with ``.value``) whose answer these lines give
    away: while its ``value`` is None the lines are folded into a ``<details>`` the learner clicks to open, and the
    plain text says how to show them and holds none of their numbers.
    """

    def __init__(self, verdicts: Iterable[Verdict] = (), after: Any = None, fold: bool = False) -> None:
        super().__init__(verdicts)
        self.after, self.fold = after, fold

    @property
    def hidden(self) -> bool:
        """True while the prediction these checks would answer has not been made."""
        return self.after is not None and getattr(self.after, "value", None) is None

    def __str__(self) -> str:
        if self.hidden:
            return ("checks on your run hidden until you predict: type your number in the box above, then run "
                    "this cell again (in a notebook, a click on this line shows them).")
        return "\n".join(map(str, self))

    __repr__ = __str__

    def _repr_html_(self) -> str:
        lines = "".join(v._repr_html_() for v in self)
        if self.fold:
            marks = "".join(str(v)[:1] for v in self)
            lines = (f'<details class="{CHECKS_CLASS}"><summary>every check on your run ({len(self)}: {marks})'
                     f'</summary>{lines}</details>')
        if not self.hidden:
            return lines
        return folded("🔒 checks on your run hidden until you predict: type your number in the box above and run this "
                      "cell again — or click here to show them", lines, indent=False)


@dataclass(frozen=True)
class Claim:
    """A sentence about an experiment's result, with the check that decides whether a run supports it."""

    name: str
    notebook: str
    says: str  # a format string over the values the measure returns
    measure: Callable[[Any], Mapping[str, Any]]  # result -> values quoted in ``says`` plus "holds"
    otherwise: str  # what to look at when it does not hold, and why that can happen
    clock: Clock
    asserts: bool = True  # False: a measurement shown with its n, not a fact that could fail (too run-dependent)

    def on(self, result: Any) -> Verdict:
        """Check this claim on ``result``; never raises (a run it cannot read is "not checked")."""
        try:
            values = dict(self.measure(result))
        except Exception as exc:  # a claim must never break a learner's notebook
            return Verdict(self, None, f"{self.name} could not read this run ({type(exc).__name__}: {exc})")
        holds = values.pop("holds", None)
        because = values.pop(SHOWN_ONLY, None)  # this run cannot refute it (say, a modelled link): shown, not checked
        try:
            text = self.says.format(**values)
        except (KeyError, ValueError, TypeError) as exc:
            text = f"{self.says} [values {values}: {exc}]"
        if because:
            text += f" (shown, not checked: {because})"
        return Verdict(self, None if holds is None else bool(holds), text, values,
                       asserted=self.asserts and not because)


CLAIMS: dict[str, Claim] = {}
CHECKS_CLASS = "kvlab-checks"  # the fold of claim lines off the main path (kvlab.reading leaves them out)
# A measure may return this key with a reason when the run it reads cannot make the claim fail (it would hold by
# construction there): the verdict is then shown with its numbers and the reason, as an observation (•).
SHOWN_ONLY = "shown_only_because"


def claim(notebook: str, *, says: str, otherwise: str, clock: Clock, asserts: bool = True,
          ) -> Callable[[Callable[[Any], Mapping[str, Any]]], Claim]:
    """Register the decorated measure as a claim of ``notebook`` (see the module docstring).

    ``asserts=False`` makes it an observation: a run-dependent measurement shown with its n
    (``• on your run: …``), never marked ✓ or ✗, because on some machines and loads it goes either way.
    Its measure still returns ``holds`` (True when the run could be read).
    """
    if clock not in ("deterministic", "wall"):
        raise ValueError(f"clock must be 'deterministic' or 'wall', got {clock!r}")

    says, otherwise = " ".join(says.split()), " ".join(otherwise.split())  # a paragraph becomes one line

    def register(measure: Callable[[Any], Mapping[str, Any]]) -> Claim:
        name = measure.__name__
        if name in CLAIMS:
            raise ValueError(f"a claim named {name!r} is already registered (for {CLAIMS[name].notebook})")
        CLAIMS[name] = Claim(name, notebook, says, measure, otherwise, clock, asserts)
        return CLAIMS[name]

    return register


def claims_for(notebook: str) -> list[Claim]:
    """The claims registered for ``notebook``, in the order they were defined."""
    return [c for c in CLAIMS.values() if c.notebook == notebook]


def verdicts(result: Any, *names: str, after: Any = None, fold: bool = False) -> Verdicts:
    """Check the named claims on ``result`` and show them, one line each.

    ``fold=True``: checks the story does not need on its main path, folded under "every check on your run"
    (a notebook shows at most ``MAIN_PATH_CLAIMS`` lines unfolded, ``tests/test_reading.py``).
    ``after=guess`` (the ``predict(...)`` box whose answer these lines state) keeps them folded until
    the learner has made that prediction (see :class:`Verdicts`).
    """
    unknown = [n for n in names if n not in CLAIMS]
    if unknown:
        raise ValueError(f"no claim named {unknown}; registered: {sorted(CLAIMS)}")
    if after is not None and not hasattr(after, "value"):
        raise TypeError(f"after= takes the prediction box these checks answer (guess = predict(...)), "
                        f"not {type(after).__name__}")
    shown = Verdicts((CLAIMS[n].on(result) for n in names), after=after, fold=fold)
    note_verdicts(shown)  # for the room (session.share_run)
    return shown


def frame_of(result: Any) -> Any:
    """The table a claim reads: a panel result's ``.frame``, or the result itself (already a frame)."""
    return getattr(result, "frame", result)


def median_se(p50: float, p95: float, n: int) -> float:
    """The standard error of a median of ``n`` values, estimated from their own spread: the sd read off the gap from
    the median to the 95th percentile ((p95 - p50) / 1.645, as for a normal distribution; a long upper tail makes
    it larger, so a margin built on it errs on the safe side), times sqrt(pi / 2) / sqrt(n).

    What a wall-clock claim comparing two medians of one run uses as that run's own margin: a difference counts
    when it passes twice the standard error of the difference (``hypot`` of the two)."""
    n = int(n)
    if n < 1:
        raise ValueError("a median of no values has no standard error")
    return max(float(p95) - float(p50), 0.0) / 1.645 * math.sqrt(math.pi / 2 / n)
