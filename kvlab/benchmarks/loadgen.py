"""Benchmark: how many streamed requests per second the load generator alone can drive.

A load generator must never be the bottleneck it measures. This starts the
scripted server (`kvlab.http.scripted`, answering instantly: every chunk of a
response in one write) in a *subprocess* on 127.0.0.1, so the two do not
share an event loop, and drives it from this process:

- `max_rate`: all requests due at t = 0, `max_connections` in flight; the
  achieved rate is completed requests / wall time. Goal: >= 200 req/s.
- `paced`: a constant `rate` (default 200 req/s) open loop; reports how far
  behind schedule dispatch fell (`send_delay_s` p50 / p99 / max) and the
  rate achieved.

Also reported: the client's CPU seconds per request (this process only) and
the server process's CPU, so a low rate can be pinned on the side that ran
out of CPU. On a shared machine, rerun: other processes steal cores.

    python -m kvlab bench loadgen --json results/bench_loadgen.json
"""

from __future__ import annotations

import argparse
import time
from typing import Sequence

import numpy as np
import pandas as pd

from kvlab.http.loadgen import http_workload, run_loadtest
from kvlab.http.local import ServerProcess
from kvlab.results_io import save_results
from kvlab.command_args import command_args

GOAL_RPS = 200.0


def _process_cpu_s(pid: int) -> float | None:
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except Exception:  # psutil missing, or the process is gone
        return None


def measure(url: str, server_pid: int | None, scenario: str, n: int, tokens: int, max_connections: int,
            rate: float | None = None, seed: int = 0) -> dict:
    """One run against `url`; a row of rates, client and server CPU, and dispatch lag."""
    arrival = "all_at_once" if rate is None else "constant"
    requests = http_workload("short_short", n, arrival=arrival, rate=rate, seed=seed)
    for r in requests:
        r.max_new_tokens = tokens
    server_cpu0 = _process_cpu_s(server_pid) if server_pid else None
    cpu0 = time.process_time()
    result = run_loadtest(url, requests, model="scripted", max_connections=max_connections, progress=False)
    client_cpu = time.process_time() - cpu0
    server_cpu = float("nan")
    if server_pid and server_cpu0 is not None:
        server_cpu1 = _process_cpu_s(server_pid)
        assert server_cpu1 is not None, "the server process ended during the run"
        server_cpu = server_cpu1 - server_cpu0
    s = result.summary()
    sent = [r.clocks()["send_delay_s"] for r in result.records if r.extra.get("sent")]
    return {
        "scenario": scenario, "requests": n, "output_tokens_per_request": tokens,
        "max_connections": max_connections, "offered_rate_rps": rate if rate is not None else float("inf"),
        "completed": s.completed, "failed": s.failed, "failed_by_reason": dict(s.failed_by_reason),
        "wall_s": result.wall_s, "achieved_rps": s.completed / result.wall_s,
        "streamed_chunks_per_s": s.streamed_tokens_per_s,
        "client_cpu_s": client_cpu, "client_cpu_ms_per_request": 1e3 * client_cpu / n,
        "client_capacity_rps": n / client_cpu if client_cpu > 0 else float("nan"),
        "server_cpu_s": server_cpu,
        "send_delay_p50_s": float(np.median(sent)) if sent else float("nan"),
        "send_delay_p99_s": float(np.quantile(sent, 0.99)) if sent else float("nan"),
        "send_delay_max_s": float(max(sent)) if sent else float("nan"),
        "ttft_p50_s": s.latency["ttft"]["p50"],
        "goal_rps": GOAL_RPS,
    }


def run(requests: int = 2000, tokens: int = 16, max_connections: int = 64, rate: float = GOAL_RPS,
        paced_seconds: float = 5.0, seed: int = 0) -> pd.DataFrame:
    """Warm up, then the `max_rate` and `paced` scenarios; one row each."""
    with ServerProcess(["kvlab.http.scripted"]) as server:
        measure(server.url, None, "warmup", 200, tokens, max_connections, seed=seed)
        assert server.process is not None  # started by `with`
        pid = server.process.pid
        rows = [measure(server.url, pid, "max_rate", requests, tokens, max_connections, seed=seed),
                measure(server.url, pid, "paced", max(1, int(rate * paced_seconds)), tokens, max_connections,
                        rate=rate, seed=seed)]
    return pd.DataFrame(rows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab bench loadgen`."""
    p.add_argument("--requests", type=int, default=2000, help="requests in the max_rate run")
    p.add_argument("--tokens", type=int, default=16, help="streamed chunks (tokens) per response")
    p.add_argument("--max-connections", type=int, default=64)
    p.add_argument("--rate", type=float, default=GOAL_RPS, help="offered rate of the paced run (req/s)")
    p.add_argument("--paced-seconds", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the results here (.json or .csv)")


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run both scenarios, print them, and save them with `--json`."""
    args = command_args(args, "python -m kvlab bench loadgen", __doc__, add_arguments)
    frame = run(args.requests, args.tokens, args.max_connections, args.rate, args.paced_seconds, args.seed)
    cols = ["scenario", "requests", "completed", "failed", "wall_s", "achieved_rps", "client_cpu_ms_per_request",
            "client_capacity_rps", "server_cpu_s", "send_delay_p50_s", "send_delay_p99_s"]
    print(frame[cols].to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    best = frame.loc[frame.scenario == "max_rate", "achieved_rps"].iloc[0]
    print(f"load generator alone: {best:.0f} streamed requests/s ({'meets' if best >= GOAL_RPS else 'BELOW'} "
          f"the {GOAL_RPS:.0f} req/s goal)")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k in ("requests", "tokens", "max_connections", "rate",
                                                                 "paced_seconds", "seed")}
        print(f"wrote {save_results(args.json, frame, settings)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
