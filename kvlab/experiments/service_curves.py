"""Under load: service curves per workload profile, the A/B trade-off with two real policies, simulator vs reality.

``python -m kvlab sweep [--simulate] [--profile P ...] [--rates R,R,...] [--requests N] [--json PATH]``

With ``--simulate`` every level runs in virtual time on the cost model calibrated for the
config (kvlab/data/calibration/, or ``--calibration PATH``): 10 levels of 500 requests take seconds.
Without it the real decoder (a small config, ``tiny`` by default) serves every level in real
time, so keep ``--requests`` small. Rates default to ten levels from 0.1 to 1.5 times the
capacity the cost model estimates for the profile. The knee is marked as defined in
``kvlab.serving.sweep``.

``--trace PATH`` replays a trace (Azure CSV or Mooncake JSON lines, ``--trace-format`` or detected)
instead of a profile, faster level by level: ``kvlab.experiments.prefix_traces.trace_curve``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence, cast

import numpy as np
import pandas as pd

from kvlab.clocks import SLO, summarize, ttft_censored
from kvlab.model.config import PRESETS, ModelConfig, preset
from kvlab.model.decoder import build_model
from kvlab.model.lessons import lesson_config
from kvlab.serving.cost_model import CostModel, CostModelExecutor, load_calibration
from kvlab.serving.config import EngineSpec
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import SchedulerConfig
from kvlab.serving.scheduler_cli import add_scheduler_arguments
from kvlab.serving.sweep import auto_rates, estimate_capacity_rps, level_row, load_sweep, mark_knee
from kvlab.workload import PROFILE_NAMES, Request, make_workload
from kvlab.progress import Progress, no_progress
# the set-up lesson 08 shares (its home); DEFAULT_SLO and scheduler_config stay importable from here
from kvlab.serving.sweep import (DEFAULT_SLO, LESSON_SPEC, MAX_MODEL_LEN, MAX_WAITING, parse_rates, scheduler_config,
                                 sweep_settings)
from kvlab.threads import LESSON_THREADS, torch_threads
from kvlab.provenance import experiment
from kvlab.serving.knee import KEEPS_UP_RATIO, keeps_up



def lesson_spec(scheduler: SchedulerConfig | None = None) -> EngineSpec:
    """The lessons' engine spec, with ``scheduler`` if one is given."""
    return LESSON_SPEC if scheduler is None else LESSON_SPEC.replace(scheduler=scheduler)


def _priced(cost_model: CostModel | None) -> CostModel:
    """The cost model a simulator runs on: the one given, else the shipped llama-30m calibration."""
    return load_calibration("llama-30m") if cost_model is None else cost_model


def _config(config: str | ModelConfig) -> ModelConfig:
    return config if isinstance(config, ModelConfig) else preset(config)


def _workload(profile: str, requests: int, seed: int, max_context: int, arrival: str = "all_at_once",
              rate: float | None = None, output_tokens: int | None = None) -> list[Request]:
    reqs = make_workload(profile, requests, arrival=arrival, rate=rate, seed=seed, max_context=max_context)
    if output_tokens is not None:  # equal output lengths: the A/B example compares like with like
        reqs = [Request(r.request_id, min(r.prompt_tokens, max_context - output_tokens), output_tokens,
                        r.arrival_s, r.profile) for r in reqs]
    return reqs


def service_curve(profile: str = "mixture", rates: Sequence[float] | None = None, requests: int = 500,
                  scheduler: SchedulerConfig | None = None, slo: SLO | None = DEFAULT_SLO,
                  cost_model: CostModel | None = None, levels: int = 10, seed: int = 0,
                  min_throughput_ratio: float = KEEPS_UP_RATIO, progress: Progress = no_progress) -> pd.DataFrame:
    """A simulated service curve of one profile: one row per offered load, knee marked.

    ``rates=None`` places ``levels`` loads from 0.1 to 1.5 x the capacity the cost model
    estimates for this profile and scheduler (``estimate_capacity_rps``).
    """
    engine = Engine(_priced(cost_model), lesson_spec(scheduler))
    if rates is None:
        sample = make_workload(profile, requests, arrival="all_at_once", seed=seed, max_context=engine.max_model_len)
        cost = cast(CostModelExecutor, engine.executor).cost_model  # a simulator's steps are priced by one
        capacity = estimate_capacity_rps(cost, sample, engine.scheduler_config.max_seqs)
        rates = auto_rates(capacity, levels)
    frame = load_sweep(engine, rates, profile, requests, seed=seed, slo=slo, clock="virtual",
                       progress=lambda it: progress(it, total=len(rates), desc=profile, unit="level"))
    return mark_knee(frame, min_throughput_ratio)


