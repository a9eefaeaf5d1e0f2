"""Loaded into the kernel of a notebook run (tests/notebook_run.py): keeps the result each claim was decided on.

The notebook's ``verdicts(result, *names)`` is wrapped (once ``kvlab`` is imported, before the cell that calls
it runs): the result is pickled at the moment of the call, one file per claim named, in the folder the test
session gives. The claims tests then check every claim, and edit it into its counter-example, on the very run the
notebook showed (``tests/test_claims.py``), instead of running each lesson's experiment a second time. Nothing is
printed or displayed, and the notebook's own ``verdicts`` still does all the work.
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

_FOLDER: list[Path] = []


def _frame_of(result):
    """What the claims read: a panel result's table (with its ``attrs``), or the result itself."""
    from kvlab.lessons.common.panel import PanelResult

    return result.frame if isinstance(result, PanelResult) else result


def _recording(verdicts):
    def recorded(result, *names, **kwargs):
        shown = verdicts(result, *names, **kwargs)
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


def start(folder: str) -> None:
    """Record into ``folder`` from the next cell on."""
    from IPython import get_ipython

    _FOLDER.append(Path(folder))
    _FOLDER[0].mkdir(parents=True, exist_ok=True)
    get_ipython().events.register("pre_execute", _wrap)
