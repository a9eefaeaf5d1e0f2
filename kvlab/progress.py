"""Progress: how an experiment reports how far it got, without knowing who is watching.

An experiment wraps its outer loop in ``progress(iterable, total=..., desc=...)``. A script passes
nothing (``no_progress``: the loop runs as is), a notebook panel passes a tqdm bar. Only whole
runs are counted, never single tokens: updating a bar between two timed steps would be timed too.
"""
from __future__ import annotations

from typing import Iterable, Protocol, TypeVar

T = TypeVar("T")


class Progress(Protocol):
    """The shape of ``tqdm``: wrap an iterable, return an iterable over the same items."""

    def __call__(self, iterable: Iterable[T], *, total: int | None = None, desc: str | None = None,
                 unit: str = "it") -> Iterable[T]: ...


def no_progress(iterable: Iterable[T], *, total: int | None = None, desc: str | None = None,
                unit: str = "it") -> Iterable[T]:
    """Report nothing: hand the iterable back unchanged."""
    return iterable