@experiment
def service_curves(profiles: Sequence[str] = PROFILE_NAMES, **kwargs) -> pd.DataFrame:
    """``service_curve`` for each profile (default: the three profiles and the mixture), in one frame.

    An experiment (``@experiment``): in a notebook its frame remembers the cell that produced it, so a prediction
    compared with ``knee_ratio`` proves it was asked first."""
    unknown = [p for p in profiles if p not in PROFILE_NAMES]
    if unknown:
        raise ValueError(f"unknown profile(s) {unknown}; choose from {', '.join(PROFILE_NAMES)}")
    frames = [service_curve(p, **kwargs) for p in profiles]
    out = pd.concat(frames, ignore_index=True)
    out.attrs.update(frames[0].attrs)
    return out


def end_of_window_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """Per level: sent, completed, failed, waiting, running when the sending window closed (sent = the sum)."""
    cols = ["profile", "policy", "offered_rps"] + [f"window_{k}" for k in
                                                   ("sent", "completed", "failed", "waiting", "running")]
    out = frame[[c for c in cols if c in frame]].copy()
    out.columns = [c.removeprefix("window_") for c in out.columns]
    return out


def knee_rps(curves: pd.DataFrame, profile: str) -> float:
    """The offered load (requests/s) at the knee of ``profile``'s curve; NaN when that curve has no knee.

    ``curves`` is a frame of ``service_curve`` / ``service_curves`` (knee marked by ``mark_knee``).
    """
    if profile not in set(curves["profile"]):
        raise ValueError(f"no curve for profile {profile!r} here; the frame has {sorted(set(curves['profile']))}")
    knee = curves.loc[(curves["profile"] == profile) & curves["is_knee"], "offered_rps"]
    return float(knee.iloc[0]) if len(knee) else float("nan")


def knee_ratio(curves: pd.DataFrame, profile: str = "long_short",
               reference: str = "short_short") -> tuple[float, dict[str, float]]:
    """``profile``'s knee as a fraction of ``reference``'s (both in requests/s), with the two knees it is computed
    from: the measure of notebook 06's prediction (``guess.against(curves, knee_ratio)``)."""
    mine, theirs = knee_rps(curves, profile), knee_rps(curves, reference)
    return mine / theirs, {f"{profile} knee (req/s)": mine, f"{reference} knee (req/s)": theirs}


# -- the A/B example: higher throughput, later first token ---------------------------------------------
def ab_policies(max_seqs: int = 64, max_batch_tokens: int = 64) -> dict[str, SchedulerConfig]:
    """A: prefill-first (a waiting prompt's chunks run next, decodes pause), with the same token budget as B:
    prompts are chunked to it, so a 256-512-token prompt takes several prompt-only steps (not vLLM V0's
    whole-prompt prefill, which needed a budget of at least max_model_len).
    B: decode-first with a small token budget per step (stall-free batching, as in Sarathi-Serve:
    every running sequence decodes each step; prompts get only the budget left over)."""
    common: dict[str, Any] = dict(policy="continuous", max_seqs=max_seqs, max_batch_tokens=max_batch_tokens,
                                  max_model_len=MAX_MODEL_LEN)
    return {"A": SchedulerConfig(priority="prefill_first", **common),
            "B": SchedulerConfig(priority="decode_first", **common)}


def ab_load(cost_model: CostModel, policies: dict[str, SchedulerConfig] | None = None, profile: str = "long_short",
            output_tokens: int = 32, window_s: float = 60.0, seed: int = 0, levels: int = 14) -> float:
    """The load of the A/B example: the first level of a sweep of policy A alone that A no longer keeps up with.

    A's levels run from 0.2 to 1.5 x the estimated capacity; a level keeps up as in ``mark_knee``
    (>= 90% of the load served, no TTFT target). The load is chosen from A's throughput alone,
    so what B does there, and every first-token time, is measured, not selected for.
    """
    policies = ab_policies() if policies is None else policies
    sample = _workload(profile, 200, seed, MAX_MODEL_LEN, output_tokens=output_tokens)
    rates = auto_rates(estimate_capacity_rps(cost_model, sample, policies["B"].max_seqs), levels, low=0.2, high=1.5)
    sweep = mark_knee(load_sweep(Engine(cost_model, lesson_spec(policies["A"])), rates, profile, workload=lambda r: _workload(
        profile, max(2, int(r * window_s)), seed, MAX_MODEL_LEN, "poisson", r, output_tokens)))
    behind = sweep.loc[~sweep["keeps_up"], "offered_rps"]
    return float(behind.iloc[0]) if len(behind) else float(rates[-1])


