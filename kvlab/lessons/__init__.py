"""The course's lessons: one folder per notebook over what they share.

``lNN_<notebook>/`` holds everything notebook NN runs: its experiments (returning DataFrames), its
figures (``figures*.py``), its panel (``panel*.py``), the claims it checks on the learner's run
(``claims.py``) and its exercises' checkers (``exercises.py``). ``common/`` holds the frameworks they
share. A lesson may reuse another lesson's experiment (02 times 01's run), never its panel, figures,
claims or exercises (``tests/test_layers.py``). Importing this package registers every lesson's claims
and exercises, so a notebook's ``from kvlab.lessons import verdicts`` finds each claim by name.
"""
from __future__ import annotations

import importlib
import pkgutil

from kvlab.lessons.common.claims import CLAIMS, Claim, Verdict, Verdicts, claim, claims_for, verdicts
from kvlab.lessons.common.exercises import EXERCISES, exercises_for

# The lesson folders, in course order (lNN_<notebook name>); each registers its claims and exercises.
LESSONS: tuple[str, ...] = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)
                                        if m.ispkg and m.name[:1] == "l" and m.name[1:3].isdigit()))
for _lesson in LESSONS:
    for _part in ("claims", "exercises"):
        importlib.import_module(f"{__name__}.{_lesson}.{_part}")

__all__ = ["CLAIMS", "Claim", "EXERCISES", "LESSONS", "Verdict", "Verdicts", "claim", "claims_for",
           "exercises_for", "verdicts"]
