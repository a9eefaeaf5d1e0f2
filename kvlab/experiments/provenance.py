"""Where a result came from: the notebook cell that produced it, so a prediction can prove it was asked first.

An experiment a notebook runs is decorated with ``@experiment``; its return value is noted with the
execution count of the cell that ran it (``cell_of(result)``). ``predict(...)`` notes the cell that asked
the question, and ``guess.against(result, measure)`` compares the two: a result produced before its question
was asked is an answer the learner saw before guessing. The comparison carries both counts in its HTML
(``data-asked``, ``data-produced``), and the one-execution test of every notebook fails on such an order
(``tests/test_notebooks.py``). Outside a kernel (a script, a unit test) there is no cell, and nothing is noted.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

# id(result) -> (result, cell): the result is held so that its id is never reused by another object.
_PRODUCED: dict[int, tuple[Any, int]] = {}


def current_cell() -> int | None:
    """The execution count of the notebook cell running now, or None outside a kernel."""
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    shell = get_ipython()
    return getattr(shell, "execution_count", None) if shell is not None else None


def produced(result: Any, cell: int | None = None) -> Any:
    """Note ``result`` as produced by ``cell`` (default: the cell running now); returns ``result``."""
    cell = current_cell() if cell is None else cell
    if cell is not None and result is not None:
        _PRODUCED[id(result)] = (result, cell)
    return result


def cell_of(result: Any) -> int | None:
    """The execution count of the cell that produced ``result``; None when no experiment noted it."""
    entry = _PRODUCED.get(id(result))
    return entry[1] if entry is not None and entry[0] is result else None


def experiment(fn: F) -> F:
    """Decorate a function a notebook runs as an experiment: its result remembers the cell that produced it."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        return produced(fn(*args, **kwargs))

    return run  # type: ignore[return-value]


__all__ = ["cell_of", "current_cell", "experiment", "produced"]