def ab_example(cost_model: CostModel | None = None, rate: float | None = None, window_s: float = 60.0,
               profile: str = "long_short", output_tokens: int = 32, seed: int = 0,
               policies: dict[str, SchedulerConfig] | None = None) -> pd.DataFrame:
    """The same requests, at the same load, through two real scheduling policies, in virtual time.

    Requests of ``profile`` (default: long documents in, short answers out) with equal outputs
    (``output_tokens``) arrive as a Poisson process for ``window_s`` seconds at ``rate``
    requests/s (default ``ab_load``: the lowest load policy A no longer keeps up with). One row
    per policy (``ab_policies``), counted when the window closes: sent, completed, failed,
    waiting, running, output tokens/s and requests/s over the window, and the clocks (TTFT,
    TPOT, E2E) of the requests completed by then, each with its n; then ``throughput_ratio``
    and ``keeps_up`` of the run drained to the end (>= ``KEEPS_UP_RATIO`` of the requests/s
    sent were served, as in ``mark_knee``). Deterministic: same arguments, same numbers.

    Why they differ: A runs a waiting prompt at once, so first tokens come early, but its
    prompt-only steps pause every running answer (a long time per output token) and each pays
    the whole per-step cost alone; B keeps every answer moving and slips prompts into the budget
    left over, so it finishes more answers per minute while a new prompt waits longer for its
    first token.
    """
    cost_model = _priced(cost_model)
    policies = ab_policies() if policies is None else policies
    if not window_s > 0:
        raise ValueError(f"window_s={window_s} must be > 0 seconds")
    if rate is None:
        rate = ab_load(cost_model, policies, profile, output_tokens, window_s, seed)
    n = max(2, int(rate * window_s))
    reqs = _workload(profile, n, seed, MAX_MODEL_LEN, "poisson", rate, output_tokens)
    engines = {name: Engine(cost_model, lesson_spec(sched)) for name, sched in policies.items()}
    runs = {name: engine.run(reqs, clock="virtual") for name, engine in engines.items()}
    # The window closes at window_s, or later if a request was still being handed over: both runs are counted at
    # the same moment, with every request sent.
    until = max([window_s] + [cast(float, r.sent_s) for records in runs.values() for r in records])
    rows = []
    for name, sched in policies.items():
        s = summarize(runs[name], until_s=until)
        d = s.to_dict()
        # Keeping up, by the knee's rule (kvlab.serving.knee): the run drained, were >= 90% of the requests/s sent served?
        drained = level_row(engines[name], runs[name], reqs, rate)
        rows.append({"policy": name, "rule": sched.priority if sched.policy == "continuous" else "static",
                     "offered_rps": rate, "window_s": until,
                     **{k: d[k] for k in ("sent", "completed", "failed", "waiting", "running")},
                     "output_tokens_per_s": s.output_tokens_per_s, "requests_per_s": s.requests_per_s,
                     **{f"{c}_{q}": d[f"{c}_{q}"] for c in ("ttft", "tpot", "e2e")
                        for q in ("n", "p50_s", "p95_s")},
                     **_ttft_over_sent(runs[name], until),
                     "throughput_ratio": drained["throughput_ratio"],
                     "keeps_up": keeps_up(drained["throughput_ratio"]),
                     "max_seqs": sched.max_seqs, "max_batch_tokens": sched.max_batch_tokens})
    frame = pd.DataFrame(rows)
    frame.attrs.update(profile=profile, output_tokens=output_tokens, requests=n, seed=seed,
                       cost_model=cost_model.config_name)
    return frame


