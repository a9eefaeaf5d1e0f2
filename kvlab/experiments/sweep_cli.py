"""``python -m kvlab sweep``: service curves from the command line, real or simulated, of profiles or of a trace.

``python -m kvlab sweep [--simulate] [--profile P ...] [--rates R,R,...] [--requests N] [--json PATH]``

With ``--simulate`` every level runs in virtual time on the cost model calibrated for the config
(kvlab/data/calibration/, or ``--calibration PATH``): 10 levels of 500 requests take seconds. Without it the real
decoder (a small config, ``tiny`` by default) serves every level in real time, so keep ``--requests`` small. Rates
default to ten levels from 0.1 to 1.5 times the capacity the cost model estimates for the profile. The knee is marked by
``kvlab.serving.knee``'s rule.

``--trace PATH`` replays a trace (Azure CSV or Mooncake JSON lines, ``--trace-format`` or detected) instead of a
profile, faster level by level: ``kvlab.experiments.prefix_traces.trace_curve``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd

from kvlab.clocks import SLO
from kvlab.model.config import PRESETS, ModelConfig, preset
from kvlab.model.decoder import build_model
from kvlab.serving.cost_model import CostModel, load_calibration
from kvlab.serving.engine import Engine
from kvlab.serving.knee import KEEPS_UP_RATIO
from kvlab.serving.scheduler import SchedulerConfig
from kvlab.serving.scheduler_cli import add_scheduler_arguments, scheduler_config_from_args
from kvlab.serving.sweep import auto_rates, estimate_capacity_rps, load_sweep, mark_knee, parse_rates
from kvlab.threads import torch_threads
from kvlab.workload import PROFILE_NAMES, profile_workload
from kvlab.experiments.presets import DEFAULT_SLO, MAX_MODEL_LEN, MAX_WAITING, lesson_spec
from kvlab.experiments.prefix_traces import clipped_requests, trace_curve


def sweep_settings(args: argparse.Namespace) -> tuple[ModelConfig, CostModel, SchedulerConfig, SLO]:
    """The model, its step prices, the scheduler and the SLO a sweep's options name (profiles or a trace)."""
    config = preset(args.config or ("llama-30m" if args.simulate else "tiny"))
    cost_model = CostModel.load(args.calibration) if args.calibration else load_calibration(config.name)
    # SchedulerConfig's token budget, raised to max_seqs if that is larger (every running sequence must decode)
    scheduler = scheduler_config_from_args(args, max_batch_tokens=max(SchedulerConfig.max_batch_tokens, args.max_seqs),
                                           max_model_len=MAX_MODEL_LEN)
    return config, cost_model, scheduler, SLO(ttft_s=args.slo_ttft, tpot_s=args.slo_tpot)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--simulate", action="store_true",
                        help="virtual time on the calibrated cost model (default: the real model, in real time)")
    parser.add_argument("--profile", nargs="+", default=None, choices=PROFILE_NAMES,
                        help="workload profile(s) (default: all four with --simulate, short_short without)")
    parser.add_argument("--rates", help="offered loads in requests/s, comma-separated and rising "
                                        "(default: 10 levels from 0.1 to 1.5 x the estimated capacity)")
    parser.add_argument("--levels", type=int, default=10, help="levels when --rates is not given (default 10)")
    parser.add_argument("--requests", type=int, help="requests per level (default 500 simulated, 30 real; "
                                                     "with --trace: all of it simulated, its first 30 real)")
    parser.add_argument("--config", choices=sorted(PRESETS),
                        help="model config (default llama-30m simulated, tiny real)")
    parser.add_argument("--calibration", type=Path, metavar="PATH",
                        help="cost model JSON (default: the one shipped in kvlab/data/calibration/)")
    # scheduler_config's bounded queue; the token budget and max_model_len are set in sweep_settings
    add_scheduler_arguments(parser, ("policy", "priority", "max_seqs", "max_waiting"), max_waiting=MAX_WAITING)
    parser.add_argument("--slo-ttft", type=float, default=DEFAULT_SLO.ttft_s, help="TTFT target, s")
    parser.add_argument("--slo-tpot", type=float, default=DEFAULT_SLO.tpot_s, help="TPOT target, s")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads for the real model (default 1)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the table, settings and machine as JSON")
    trace = parser.add_argument_group("trace replay (instead of --profile)")
    trace.add_argument("--trace", type=Path, metavar="PATH",
                       help="replay this trace at rising rates (kvlab.traces.SAMPLE_TRACES has one per format)")
    trace.add_argument("--trace-format", choices=("azure", "mooncake"), help="default: detected from the file")
    trace.add_argument("--length-scale", type=float, default=1.0,
                       help="divide the trace's lengths by this (Mooncake: 1, 2, 4, 8, 16, ...; default 1)")


