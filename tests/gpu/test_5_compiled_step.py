"""The compiled fixed-shape static decode step on the device, in a child process bounded in time.

``kvlab.experiments.static_compile`` (torch.compile of the static cache's decode step): the
default mode through ``try_compiled_decode`` (the notebook's own call), and on CUDA ``mode="reduce-overhead"``,
whose step must be recorded as a CUDA graph (``cuda_graph == "captured"``). A compile that does not finish
within its share of the budget is a SKIP, not a hang. The rules are ``compiled_step_checks``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from gpu.report import ROOT, compiled_step_checks

pytestmark = [pytest.mark.full, pytest.mark.gpu]

KEEP = ("status", "message", "same_tokens", "device", "compile_s", "eager_ms", "compiled_ms", "speedup",
        "speedup_min", "speedup_max", "backend", "seconds")


def compile_in_child(mode: str | None, budget_s: float, pairs: int, new_tokens: int) -> dict:
    """``compiled_decode`` on the shipped recall model in a child process stopped after ``budget_s``.

    ``mode=None`` is ``try_compiled_decode`` itself (the notebook's call); another mode runs the same module's
    command line with ``--mode``. The child runs on $KVLAB_DEVICE. Never raises: the answer has a ``status``
    ("compiled", "timeout" or "failed") and a one-line ``message``.
    """
    from kvlab.experiments.static_compile import try_compiled_decode

    if mode is None:
        return try_compiled_decode(budget_s=budget_s, pairs=pairs, new_tokens=new_tokens)
    cmd = [sys.executable, "-m", "kvlab.experiments.static_compile", "--pairs", str(pairs), "--new",
           str(new_tokens), "--threads", "1", "--mode", mode]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s,
                              env=dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1"))
    except subprocess.TimeoutExpired:
        return dict(status="timeout", seconds=time.perf_counter() - start,
                    message=f"torch.compile(mode={mode!r}) did not finish within {budget_s:.0f} s; skipped")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = next((line for line in reversed(proc.stderr.strip().splitlines()) if line.strip()), "no message")
        return dict(status="failed", seconds=time.perf_counter() - start,
                    message=f"torch.compile(mode={mode!r}) failed: {last.strip()[:300]}")
    return dict(json.loads(lines[-1]), seconds=time.perf_counter() - start)


@pytest.mark.parametrize("label,mode", [("default", None), ("reduce-overhead", "reduce-overhead")])
def test_the_compiled_step_generates_dynamics_tokens(label, mode, gpu, gpu_report, record):
    cuda = gpu.device.type == "cuda"
    if mode == "reduce-overhead" and not cuda:
        r = dict(status="not applicable", message=f"CUDA graphs need CUDA; this run is on {gpu.device}")
    else:
        pairs, new = (4, 16) if gpu.quick else (8, 32)
        budget_s = max(30.0, min(150.0 if cuda else 120.0, gpu.left() / 3))  # each child's share of what is left
        answer = compile_in_child(mode, budget_s, pairs, new)
        r = dict({k: answer[k] for k in KEEP if k in answer}, mode=mode, cuda_graph=answer.get("cuda_graph"),
                 budget_s=budget_s)
    gpu_report.keep(f"compiled_step/{label}", r)
    record.extend(compiled_step_checks({label: r}, gpu.device))
    record.verdict()
