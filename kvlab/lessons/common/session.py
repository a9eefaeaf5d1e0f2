"""This kernel's run of a notebook, as the room wants it: every prediction compared and every claim shown.

``guess.against(...)`` (:mod:`.predict`) and ``verdicts(...)`` (:mod:`.claims`) note here what they showed,
the latest per question and per claim (a cell run twice counts once). ``share_run`` at a notebook's end hands
it all to :func:`kvlab.room.share`: with no name typed it shares nothing and says how to.
"""
from __future__ import annotations

from typing import Any

_COMPARISONS: dict[str, Any] = {}  # question -> the latest Comparison
_VERDICTS: dict[str, Any] = {}  # claim name -> the latest Verdict


def note_comparison(comparison: Any) -> None:
    _COMPARISONS[comparison.question] = comparison


def note_verdicts(verdicts: Any) -> None:
    _VERDICTS.update({v.claim.name: v for v in verdicts})


def noted(notebook: str) -> tuple[list, list]:
    """(comparisons, verdicts) noted in this kernel; the verdicts of ``notebook``'s claims only."""
    return list(_COMPARISONS.values()), [v for v in _VERDICTS.values() if v.claim.notebook == notebook]


def share_run(name: str, notebook: str, url: str | None = None, key: str | None = None, requests: Any = None,
              folder: str = ".") -> str:
    """Share this notebook's run with the room: saved as a file (``url`` None) or sent to the teacher's collector.

    ``name``: what the room calls you (nothing else personal goes in: ``kvlab.room.record``); empty: nothing is
    shared. ``requests``: notebook 09's client result, for the room's one service curve. Returns one line.
    """
    if not (isinstance(name, str) and name.strip()):
        return ("room: nothing shared. To add this run to your workshop's room, type your name in "
                "share_run(name=...) and, if your teacher gave one, the collector's url= (and key=); "
                "without a url the run is saved as a file to give to your teacher.")
    from kvlab.room import share

    comparisons, verdicts = noted(notebook)
    return share(name, notebook, predictions=comparisons, verdicts=verdicts, requests=requests, url=url, key=key,
                 folder=folder)


__all__ = ["note_comparison", "note_verdicts", "noted", "share_run"]
