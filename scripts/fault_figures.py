"""What each injected fault does to a running server: requests failed and completed, /health and KV blocks after.

    python scripts/fault_figures.py            # every case, one line each
    python scripts/fault_figures.py --json results/fault_figures.json

Each case starts kvlab's server (tiny random Llama, 4 batch slots) in this process with one
fault from `tests/faults.py` at its third step, sends 8 concurrent streamed requests
(4 run, 4 wait), and reads /health and /metrics once the server is idle. `raise_always` sends
12, enough for the 3 failing steps in a row that stop the engine, and also runs `run_server`
to its end and reports its exit status. `temperature 1e-38` sends one request at that
temperature beside 4 greedy streams, on a server with no fault.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time

import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import kvlab  # noqa: E402
from test_faults import one  # noqa: E402  the streamed request the fault-injection tests send
from kvlab.http.local import ServerThread, free_port, wait_until_healthy  # noqa: E402
from kvlab.http.server import create_app, run_server  # noqa: E402
from kvlab.serving import Engine, SchedulerConfig  # noqa: E402
from faults import FaultyExecutor, FaultyScheduler  # noqa: E402
from kvlab.threads import torch_threads  # noqa: E402
from kvlab.serving.config import EngineSpec

MODEL = "tiny-llama"
CASES = ("raise_once", "raise_always", "oom", "nan_row", "scheduler", "temperature 1e-38")


def _burst(url: str, temperatures: list[float]) -> tuple[list[str], float]:
    async def many():
        async with httpx.AsyncClient(timeout=30) as c:
            return await asyncio.gather(*(one(c, url, i, temperature=t) for i, t in enumerate(temperatures)))
    t = time.perf_counter()
    return asyncio.run(many()), time.perf_counter() - t


def _engine(model, case: str) -> Engine:
    fault = case if case in ("raise_once", "raise_always", "oom", "nan_row") else None
    executor = FaultyExecutor(model, fault, at_step=2, row=1) if fault else None
    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=128,
                                                                        max_waiting=64)), executor=executor)
    if case == "scheduler":
        FaultyScheduler.install(engine, at_step=2)
    return engine


def _after(url: str) -> dict:
    time.sleep(0.3)
    health = httpx.get(url + "/health")
    m = {line.split()[0][6:]: float(line.split()[1]) for line in httpx.get(url + "/metrics").text.splitlines()
         if line.startswith("kvlab_") and "{" not in line}
    adds_up = m["requests_sent_total"] == sum(m[f"requests_{k}_total"] for k in
                                             ("completed", "failed", "cancelled", "rejected")) \
        + m["requests_waiting"] + m["requests_running"]
    return {"health": f"{health.status_code} {health.json()['status']}", "kv_blocks_used": int(m["kv_blocks_used"]),
            "counts_add_up": adds_up}


def run_case(model, case: str) -> dict:
    n = 12 if case == "raise_always" else 8
    temperatures = [1e-38] + [0.0] * 4 if case.startswith("temperature") else [1.0 if i % 2 else 0.0 for i in range(n)]
    app = create_app(_engine(model, case), MODEL)
    with ServerThread(app, timeout_graceful_shutdown=1) as server:
        outcomes, took = _burst(server.url, temperatures)
        row = {"case": case, "requests": len(outcomes), "failed": sum(o == "engine_error" for o in outcomes),
               "completed": outcomes.count("completed"), "refused_503": outcomes.count("http_503"),
               "answered_within_s": round(took, 2), **_after(server.url)}
        if case != "raise_always":
            after, _ = _burst(server.url, [0.0, 0.0])
            row["serves_after"] = after == ["completed", "completed"]
    if case == "raise_always":  # the same fault under run_server: it exits 1 once the engine stops
        app = create_app(_engine(model, case), MODEL)
        port, status = free_port(), []
        thread = threading.Thread(target=lambda: status.append(run_server(app, "127.0.0.1", port,
                                                                          log_level="error", drain_timeout_s=1)),
                                  daemon=True)
        thread.start()
        wait_until_healthy(f"http://127.0.0.1:{port}")
        _burst(f"http://127.0.0.1:{port}", [0.0] * 12)
        thread.join(30)
        row["exit_status"] = status[0] if status else None
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import logging

    logging.basicConfig(level=logging.CRITICAL)
    with torch_threads(1):
        model = kvlab.build_model(kvlab.tiny_llama(), seed=0)
        rows = [run_case(model, case) for case in CASES]
    for row in rows:
        print(", ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
