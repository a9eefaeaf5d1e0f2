"""Loaded into the kernel of a notebook run (tests/notebook_run.py, scripts/claims_robustness.py --notebooks):
keeps the result each claim was decided on, and the mark its line showed.

The notebook's ``verdicts(result, *names)`` is wrapped (once ``kvlab`` is imported, before the cell that calls
it runs): the result is pickled at the moment of the call, one file per claim named, in the folder the test
session gives. The claims tests then check every claim, and edit it into its counter-example, on the very run the
notebook showed (``tests/test_claims.py``), instead of running each lesson's experiment a second time. Each line's
mark (✓ ✗ • ·) goes into the folder's ``claims.json`` too (``read_marks``), so a script counts, per claim, the runs
in which it held. Nothing is printed or displayed, and the notebook's own ``verdicts`` still does all the work.
"""
from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path
from typing import Any

_FOLDER: list[Path] = []
_RESULTS: list[bool] = []  # whether to pickle the results (start(..., results=False): the marks alone)
_MARKS: dict[str, str] = {}  # claim name -> the mark of its last line in this kernel
MARKS_FILE = "claims.json"


def mark(verdict: Any) -> str:
    """The mark a verdict's line starts with: ✓ holds, ✗ does not, • an observation, · not checked."""
    return str(verdict)[:1]


def read_marks(folder: str | Path) -> dict[str, str]:
    """{claim name: mark} of the lines a run recorded into ``folder`` ({} where it recorded none)."""
    path = Path(folder) / MARKS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


def _frame_of(result):
    """What the claims read: a panel result's table (with its ``attrs``), or the result itself."""
    from kvlab.lessons.common.panel import PanelResult

    return result.frame if isinstance(result, PanelResult) else result


def _recording(verdicts):
    def recorded(result, *names, **kwargs):
        shown = verdicts(result, *names, **kwargs)
        try:
            _MARKS.update({v.claim.name: mark(v) for v in shown})
            (_FOLDER[0] / MARKS_FILE).write_text(json.dumps(_MARKS, ensure_ascii=False), encoding="utf-8")
        except Exception:  # never the notebook's problem
            pass
        if not _RESULTS[0]:
            return shown
        try:
            blob = pickle.dumps(_frame_of(result))
        except Exception:  # a result that does not pickle: the test makes the claim's example instead
            return shown
        for name in names:
            (_FOLDER[0] / f"{name}.pkl").write_bytes(blob)
        return shown

    recorded.kvlab_recorded = True
    return recorded


def _wrap() -> None:
    if "kvlab" not in sys.modules:
        return
    import kvlab.lessons as lessons
    from IPython import get_ipython

    if not getattr(lessons.verdicts, "kvlab_recorded", False):
        lessons.verdicts = _recording(lessons.verdicts)
    ns = get_ipython().user_ns
    if "verdicts" in ns and not getattr(ns["verdicts"], "kvlab_recorded", False):
        ns["verdicts"] = _recording(ns["verdicts"])


def start(folder: str, results: bool = True) -> None:
    """Record into ``folder`` from the next cell on (``results=False``: the marks alone, no pickled results)."""
    from IPython import get_ipython

    _FOLDER.append(Path(folder))
    _RESULTS.append(results)
    _FOLDER[0].mkdir(parents=True, exist_ok=True)
    get_ipython().events.register("pre_execute", _wrap)
