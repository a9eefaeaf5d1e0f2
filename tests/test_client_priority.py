"""The load client's scheduling class: real-time where the machine allows it, restored after, never inherited."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvlab.http.client_priority import PRIORITY, realtime_client

LINUX = sys.platform.startswith("linux")


def test_normal_when_asked():
    with realtime_client(enabled=False) as p:
        assert p.policy == "normal" and p.why == "asked for"


@pytest.mark.skipif(not LINUX, reason="SCHED_FIFO is Linux's")
def test_realtime_inside_restored_after_and_not_passed_to_processes_it_starts():
    before = os.sched_getscheduler(0)
    with realtime_client() as p:
        if p.why is not None:  # refused (no CAP_SYS_NICE): said, and nothing changed
            assert p.policy == "normal" and "CAP_SYS_NICE" in p.why and os.sched_getscheduler(0) == before
            return
        assert str(p) == f"SCHED_FIFO {PRIORITY}"
        assert os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO
        child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                               capture_output=True, text=True, check=True)
        assert int(child.stdout) == os.SCHED_OTHER  # a server started meanwhile runs as usual
    assert os.sched_getscheduler(0) == before