def _ttft_over_sent(records, until_s: float) -> dict:
    """TTFT p95 over every request sent in the window, not only the completed ones the table's ``ttft_p95_s``
    reads: read at the close, with the ones still without a first token counted at their wait so far (a lower
    bound, ``kvlab.clocks.ttft_censored``); and each followed on to its first token, which the simulator's virtual
    clock gives for free (the records run to the end)."""
    c = ttft_censored(records, until_s, 0.95)
    followed = [r.first_token_s - r.scheduled_s for r in records if r.first_token_s is not None]
    return {"ttft_p95_close_s": c["value"], "ttft_censored": c["censored"], "ttft_sent_n": len(followed),
            "ttft_p95_sent_s": float(np.quantile(followed, 0.95)) if followed else float("nan")}


def ab_at_two_loads(cost_model: CostModel | None = None, low_fraction: float = 0.5, window_s: float = 60.0,
                    profile: str = "long_short", output_tokens: int = 32, seed: int = 0,
                    policies: dict[str, SchedulerConfig] | None = None) -> pd.DataFrame:
    """``ab_example`` at two loads: ``low_fraction`` x and 1 x ``ab_load`` (where A alone falls behind).

    One row per (load, policy); the column ``load`` says "below capacity" or "overloaded". Below
    capacity both rules usually keep up (``keeps_up``); the claims of notebook 06 check it. The
    overloaded level is the A/B example itself: there one rule trades first tokens for throughput.
    """
    if not 0 < low_fraction < 1:
        raise ValueError(f"low_fraction={low_fraction} must be in (0, 1): a share of the load A falls behind at")
    cost_model = _priced(cost_model)
    policies = ab_policies() if policies is None else policies
    high = ab_load(cost_model, policies, profile, output_tokens, window_s, seed)
    frames = []
    for label, rate in (("below capacity", float(f"{low_fraction * high:.4g}")), ("overloaded", high)):
        f = ab_example(cost_model, rate, window_s, profile, output_tokens, seed, policies)
        f.insert(0, "load", label)
        frames.append(f)
    out = pd.concat(frames, ignore_index=True)
    out.attrs.update(frames[-1].attrs, low_fraction=low_fraction, requests=[f.attrs["requests"] for f in frames])
    return out


def ab_holds(frame: pd.DataFrame) -> dict:
    """Whether one policy has both higher throughput and a worse p95 TTFT than the other, and the ratios."""
    a, b = frame.iloc[0], frame.iloc[1]
    hi, lo = (b, a) if b["output_tokens_per_s"] >= a["output_tokens_per_s"] else (a, b)
    more, later = hi["output_tokens_per_s"] > lo["output_tokens_per_s"], hi["ttft_p95_s"] > lo["ttft_p95_s"]
    return {"higher_throughput": hi["policy"],
            "throughput_ratio": hi["output_tokens_per_s"] / lo["output_tokens_per_s"],
            "ttft_p95_ratio": hi["ttft_p95_s"] / lo["ttft_p95_s"], "holds": bool(more and later)}


# -- the simulator against the real model -----------------------------------------------------------
def simulated_vs_real(rates: Sequence[float], profile: str = "short_short", requests: int = 30,
                      config: str | ModelConfig | None = None, cost_model: CostModel | None = None,
                      scheduler: SchedulerConfig | None = None, seed: int = 0, threads: int | None = LESSON_THREADS,
                      progress: Progress = no_progress) -> pd.DataFrame:
    """The same load levels served by the real decoder (wall clock) and by the cost model (virtual clock).

    ``config`` defaults to the serving lessons' ~3M-parameter Llama (``lesson_config()``): its
    steps take milliseconds, long enough that a busy machine's jitter does not drown them, short
    enough that a real level lasts seconds. ``cost_model`` should be calibrated on this machine
    for ``config`` (``calibrate(config)``; default: the shipped calibration of that config, if
    any). Rows carry ``source`` "real" or "simulated". Real levels run in real time: keep
    ``requests`` / rate small.
    """
    config = lesson_config() if config is None else _config(config)
    cost_model = load_calibration(config.name) if cost_model is None else cost_model
    if cost_model.config_name != config.name:
        raise ValueError(f"the cost model was calibrated on {cost_model.config_name!r}, not {config.name!r}; "
                         f"calibrate {config.name} first")
    spec = lesson_spec(scheduler).replace(block_size=cost_model.block_size)
    model = build_model(config, seed=seed)
    frames = []
    with torch_threads(threads):
        real = Engine(model, spec)
        real.run(_workload(profile, 4, seed + 1, real.max_model_len))  # warm up outside the measurement
        steps = [("real", real, "wall"), ("simulated", Engine(cost_model, spec), "virtual")]
        for source, engine, clock in progress(steps, total=2, desc="real, then simulated", unit="run"):
            f = load_sweep(engine, rates, profile, requests, seed=seed, clock=clock)
            f.insert(0, "source", source)
            frames.append(f)
    return pd.concat(frames, ignore_index=True)


