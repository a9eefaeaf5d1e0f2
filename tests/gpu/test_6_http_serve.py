"""``python -m kvlab serve --device <device>`` on 127.0.0.1, driven by kvlab's own load client.

A few requests from ``kvlab.http.loadgen`` (Poisson arrivals, ``ignore_eos``): every request completes with
the tokens it asked for, and a greedy completion equals ``generate``'s on the same model and device. The
rules are ``http_checks``.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
import torch

import kvlab
from gpu.report import http_checks

pytestmark = [pytest.mark.full, pytest.mark.gpu]


def serve_and_load(device: torch.device, quick: bool) -> dict:
    """Start the server on ``device``, run the load client, ask one greedy completion; then ``generate`` here."""
    import httpx

    from kvlab.http.loadgen import http_workload, run_loadtest
    from kvlab.http.local import ServerProcess
    from kvlab.experiments.recall import load_recall_model

    n = 8 if quick else 16
    requests = http_workload("short_short", n, arrival="poisson", rate=20.0, seed=0, max_context=256)
    log_path = Path(tempfile.mkdtemp(prefix="kvlab-serve-")) / "serve.log"
    args = ["kvlab", "serve", "--device", str(device), "--threads", "1", "--max-seqs", "8",
            "--served-model-name", "recall-tiny", "--log-level", "warning"]
    server = ServerProcess(args, log_path=log_path)
    out: dict = dict(command="python -m " + " ".join(server.cmd[2:]), requests=n,
                     max_tokens=[r.max_new_tokens for r in requests])
    prompt = list(b"k3=v7 k9=v2 k3=")  # printable bytes: the recall model's own alphabet
    try:
        t0 = time.perf_counter()
        server.start(timeout_s=120)
        out["startup_s"] = time.perf_counter() - t0
        result = run_loadtest(server.url, requests, timeout_s=60.0, deadline_s=180.0,
                              extra_body={"ignore_eos": True}, progress=False)
        summary = result.summary()
        out.update(completed=summary.completed, failed=summary.failed, failed_by_reason=summary.failed_by_reason,
                   output_tokens=summary.output_tokens, expected_output_tokens=sum(out["max_tokens"]),
                   output_tokens_from=result.output_tokens_from, wall_s=result.wall_s,
                   output_tokens_per_s=summary.output_tokens_per_s,
                   ttft_p50_s=summary.latency.get("ttft", {}).get("p50"),
                   e2e_p50_s=summary.latency.get("e2e", {}).get("p50"))
        body = dict(model="recall-tiny", prompt=prompt, max_tokens=8, temperature=0.0, ignore_eos=True)
        answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60.0, trust_env=False).json()
        out["greedy_text"] = answer["choices"][0]["text"]
        out["greedy_usage"] = answer.get("usage")
    except Exception as exc:  # the server's own log says why; keep its end with the error
        server.stop()
        tail = log_path.read_text()[-1500:] if log_path.exists() else "(no log)"
        raise RuntimeError(f"{type(exc).__name__}: {exc}; the server's log ends: {tail}") from exc
    out["exit_code"] = server.stop()  # uvicorn re-raises SIGTERM after its graceful shutdown: -15 is normal
    out["log_tail"] = log_path.read_text()[-2000:] if log_path.exists() else ""
    model = load_recall_model(device=device)
    expected = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=8)
    out.update(generate_text=expected.text, generate_device=str(model.device))
    return out


def test_serve_on_the_device_completes_every_request_with_generates_tokens(gpu, gpu_report, record):
    http = serve_and_load(gpu.device, gpu.quick)
    gpu_report.keep("http", http)
    record.extend(http_checks(http, gpu.device))
    record.verdict()
