"""Benchmark: what HTTP and streaming add to TTFT — client-measured vs engine-measured, at low load.

Starts `python -m kvlab serve` in a subprocess on 127.0.0.1 (default model:
recall-tiny, shipped inside kvlab; `--model` to choose), sends a
low constant load with the load generator, and joins each request's client
and engine clocks (`kvlab.http.compare`). Reported: the median (and p90)
of `ttft_overhead_s` = client TTFT from sending - engine TTFT from
receiving; goal <= 5 ms on loopback.

    python -m kvlab bench http --json results/bench_http.json
"""

from __future__ import annotations

import argparse
from typing import Sequence

import pandas as pd

from kvlab.http.compare import measure_http_overhead, overhead_summary
from kvlab.http.local import ServerProcess
from kvlab.results_io import save_results
from kvlab.command_args import command_args

GOAL_S = 0.005


def run(num_requests: int = 50, rate: float = 5.0, max_new_tokens: int = 8, model: str | None = None,
        chat: bool = False, seed: int = 0) -> tuple[pd.DataFrame, dict]:
    """(per-request frame, summary row) of one low-load run against a fresh server."""
    args = ["kvlab", "serve", "--log-level", "warning", "--seed", str(seed)]
    if model:
        args += ["--model", model]
    with ServerProcess(args) as server:
        measure_http_overhead(server.url, num_requests=5, rate=rate, max_new_tokens=max_new_tokens)  # warm-up
        frame = measure_http_overhead(server.url, num_requests=num_requests, rate=rate, max_new_tokens=max_new_tokens,
                                      seed=seed + 1, chat=chat)
    q = overhead_summary(frame)
    row = {"requests": num_requests, "joined": len(frame), "rate_rps": rate, "max_new_tokens": max_new_tokens,
           "chat": chat, "model": frame.attrs["settings"]["model"],
           "ttft_overhead_p50_s": q["ttft_overhead"]["p50"], "ttft_overhead_p90_s": q["ttft_overhead"]["p90"],
           "e2e_overhead_p50_s": q["e2e_overhead"]["p50"],
           "client_ttft_p50_s": q["client_ttft"]["p50"], "engine_ttft_p50_s": q["engine_ttft"]["p50"],
           "goal_s": GOAL_S, "meets_goal": bool(q["ttft_overhead"]["p50"] <= GOAL_S)}
    return frame, row


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab bench http`."""
    p.add_argument("--requests", type=int, default=50)
    p.add_argument("--rate", type=float, default=5.0, help="requests/s, low enough that nothing queues")
    p.add_argument("--tokens", type=int, default=8, help="max_tokens per request (ignore_eos)")
    p.add_argument("--model", default=None, help="passed to kvlab serve --model")
    p.add_argument("--chat", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the summary here (.json or .csv)")


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run, print and save the comparison."""
    args = command_args(args, "python -m kvlab bench http", __doc__, add_arguments)
    frame, row = run(args.requests, args.rate, args.tokens, args.model, args.chat, args.seed)
    cols = ["client_ttft_s", "client_ttft_from_sent_s", "engine_ttft_s", "ttft_overhead_s", "e2e_overhead_s"]
    print((frame[cols] * 1e3).describe(percentiles=[0.5, 0.9]).T.round(2).to_string())
    print(f"HTTP + streaming add {row['ttft_overhead_p50_s'] * 1e3:.2f} ms to TTFT (median of {row['joined']}, "
          f"p90 {row['ttft_overhead_p90_s'] * 1e3:.2f} ms); goal <= {GOAL_S * 1e3:.0f} ms: "
          f"{'met' if row['meets_goal'] else 'NOT met'}")
    if args.json:
        settings = {k: v for k, v in vars(args).items() if k in ("requests", "rate", "tokens", "model", "chat", "seed")}
        print(f"wrote {save_results(args.json, pd.DataFrame([row]), settings)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
