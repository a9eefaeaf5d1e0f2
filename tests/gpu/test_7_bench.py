"""The benchmarks on the device: ``python -m kvlab bench decode`` at small settings, and notebook 05's batch scaling.

``bench decode --json`` (no compile): every row ran, exact kvlab caches agree with kvlab dynamic's
(``bench_decode_checks``). ``batch_scaling`` on the lesson model: per-sequence decode time falls with the batch,
a batched prefill beats one by one (``batch_scaling_checks``); notebook 05's claims on it are kept, as
information.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from gpu.report import ROOT, batch_scaling_checks, bench_decode_checks

pytestmark = [pytest.mark.full, pytest.mark.gpu]

BATCH_CLAIMS = ("decode_step_stays_flat_for_small_batches", "per_sequence_decode_time_falls_with_batch",
                "batch_one_decode_reads_below_the_bandwidth", "batched_prompts_all_get_first_tokens_sooner",
                "first_prompt_waits_for_the_batch")


def bench_decode(device: torch.device, quick: bool, timeout_s: float) -> dict:
    """``python -m kvlab bench decode --json`` on the device (KVLAB_DEVICE), at small settings, no compile."""
    small = quick or device.type != "cuda"
    settings = (["--config", "tiny", "--prompt", "64", "--new", "16", "--rounds", "2", "--bandwidth-mb", "64"]
                if small else ["--config", "llama-30m", "--prompt", "256", "--new", "64", "--rounds", "3"])
    path = Path(tempfile.mkdtemp(prefix="kvlab-bench-")) / "decode.json"
    cmd = [sys.executable, "-m", "kvlab", "bench", "decode", *settings, "--no-compile", "--json", str(path),
           *(["--threads", "1"] if device.type != "cuda" else [])]
    env = dict(os.environ, KVLAB_DEVICE=device.type)
    t0 = time.perf_counter()
    out: dict = dict(command="python -m " + " ".join(cmd[2:]), timeout_s=timeout_s)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return dict(out, returncode=None, seconds=time.perf_counter() - t0, error=f"timed out after {timeout_s:.0f} s")
    out.update(returncode=proc.returncode, seconds=time.perf_counter() - t0, tail=(proc.stdout + proc.stderr)[-2500:])
    if not path.exists():
        return dict(out, error="no JSON written")
    report = json.loads(path.read_text())
    keep = ("impl", "cache", "compiled", "status", "reason", "tokens_per_s", "decode_ms_median", "achieved_GBps",
            "roofline_fraction", "same_tokens_as_kvlab_dynamic")
    out.update(device_used=report["env"].get("device_used"), settings=report["settings"],
               matvec_GBps=report["summary"]["matvec_GBps"].get("median"),
               rows=[{k: r.get(k) for k in keep} for r in report["results"]])
    return out


def test_bench_decode_runs_every_cache_on_the_device(gpu, gpu_report, record):
    bench = bench_decode(gpu.device, gpu.quick, timeout_s=max(60.0, min(240.0, gpu.left())))
    gpu_report.keep("bench_decode", bench)
    record.extend(bench_decode_checks(bench, gpu.device))
    record.verdict()


def batch_scaling_run(device: torch.device, quick: bool) -> dict:
    """Notebook 05's experiment (``batch_scaling``) on the lesson model at its claim's small settings."""
    from kvlab.lessons import verdicts
    from kvlab.experiments.slowdown import slowdown_model
    from kvlab.experiments.batch_scaling import batch_scaling, crossover_batch

    sizes = (1, 2, 4, 8, 16) if quick or device.type != "cuda" else (1, 2, 4, 8, 16, 32, 64)
    result = batch_scaling(slowdown_model(), batch_sizes=sizes, steps=3, repeats=3, prompts=4, prefill_tokens=16)
    d = result.decode.set_index("batch")
    p = result.prefill.set_index("way")
    shown = verdicts(result, *BATCH_CLAIMS)
    return dict(settings=result.settings, machine=result.machine, crossover_batch=crossover_batch(result),
                decode=result.decode.to_dict(orient="records"), prefill=result.prefill.to_dict(orient="records"),
                per_seq_ms={int(b): 1e3 * d.loc[b, "per_seq_s"] for b in d.index},
                step_ms={int(b): 1e3 * d.loc[b, "step_s"] for b in d.index},
                all_first_ms={w: 1e3 * p.loc[w, "all_first_s"] for w in p.index},
                claims=[dict(claim=n, holds=v.holds, text=str(v)) for n, v in zip(BATCH_CLAIMS, shown)])


def test_batching_amortises_decode_and_prefill_on_the_device(gpu, gpu_report, record):
    scaling = batch_scaling_run(gpu.device, gpu.quick)
    gpu_report.keep("batch_scaling", scaling)  # notebook 05's claims on it, wall clock: information
    record.extend(batch_scaling_checks(scaling, gpu.device))
    record.verdict()
