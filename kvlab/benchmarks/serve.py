"""Benchmark: kvlab serve against transformers serve --continuous-batching, same weights, same workload, same client.

Each round starts both servers together and measures them in turn (the order rotated from round
to round, one server measured at a time while the other idles) on one checkpoint folder
(default: the lesson model with a byte tokenizer,
`kvlab.lessons.l09_measure_a_real_server.two_engines.lesson_checkpoint`), and for each measures, with the load client
over loopback (`kvlab.lessons.l09_measure_a_real_server.two_engines.compare_engines`):

- **cold**: the first `--cold` requests after the server started (reported apart, never paired);
- **low load**: after `--warmup` more requests, `--requests` at `--low-rate` req/s (short_short):
  TTFT and TPOT with next to no queueing;
- **sweep**: after `--warmup` unreported requests of `--profile` (so that an engine's first long
  prompt, which pays once for new shapes, is not timed), `--profile` (default mixture: long
  prompts and long answers, enough to saturate both) at rising `--rates`, `--duration` s each, up to the first rate past the *knee*: the
  highest rate with >= 90% of the requests completed and TTFT p95 <= `--slo-ttft` s, each rate read
  at its close (a few seconds after its last arrival; the unfinished counted, TTFT p95 over all sent).

Reported as medians of per-round ratios kvlab / transformers with their IQR and min-max
(`kvlab.measure.rounds`): TTFT p95 and TPOT p50 at every load level both engines served (goal
<= 1), and the knee (goal >= 1.5; a knee at the highest rate swept is a lower bound, marked >=).

    python -m kvlab bench serve --json results/bench_serve.json
"""
from __future__ import annotations

import argparse
from typing import Sequence

import numpy as np
import pandas as pd

from kvlab.command_args import command_args
from kvlab.lessons.l09_measure_a_real_server.two_engines import (ENGINES, LOW_RATE, compare_engines, knee,
                                                                 lesson_checkpoint)
from kvlab.http.peer import transformers_serve_available
from kvlab.measure.rounds import format_load, format_spread, load_average, paired_ratio, rotated, spread
from kvlab.results_io import save_results
from ..threads import LESSON_THREADS

KVLAB, PEER = ENGINES
LATENCY_GOAL, KNEE_GOAL = 1.0, 1.5  # kvlab / transformers: at most 1 for latency, at least 1.5 for the knee
DEFAULT_RATES = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0)


def run(rounds: int = 3, low_rate: float = LOW_RATE, requests: int = 30, cold: int = 6, warmup: int = 4,
        rates: Sequence[float] = DEFAULT_RATES, duration_s: float = 3.0, profile: str = "mixture",
        slo_ttft_s: float = 1.0, threads: int | None = LESSON_THREADS, model: str | None = None, seed: int = 0) -> dict:
    """Every round's rows (one frame) and the paired ratios with their spread; see the module docstring."""
    ok, why = transformers_serve_available()
    if not ok:
        raise RuntimeError(f"bench serve compares with transformers serve, which cannot run here: {why}")
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds={rounds!r} must be an integer >= 1")
    folder = lesson_checkpoint(model)
    before = load_average()
    frames, servers, greedy = [], {}, {}
    for r in range(rounds):
        result = compare_engines(folder, low_rate=low_rate, rates=rates, cold_requests=cold, warmup=warmup,
                                 warm_requests=requests, duration_s=duration_s, sweep_profile=profile,
                                 slo_ttft_s=slo_ttft_s, threads=threads, seed=seed + r,
                                 engines=rotated(ENGINES, r))
        frames.append(result.frame.assign(round=r))
        servers, greedy = result.servers, {**greedy, **{f"{e} (round {r})": t for e, t in result.greedy.items()}}
    after = load_average()
    frame = pd.concat(frames, ignore_index=True)
    return {"frame": frame, "servers": servers, "greedy": greedy, "load_before": before, "load_after": after,
            **summarize(frame, rounds, slo_ttft_s, max(rates))}


def _value(frame: pd.DataFrame, r: int, engine: str, phase: str, rate: float, col: str) -> float:
    hit = frame[(frame["round"] == r) & (frame.engine == engine) & (frame.phase == phase) & (frame.offered_rps == rate)]
    return float(hit[col].iloc[0]) if len(hit) else float("nan")


