"""Loaded into the kernel of a notebook run (tests/notebook_run.py): records the text of every figure drawn.

Every PNG of a figure, whether IPython's inline backend or a panel renders it, goes through
``FigureCanvasBase.print_figure``; the wrapper keeps its titles, labels, legends and annotations
with the execution count of the cell that drew it, so a test can search the text inside figures
(a PNG cannot be searched). Nothing is printed or displayed: the outputs stay what they are.
"""
from __future__ import annotations

from matplotlib.backend_bases import FigureCanvasBase
from matplotlib.text import Text

RECORDS: list[tuple[int, list[str]]] = []  # (execution count, the figure's texts)
_print_figure = FigureCanvasBase.print_figure
_cell = {"count": -1}  # the execution count of the cell running now; the inline backend draws after the cell's code


def _pre_execute() -> None:
    from IPython import get_ipython

    _cell["count"] = get_ipython().execution_count


def _texts(figure) -> list[str]:
    return [t.get_text() for t in figure.findobj(Text) if t.get_text().strip()]


def _recording_print_figure(self, *args, **kwargs):
    try:
        if not getattr(self.figure, "kvlab_folded", False):  # drawn inside a fold: not shown before the click
            RECORDS.append((_cell["count"], _texts(self.figure)))
    except Exception:  # a record is never worth breaking a learner's figure
        pass
    return _print_figure(self, *args, **kwargs)


FigureCanvasBase.print_figure = _recording_print_figure
try:
    from IPython import get_ipython

    get_ipython().events.register("pre_execute", _pre_execute)
except Exception:  # not in a kernel: nothing to attribute
    pass
