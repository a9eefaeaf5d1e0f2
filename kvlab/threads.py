"""CPU threads for a run: set for the run, restored afterwards (the one place kvlab sets torch's threads).

Small models gain little from many threads, and on a machine shared with other programs a step split over every core
waits for its slowest thread: on 2 busy cores we measured the lesson-01 run take 10 s with 1 thread and 110 s with 2.
The lessons, the calibration and the benchmarks therefore default to one thread; pass ``threads=None`` to keep torch's
own setting (and say so next to the numbers you report).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

LESSON_THREADS = 1  # the torch threads lessons, calibration and benchmarks run on unless told (docstring above)


def check_threads(threads) -> None:
    """Raise a clear error unless ``threads`` is a positive integer or None (keep torch's setting)."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None (keep torch's setting), got {threads!r}")


def set_torch_threads(threads: int | None) -> int:
    """For a whole process (a command line, a child process): set ``threads`` (None: unchanged); returns the count."""
    check_threads(threads)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[int]:
    """Run the body with ``threads`` intra-op CPU threads (None: unchanged); yields the count in use."""
    before = torch.get_num_threads()
    try:
        yield set_torch_threads(threads)
    finally:
        torch.set_num_threads(before)


__all__ = ["check_threads", "set_torch_threads", "torch_threads"]
