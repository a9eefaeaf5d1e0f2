"""CPU threads for an experiment: set for the run, restored afterwards.

Small models gain little from many threads, and on a machine shared with other programs a step
split over every core waits for its slowest thread: on 2 busy cores we measured the lesson-01 run
take 10 s with 1 thread and 110 s with 2. The lessons therefore default to one thread; pass
``threads=None`` to keep torch's own setting (and say so next to the numbers you report).
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[int]:
    """Run the body with ``threads`` intra-op CPU threads (None: unchanged); yields the count in use."""
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer or None (keep torch's setting), got {threads!r}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