def main(args: argparse.Namespace) -> int:
    """Profiles' curves, or a trace's (``--trace``), printed and, with ``--json``, saved with their settings."""
    from kvlab.results_io import save_results

    config, cost_model, scheduler, slo = sweep_settings(args)
    spec = lesson_spec(scheduler).replace(block_size=cost_model.block_size)
    clock = "virtual" if args.simulate else "wall"
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        rates = parse_rates(args.rates) if args.rates else None
    except ValueError as e:
        raise SystemExit(str(e)) from None
    with torch_threads(args.threads):
        if getattr(args, "trace", None) is not None:  # a trace instead of profiles: the levels speed its replay up
            frame, knees, cols, what, settings = _trace_curve(args, config, cost_model, spec, slo, rates, clock)
        else:
            frame, knees, cols, what, settings = _profile_curves(args, config, cost_model, spec, slo, rates, clock)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(frame[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print("knee (the highest load before the first that does not keep up): "
          + "; ".join(f"{curve}: {words}" for curve, words in knees.items()))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{len(frame)} levels x {what} in {seconds:.1f} s wall, {cpu_seconds:.1f} s CPU "
          f"({'virtual time, cost model' if args.simulate else 'real time, ' + config.name}; "
          f"machine load average {load:.1f})")
    if args.json:
        settings |= {"simulate": args.simulate, "config": config.name, "rates": args.rates or "auto",
                     "engine": frame.attrs.get("settings"), "slo": slo.targets(),
                     "knee_rule": frame.attrs.get("knee_rule") or {"min_throughput_ratio": KEEPS_UP_RATIO},
                     "knees": knees, "sweep_wall_s": seconds, "sweep_cpu_s": cpu_seconds, "load_average_1m": load,
                     "cost_model_environment": cost_model.environment}
        save_results(args.json, frame, settings)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def _profile_curves(args, config, cost_model, spec, slo, rates, clock) -> tuple[pd.DataFrame, dict, list, str, dict]:
    profiles = args.profile or (list(PROFILE_NAMES) if args.simulate else ["short_short"])
    requests = args.requests or (500 if args.simulate else 30)
    frames = []
    for profile in profiles:
        engine = Engine(cost_model if args.simulate else build_model(config, seed=args.seed), spec)
        workload = profile_workload(profile, requests, args.seed, engine.max_model_len)
        levels = rates or auto_rates(estimate_capacity_rps(cost_model, workload.requests, args.max_seqs), args.levels)
        print(f"{profile}: {len(levels)} levels x {requests} requests, "
              f"{'simulated' if args.simulate else 'real ' + config.name}", file=sys.stderr, flush=True)
        frames.append(mark_knee(load_sweep(engine, workload, levels, slo=slo, clock=clock)))
    frame = pd.concat(frames, ignore_index=True)
    frame.attrs.update(settings=frames[0].attrs.get("settings"), knee_rule=frames[0].attrs.get("knee_rule"))
    cols = ["profile", "offered_rps", "achieved_rps", "throughput_ratio", "ttft_p50_s", "ttft_p95_s", "ttft_n",
            "tpot_p50_s", "e2e_p95_s", "failure_rate", "peak_kv_blocks", "goodput_rps", "keeps_up", "is_knee"]
    knees = {k: v for f in frames for k, v in f.attrs["knees"].items()}
    return frame, knees, cols, f"{requests} requests", {"profiles": profiles, "requests": requests}


def _trace_curve(args, config, cost_model, spec, slo, rates, clock) -> tuple[pd.DataFrame, dict, list, str, dict]:
    from kvlab.traces import detect_format

    try:  # the trace's own faults (an unknown format, a bad file or scale) are its user's to mend: one line each
        trace_format = args.trace_format or detect_format(args.trace)
        clipped = clipped_requests(args.trace, trace_format, args.length_scale, MAX_MODEL_LEN)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    engine = Engine(cost_model if args.simulate else build_model(config, seed=args.seed), spec)
    if clipped:
        print(f"note: {clipped} requests of {args.trace} do not fit max_model_len={engine.max_model_len} at "
              f"--length-scale {args.length_scale:g}; their prompts are cut (raise --length-scale to keep them whole)",
              file=sys.stderr)
    print(f"{args.trace} ({trace_format}, lengths / {args.length_scale:g}): "
          f"{'simulated' if args.simulate else 'real ' + config.name}", file=sys.stderr, flush=True)
    try:
        frame = trace_curve(args.trace, rates, trace_format, args.length_scale,
                            args.requests or (None if args.simulate else 30), engine, cost_model, args.levels,
                            args.seed, slo, clock)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    cols = ["offered_rps", "time_scale", "achieved_rps", "throughput_ratio", "ttft_p50_s", "ttft_p95_s", "ttft_n",
            "tpot_p50_s", "failure_rate", "token_hit_ratio", "prefill_tokens_computed", "keeps_up", "is_knee"]
    settings = {"trace": str(args.trace), "trace_format": trace_format, "length_scale": args.length_scale,
                "trace_rps": frame.attrs["trace_rps"], "requests": frame.attrs["requests"]}
    return (frame, frame.attrs.get("knees", {}), cols,
            f"{frame.attrs['requests']} requests of {Path(args.trace).name}", settings)