GAP_CLOCKS = ("achieved_rps", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "e2e_p95_s")


def real_vs_simulated(frame: pd.DataFrame, clocks: Sequence[str] = GAP_CLOCKS) -> pd.DataFrame:
    """How far the simulator is from the real run: one row per (load, clock), real / simulated, with n.

    ``frame`` is ``simulated_vs_real`` output. ``ratio`` > 1: the real run was slower (a longer
    time) or, for ``achieved_rps``, served more. ``n_real`` / ``n_simulated`` are the completed
    requests behind each quantile (the level's request count for throughput).
    """
    if "source" not in frame or set(frame["source"]) != {"real", "simulated"}:
        raise ValueError("expected simulated_vs_real output: rows with source 'real' and 'simulated'")
    real = frame[frame["source"] == "real"].set_index("offered_rps")
    sim = frame[frame["source"] == "simulated"].set_index("offered_rps")
    if list(real.index) != list(sim.index):
        raise ValueError(f"real and simulated levels differ: {list(real.index)} vs {list(sim.index)}")
    rows = []
    for rate in real.index:
        for clock in clocks:
            n_col = clock.split("_")[0] + "_n" if clock.split("_")[0] in ("ttft", "tpot", "itl", "e2e") else "completed"
            r, s_ = float(real.loc[rate, clock]), float(sim.loc[rate, clock])
            rows.append({"offered_rps": rate, "clock": clock, "real": r, "simulated": s_,
                         "ratio": r / s_ if s_ > 0 else float("nan"),
                         "n_real": int(real.loc[rate, n_col]), "n_simulated": int(sim.loc[rate, n_col])})
    return pd.DataFrame(rows)


