"""How often each wall-clock claim of the notebooks holds, quiet and with every core busy.

    python scripts/claims_robustness.py                          # 3 runs each, quiet and loaded
    python scripts/claims_robustness.py --runs 5 --json results/claims_robustness.json
    python scripts/claims_robustness.py --quiet-only uncached_tokens_slow_down

Prints one line per claim and condition with the load average before and after; the JSON also records kvlab's
version, the device, threads, the core count and when it ran.
"""
from __future__ import annotations

import argparse
import os
import time

from kvlab.claims import CLAIMS
from kvlab.claims.robustness import as_records, hold_rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="claim names (default: every wall-clock claim)")
    parser.add_argument("--runs", type=int, default=3, help="runs per claim and condition (seeds 0..runs-1)")
    parser.add_argument("--quiet-only", action="store_true", help="skip the runs under competing load")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    unknown = [n for n in args.names if n not in CLAIMS]
    if unknown:
        parser.error(f"unknown claim(s) {unknown}; known: {sorted(CLAIMS)}")
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    rates = hold_rates(args.names or None, runs=args.runs, loaded=not args.quiet_only, progress=print)
    print(f"\n{'claim':45s} {'condition':35s} held  load average before → after")
    for r in rates:
        print(f"{r.claim:45s} {r.condition:35s} {r.held}/{r.runs}   {r.load_before:.2f} → {r.load_after:.2f}")
    if args.json:
        from kvlab.env import environment
        from kvlab.results_io import write_json

        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        write_json(args.json, {"environment": environment(), "runs": args.runs, "cpu_count": os.cpu_count(),
                               "started": started, "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
                               "hold_rates": as_records(rates)})
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