def summarize(frame: pd.DataFrame, rounds: int, slo_ttft_s: float, top_rate: float, min_served: float = 0.9) -> dict:
    """Paired ratios per load level, knees per round and their ratio, cold vs warm; goals met or not."""
    levels = [("warm", float(frame[frame.phase == "warm"].offered_rps.iloc[0]))]
    levels += [("sweep", float(x)) for x in sorted(frame[frame.phase == "sweep"].offered_rps.unique())]
    ratios = []
    for phase, rate in levels:
        for col in ("ttft_p95_s", "tpot_p50_s"):
            pairs = [(_value(frame, r, KVLAB, phase, rate, col), _value(frame, r, PEER, phase, rate, col))
                     for r in range(rounds)]
            pairs = [(a, b) for a, b in pairs if np.isfinite(a) and np.isfinite(b)]
            if not pairs:
                continue  # a rate only one engine reached (the other stopped past its knee)
            s = paired_ratio([a for a, _ in pairs], [b for _, b in pairs])
            ratios.append({"level": "low load" if phase == "warm" else f"{rate:g} req/s", "phase": phase,
                           "offered_rps": rate, "clock": col, "rounds": len(pairs), **s,
                           "meets_goal": bool(s["median"] <= LATENCY_GOAL)})
    knees = {e: [knee(frame[(frame["round"] == r) & (frame.engine == e) & (frame.phase == "sweep")], slo_ttft_s,
                      min_served) for r in range(rounds)] for e in ENGINES}
    knee_ratios = [(a or 0.0) / b if b else float("inf") for a, b in zip(knees[KVLAB], knees[PEER])]
    knee_spread = spread([x for x in knee_ratios if np.isfinite(x)])
    capped = any(k == top_rate for k in knees[KVLAB])
    cold = {}
    for e in ENGINES:
        c, w = frame[(frame.engine == e) & (frame.phase == "cold")], frame[(frame.engine == e) & (frame.phase == "warm")]
        cold[e] = {"cold_ttft_p50_s": spread(c.ttft_p50_s), "cold_ttft_p95_s": spread(c.ttft_p95_s),
                   "warm_ttft_p95_s": spread(w.ttft_p95_s),
                   "cold_over_warm_ttft_p95": paired_ratio(list(c.ttft_p95_s), list(w.ttft_p95_s))}
    return {"ratios": pd.DataFrame(ratios), "knees": knees, "knee_ratio": knee_spread, "knee_ratios": knee_ratios,
            "knee_capped": capped, "cold": cold,
            "latency_goal_met": bool(len(ratios)) and all(r["meets_goal"] for r in ratios),
            "knee_goal_met": knee_spread["median"] is not None and knee_spread["median"] >= KNEE_GOAL}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `python -m kvlab bench serve`."""
    p.add_argument("--rounds", type=int, default=3, help="paired rounds (engine order rotated)")
    p.add_argument("--low-rate", type=float, default=LOW_RATE, help="req/s of the low-load level (short_short)")
    p.add_argument("--requests", type=int, default=30, help="requests of the low-load level")
    p.add_argument("--cold", type=int, default=6, help="the first requests after each start, reported apart")
    p.add_argument("--warmup", type=int, default=4, help="requests after the cold ones, not reported")
    p.add_argument("--rates", default=",".join(f"{r:g}" for r in DEFAULT_RATES), help="sweep rates, req/s, comma-separated")
    p.add_argument("--duration", type=float, default=3.0, help="seconds of load per sweep rate")
    p.add_argument("--profile", default="mixture", help="workload profile of the sweep")
    p.add_argument("--slo-ttft", type=float, default=1.0, help="the knee's TTFT p95 bound, seconds")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each server")
    p.add_argument("--model", default=None, help="a checkpoint folder with a tokenizer (default: the lesson model)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write every round's rows and the ratios here (.json)")


def _print(out: dict, args: argparse.Namespace) -> None:
    for e, d in out["servers"].items():
        print(f"{e} {d['version']}: {d['command']}")
    print("same weights: greedy answers " + ("equal" if len(set(out["greedy"].values())) == 1 else "DIFFER")
          + f" on both servers in every round ({next(iter(out['greedy'].values()))!r})")
    for e, c in out["cold"].items():
        print(f"cold ({args.cold} first requests after start) {e}: TTFT p50 {format_spread(c['cold_ttft_p50_s'], '{:.3f}', ' s')}, "
              f"p95 {format_spread(c['cold_ttft_p95_s'], '{:.3f}', ' s')}; cold/warm TTFT p95 "
              f"{format_spread(c['cold_over_warm_ttft_p95'], unit='x')}")
    print(f"kvlab serve / transformers serve, median of {args.rounds} paired rounds [IQR, min-max] (goal <= {LATENCY_GOAL:g}):")
    for r in out["ratios"].itertuples():
        s = {"median": r.median, "q1": r.q1, "q3": r.q3, "min": r.min, "max": r.max}
        print(f"  {r.level:>11} {r.clock:<11} {format_spread(s, unit='x')}  n={r.rounds}  {'met' if r.meets_goal else 'NOT met'}")
    print(f"knee (>= 90% served, TTFT p95 <= {args.slo_ttft:g} s, {args.profile}): kvlab {out['knees'][KVLAB]}, "
          f"transformers {out['knees'][PEER]} req/s per round; ratio "
          f"{'>= ' if out['knee_capped'] else ''}{format_spread(out['knee_ratio'], unit='x')} (goal >= {KNEE_GOAL:g}): "
          f"{'met' if out['knee_goal_met'] else 'NOT met'}")
    print(f"latency goal at every level: {'met' if out['latency_goal_met'] else 'NOT met'}; "
          + format_load(out["load_before"], out["load_after"]))


def main(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Run, print and save the comparison."""
    args = command_args(args, "python -m kvlab bench serve", __doc__, add_arguments)
    rates = tuple(float(x) for x in args.rates.split(",") if x.strip())
    out = run(args.rounds, args.low_rate, args.requests, args.cold, args.warmup, rates, args.duration, args.profile,
              args.slo_ttft, args.threads, args.model, args.seed)
    _print(out, args)
    if args.json:
        settings = {**{k: v for k, v in vars(args).items() if k != "json"}, "servers": out["servers"],
                    "greedy": out["greedy"], "ratios": out["ratios"].to_dict("records"), "knees": out["knees"],
                    "knee_ratio": out["knee_ratio"], "knee_capped": out["knee_capped"], "cold": out["cold"],
                    "latency_goal_met": out["latency_goal_met"], "knee_goal_met": out["knee_goal_met"],
                    "load_before": out["load_before"], "load_after": out["load_after"]}
        print(f"wrote {save_results(args.json, out['frame'], settings)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
