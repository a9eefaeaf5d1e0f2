"""Where a result came from: the notebook cell that produced it, so a prediction can prove it was asked first.

An experiment a notebook runs is decorated with ``@experiment``; its return value is noted with the number of
the cell that ran it (``cell_of(result)``). ``predict(...)`` notes the cell that asked the question, and
``guess.against(result, measure)`` compares the two: a result produced before its question was asked is an
answer the learner saw before guessing (``tests/test_notebooks.py`` fails a notebook on such an order).

The cell number is kvlab's own count of the cells the kernel ran, advanced on IPython's ``pre_run_cell``
event, which every way of running a notebook fires: JupyterLab, the classic Notebook, Colab, VS Code,
nbclient and papermill, and nbval. IPython's ``execution_count`` is no such count: a runner that stores no
history (nbval) holds it still, and IPython 9 advances it before a cell runs where IPython 7 did so after.
A button pressed between cells counts as the next cell, as Jupyter's ``In [n]`` would number it. Outside a
kernel (a script, a unit test) there is no cell, and nothing is noted.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# id(result) -> (result, cell): the result is held so that its id is never reused by another object.
_PRODUCED: dict[int, tuple[Any, int]] = {}


class CellCounter:
    """The cells a kernel has run since kvlab first looked: one more on each ``pre_run_cell`` event."""

    def __init__(self) -> None:
        self.count = 1  # the cell that first asks is cell 1: it is running (a cell imports kvlab)
        self.running = True

    def pre_run_cell(self, *_info: Any) -> None:
        self.count += 1
        self.running = True

    def post_run_cell(self, *_result: Any) -> None:
        self.running = False

    @property
    def now(self) -> int:
        """The cell running now; between cells (a button's callback), the next one."""
        return self.count if self.running else self.count + 1


def cell_counter(shell: Any) -> CellCounter:
    """The counter kept on ``shell`` (registered on its events the first time: once per kernel, however often
    kvlab is imported or reloaded)."""
    counter = getattr(shell, "_kvlab_cells", None)
    if counter is None:
        counter = CellCounter()
        shell.events.register("pre_run_cell", counter.pre_run_cell)
        shell.events.register("post_run_cell", counter.post_run_cell)
        shell._kvlab_cells = counter
    return counter


def current_cell() -> int | None:
    """The number of the notebook cell running now (kvlab's count, see the module docstring), or None outside a
    kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    if shell is None or getattr(shell, "events", None) is None:
        return None
    return cell_counter(shell).now


def produced(result: Any, cell: int | None = None) -> Any:
    """Note ``result`` as produced by ``cell`` (default: the cell running now); returns ``result``."""
    cell = current_cell() if cell is None else cell
    if cell is not None and result is not None:
        _PRODUCED[id(result)] = (result, cell)
    return result


def cell_of(result: Any) -> int | None:
    """The number of the cell that produced ``result``; None when no experiment noted it."""
    entry = _PRODUCED.get(id(result))
    return entry[1] if entry is not None and entry[0] is result else None


def experiment(fn: F) -> F:
    """Decorate a function a notebook runs as an experiment: its result remembers the cell that produced it."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return produced(fn(*args, **kwargs))

    return run  # type: ignore[return-value]


__all__ = ["CellCounter", "cell_counter", "cell_of", "current_cell", "experiment", "produced"]
