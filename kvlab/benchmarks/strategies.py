"""Strategies benchmark: every KV cache's memory, latency and quality vs exact on the shipped recall model.

``python -m kvlab bench strategies [--json PATH] [--pairs 4,8,16] [--new 32] [--repeats 3] [--examples 100] [--threads
1] [--quick]``

Runs ``kvlab.experiments.strategies.run_strategies`` (dynamic, static, quantized at 8/4/2 bits with a few group sizes
and residual windows, offloaded), prints the table and a summary for the longest context: each quantized setting's
memory next to the ideal (bits / 32 + a scale and a zero-point per group), its per-token latency next to dynamic's, and
its recall accuracy next to the exact cache's. ``--json`` writes rows, summary, settings and the machine's environment.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results and environment as JSON here")
    parser.add_argument("--pairs", default="4,8,16", help="recall contexts, in key-value pairs (default 4,8,16: "
                                                          "37, 69 and 133 prompt tokens)")
    parser.add_argument("--new", type=int, default=32, help="tokens generated per timed run (default 32)")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per row after a cold one (default 3)")
    parser.add_argument("--examples", type=int, default=100, help="recall questions per context (default 100)")
    parser.add_argument("--quality-prompts", type=int, default=20,
                        help="questions also compared token by token with the exact cache (default 20)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="a fast smoke run: 2 contexts, 1 repeat, 20 examples")


def summarise(frame) -> list[dict]:
    """Per setting at the longest context: memory vs ideal, latency vs dynamic, accuracy vs exact."""
    longest = frame[frame["pairs"] == frame["pairs"].max()]
    return [dict(setting=r.setting, context_tokens=int(r.context_tokens), memory_ratio=r.memory_ratio,
                 ideal_memory_ratio=r.ideal_memory_ratio, memory_vs_ideal=r.memory_ratio / r.ideal_memory_ratio - 1.0,
                 latency_ratio=r.latency_ratio, cache_ms_per_step=r.cache_ms_per_step,
                 bytes_moved_per_step=r.bytes_moved_per_step, accuracy=r.accuracy, exact_accuracy=r.exact_accuracy)
            for r in longest.itertuples()]


def main(args: argparse.Namespace) -> int:
    import pandas as pd

    from kvlab.env import environment
    from kvlab.experiments.strategies import default_settings, run_strategies
    from kvlab.results_io import write_json
    from kvlab.experiments.recall import load_recall_model

    try:
        pairs = tuple(int(p) for p in args.pairs.split(",") if p.strip())
    except ValueError:
        raise SystemExit(f"--pairs must be comma-separated integers such as 4,8,16, got {args.pairs!r}")
    if args.quick:
        pairs, args.repeats, args.examples, args.quality_prompts, args.new = pairs[-2:], 1, 20, 5, 16
    model = load_recall_model()
    print(f"kvlab bench strategies: {model.config.name} ({model.num_parameters():,} parameters), pairs {pairs}, "
          f"{args.new} new tokens, {args.repeats} repeats, {args.examples} examples, {model.device}, "
          f"{args.threads} thread(s)", file=sys.stderr)
    t0 = time.perf_counter()
    settings = default_settings(model.device)
    frame = run_strategies(model, settings, pairs, new_tokens=args.new, repeats=args.repeats,
                           examples=args.examples, quality_prompts=args.quality_prompts, threads=args.threads)
    wall = time.perf_counter() - t0

    cols = ["setting", "context_tokens", "allocated_bytes", "used_bytes", "reserved_bytes", "offloaded_bytes",
            "memory_ratio", "prefill_ms", "token_ms_p50", "token_ms_p95", "cache_ms_per_step",
            "bytes_moved_per_step", "accuracy", "kl_mean", "top1_agreement"]
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.float_format", "{:.3g}".format):
        print(frame[cols].to_string(index=False))
    summary = summarise(frame)
    print(f"\nat the longest context ({summary[0]['context_tokens']} prompt tokens + {args.new} new):")
    for s in summary:
        print(f"  {s['setting']:<44} memory x{s['memory_ratio']:.3f} (ideal x{s['ideal_memory_ratio']:.3f}, "
              f"{100 * s['memory_vs_ideal']:+.1f}%)  latency x{s['latency_ratio']:.2f}  "
              f"accuracy {s['accuracy']:.2f} (exact {s['exact_accuracy']:.2f})")
    if model.device.type == "cpu":
        print("offloaded on this CPU-only machine: the slower tier is a memory-mapped file (its pages sit in the "
              "OS page cache, i.e. RAM); its cost is the copy in and out every step, not PCIe", file=sys.stderr)

    report = {"benchmark": "strategies",
              "settings": {"pairs": list(pairs), "new_tokens": args.new, "repeats": args.repeats,
                           "examples": args.examples, "quality_prompts": args.quality_prompts,
                           "threads": args.threads, "strategies": settings,
                           "model": model.config.name, "dtype": str(model.dtype), "batch": 1, "sampling": "greedy"},
              "env": {**environment(), "device_used": str(model.device), "threads": args.threads},
              "summary": summary, "results": json.loads(frame.to_json(orient="records")),
              "wall_s": wall, "created_unix_s": time.time()}
    if args.json:
        print(f"wrote {write_json(args.json, report)}", file=sys.stderr)
    return 0