# -- the command line --------------------------------------------------------------------------------
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
    from kvlab.results_io import save_results

    if getattr(args, "trace", None) is not None:  # a trace instead of profiles: the levels speed its replay up
        return trace_sweep_main(args)
    config, cost_model, scheduler, slo = sweep_settings(args)
    profiles = args.profile or (list(PROFILE_NAMES) if args.simulate else ["short_short"])
    requests = args.requests or (500 if args.simulate else 30)
    try:
        fixed = parse_rates(args.rates) if args.rates else None
    except ValueError as e:
        raise SystemExit(str(e)) from None
    frames, t0, cpu0 = [], time.perf_counter(), time.process_time()
    for profile in profiles:
        spec = lesson_spec(scheduler).replace(block_size=cost_model.block_size)
        engine = Engine(cost_model if args.simulate else build_model(config, seed=args.seed), spec)
        rates = fixed
        if rates is None:
            sample = make_workload(profile, requests, arrival="all_at_once", seed=args.seed,
                                   max_context=engine.max_model_len)
            rates = auto_rates(estimate_capacity_rps(cost_model, sample, args.max_seqs), args.levels)
        print(f"{profile}: {len(rates)} levels x {requests} requests, "
              f"{'simulated' if args.simulate else 'real ' + config.name}", file=sys.stderr, flush=True)
        with torch_threads(args.threads):
            f = load_sweep(engine, rates, profile, requests, seed=args.seed, slo=slo,
                           clock="virtual" if args.simulate else "wall")
        frames.append(mark_knee(f))
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    frame = pd.concat(frames, ignore_index=True)
    cols = ["profile", "offered_rps", "achieved_rps", "throughput_ratio", "ttft_p50_s", "ttft_p95_s", "ttft_n",
            "tpot_p50_s", "e2e_p95_s", "failure_rate", "peak_kv_blocks", "goodput_rps", "keeps_up", "is_knee"]
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(frame[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    knees = {k: v for f in frames for k, v in f.attrs["knees"].items()}
    print("knee (the highest load before the first that does not keep up): "
          + "; ".join(f"{curve}: {words}" for curve, words in knees.items()))
    levels = len(frame)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{levels} levels x {requests} requests in {seconds:.1f} s wall, {cpu_seconds:.1f} s CPU "
          f"({'virtual time, cost model' if args.simulate else 'real time, ' + config.name}; "
          f"machine load average {load:.1f})")
    if args.json:
        settings = {"simulate": args.simulate, "config": config.name, "profiles": profiles, "requests": requests,
                    "rates": args.rates or "auto", "engine": frames[0].attrs.get("settings"), "slo": slo.targets(),
                    "knee_rule": frames[0].attrs.get("knee_rule") or {"min_throughput_ratio": KEEPS_UP_RATIO},
                    "knees": knees,
                    "sweep_wall_s": seconds, "sweep_cpu_s": cpu_seconds, "load_average_1m": load,
                    "cost_model_environment": cost_model.environment}
        save_results(args.json, frame, settings)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def trace_sweep_main(args) -> int:
    """``python -m kvlab sweep --trace PATH``: the options of ``sweep``, a trace (lesson 08's replay) for the workload."""
    from kvlab.results_io import save_results
    from kvlab.traces import detect_format
    from kvlab.experiments.prefix_traces import clipped_requests, trace_curve

    config, cost_model, scheduler, slo = sweep_settings(args)
    try:
        rates = parse_rates(args.rates) if args.rates else None
        trace_format = args.trace_format or detect_format(args.trace)
        clipped = clipped_requests(args.trace, trace_format, args.length_scale, MAX_MODEL_LEN)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    spec = lesson_spec(scheduler).replace(block_size=cost_model.block_size)
    engine = Engine(cost_model if args.simulate else build_model(config, seed=args.seed), spec)
    requests = args.requests or (None if args.simulate else 30)
    if clipped:
        print(f"note: {clipped} requests of {args.trace} do not fit max_model_len={engine.max_model_len} at "
              f"--length-scale {args.length_scale:g}; their prompts are cut (raise --length-scale to keep them whole)",
              file=sys.stderr)
    print(f"{args.trace} ({trace_format}, lengths / {args.length_scale:g}): "
          f"{'simulated' if args.simulate else 'real ' + config.name}", file=sys.stderr, flush=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        with torch_threads(args.threads):
            frame = trace_curve(args.trace, rates, trace_format, args.length_scale, requests, engine, cost_model,
                                args.levels, args.seed, slo, "virtual" if args.simulate else "wall")
    except ValueError as e:
        raise SystemExit(str(e)) from None
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    cols = ["offered_rps", "time_scale", "achieved_rps", "throughput_ratio", "ttft_p50_s", "ttft_p95_s", "ttft_n",
            "tpot_p50_s", "failure_rate", "token_hit_ratio", "prefill_tokens_computed", "keeps_up", "is_knee"]
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(frame[cols].to_string(index=False, float_format=lambda x: f"{x:.3g}"))
    print("knee (the highest load before the first that does not keep up): "
          + "; ".join(f"{curve}: {words}" for curve, words in frame.attrs.get("knees", {}).items()))
    print(f"{len(frame)} levels x {frame.attrs['requests']} requests of {Path(args.trace).name} "
          f"in {seconds:.1f} s wall, "
          f"{cpu_seconds:.1f} s CPU ({'virtual time, cost model' if args.simulate else 'real time, ' + config.name})")
    if args.json:
        settings = {"simulate": args.simulate, "config": config.name, "trace": str(args.trace),
                    "trace_format": trace_format, "length_scale": args.length_scale,
                    "trace_rps": frame.attrs["trace_rps"], "requests": frame.attrs["requests"],
                    "rates": args.rates or "auto", "engine": frame.attrs.get("settings"), "slo": slo.targets(),
                    "knee_rule": frame.attrs.get("knee_rule"), "sweep_wall_s": seconds, "sweep_cpu_s": cpu_seconds,
                    "cost_model_environment": cost_model.environment}
        save_results(args.json, frame, settings)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


__all__ = ["DEFAULT_SLO", "GAP_CLOCKS", "KEEPS_UP_RATIO", "ab_at_two_loads", "ab_example", "ab_holds", "ab_load",
           "ab_policies", "end_of_window_counts", "knee_ratio", "knee_rps", "real_vs_simulated", "scheduler_config",
           "service_curve", "service_curves", "simulated_vs_real", "lesson_spec"]
