"""The load client first: a real-time scheduling class for the thread that sends and reads the requests.

On a small machine the client shares its cores with the server it measures. A server that keeps a core
busy-waiting (vLLM's engine core and API server poll their message queues) leaves a client on that core
waiting, for hundreds of milliseconds at a time, and the clocks then time the client's wait as the server's
(see the README's *Why vLLM's figures swung*). A client in Linux's SCHED_FIFO class runs as soon as it has
work, ahead of every ordinary process, whichever server it measures; it sleeps between requests, so it takes
little from any of them, and the kernel's real-time throttle (`/proc/sys/kernel/sched_rt_runtime_us`) keeps it
from taking a whole core. ``SCHED_RESET_ON_FORK``: processes it starts (servers, vLLM's client) run as usual.

Needs CAP_SYS_NICE (root, or a container that grants it); where it is refused, the client runs as an ordinary
process and says so (`ClientPriority.why`), and the benchmark's JSON records which it was.
"""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Iterator

PRIORITY = 1  # the lowest real-time priority: above every ordinary process, below the kernel's own threads


@dataclass(frozen=True)
class ClientPriority:
    """How the client thread was scheduled: ``policy`` "SCHED_FIFO 1" or "normal", and why when normal."""

    policy: str
    why: str | None = None

    def __str__(self) -> str:
        return self.policy if self.why is None else f"{self.policy} ({self.why})"


def set_realtime() -> None:
    """In a child process (``subprocess.run(preexec_fn=...)``): the same class as the client thread, so a second
    client is scheduled as the first. Raises PermissionError where the class is refused."""
    os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(PRIORITY))


@contextlib.contextmanager
def realtime_client(enabled: bool = True) -> Iterator[ClientPriority]:
    """Run the calling thread (and threads it starts) in SCHED_FIFO while inside; restored on leaving."""
    if not enabled:
        yield ClientPriority("normal", "asked for")
        return
    if not sys.platform.startswith("linux") or not hasattr(os, "SCHED_FIFO"):
        yield ClientPriority("normal", f"no real-time class on {sys.platform}")
        return
    before, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        set_realtime()
    except PermissionError:
        yield ClientPriority("normal", "SCHED_FIFO refused: needs CAP_SYS_NICE (root)")
        return
    try:
        yield ClientPriority(f"SCHED_FIFO {PRIORITY}")
    finally:
        os.sched_setscheduler(0, before, param)
