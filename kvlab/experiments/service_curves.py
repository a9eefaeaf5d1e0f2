"""Under load: service curves per workload profile, the A/B trade-off with two real policies, simulator vs reality.

``service_curves`` simulates one curve per profile on the calibrated cost model, knee marked (``kvlab.serving.knee``);
``ab_example`` puts two real scheduling policies on the same requests; ``simulated_vs_real`` sets the simulator beside
the real decoder. ``python -m kvlab sweep`` runs the same from a command line (``kvlab.experiments.sweep_cli``).
"""
from __future__ import annotations

from typing import Any, Sequence, cast

import numpy as np
import pandas as pd

from kvlab.clocks import SLO, summarize, ttft_censored
from kvlab.model.config import ModelConfig, preset
from kvlab.model.decoder import build_model
from kvlab.model.lessons import lesson_config
from kvlab.serving.cost_model import CostModel, CostModelExecutor, load_calibration
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import SchedulerConfig
from kvlab.serving.sweep import auto_rates, estimate_capacity_rps, level_row, load_sweep, mark_knee
from kvlab.workload import PROFILE_NAMES, Request, make_workload, profile_workload
from kvlab.progress import Progress, no_progress
from kvlab.experiments.presets import DEFAULT_SLO, MAX_MODEL_LEN, lesson_spec, scheduler_config
from kvlab.threads import LESSON_THREADS, torch_threads
from kvlab.provenance import experiment
from kvlab.serving.knee import KEEPS_UP_RATIO, keeps_up


def _priced(cost_model: CostModel | None) -> CostModel:
    """The cost model a simulator runs on: the one given, else the shipped llama-30m calibration."""
    return load_calibration("llama-30m") if cost_model is None else cost_model


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

    ``rates=None`` places ``levels`` loads from 0.1 to 1.5 x the capacity the cost model estimates for this profile and
    scheduler (``estimate_capacity_rps``).
    """
    engine = Engine(_priced(cost_model), lesson_spec(scheduler))
    workload = profile_workload(profile, requests, seed, engine.max_model_len)
    if rates is None:
        cost = cast(CostModelExecutor, engine.executor).cost_model  # a simulator's steps are priced by one
        rates = auto_rates(estimate_capacity_rps(cost, workload.requests, engine.scheduler_config.max_seqs), levels)
    frame = load_sweep(engine, workload, rates, slo=slo, clock="virtual",
                       progress=lambda it: progress(it, total=len(rates), desc=profile, unit="level"))
    return mark_knee(frame, min_throughput_ratio)


@experiment
def service_curves(profiles: Sequence[str] = PROFILE_NAMES, **kwargs) -> pd.DataFrame:
    """``service_curve`` for each profile (default: the three profiles and the mixture), in one frame."""
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
    """The offered load (requests/s) at the knee of ``profile``'s curve; NaN when that curve has no knee."""
    if profile not in set(curves["profile"]):
        raise ValueError(f"no curve for profile {profile!r} here; the frame has {sorted(set(curves['profile']))}")
    knee = curves.loc[(curves["profile"] == profile) & curves["is_knee"], "offered_rps"]
    return float(knee.iloc[0]) if len(knee) else float("nan")


def knee_ratio(curves: pd.DataFrame, profile: str = "long_short",
               reference: str = "short_short") -> tuple[float, dict[str, float]]:
    """``profile``'s knee as a fraction of ``reference``'s (both in requests/s), with the two knees it is computed
    from: the measure a prediction of the knee is compared with (``guess.against(curves, knee_ratio)``)."""
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

    A's levels run from 0.2 to 1.5 x the estimated capacity; a level keeps up as in ``mark_knee`` (>= 90% of the load
    served, no TTFT target). The load is chosen from A's throughput alone, so what B does there, and every first-token
    time, is measured, not selected for.
    """
    policies = ab_policies() if policies is None else policies
    sample = _workload(profile, 200, seed, MAX_MODEL_LEN, output_tokens=output_tokens)
    rates = auto_rates(estimate_capacity_rps(cost_model, sample, policies["B"].max_seqs), levels, low=0.2, high=1.5)
    engine = Engine(cost_model, lesson_spec(policies["A"]))
    for rate in rates:  # a fixed window: more requests at a higher load, so each level's are drawn for it
        reqs = _workload(profile, max(2, int(rate * window_s)), seed, MAX_MODEL_LEN, "poisson", rate, output_tokens)
        if not keeps_up(level_row(engine, engine.run(reqs, clock="virtual"), reqs, rate)["throughput_ratio"]):
            return float(rate)
    return float(rates[-1])


def ab_example(cost_model: CostModel | None = None, rate: float | None = None, window_s: float = 60.0,
               profile: str = "long_short", output_tokens: int = 32, seed: int = 0,
               policies: dict[str, SchedulerConfig] | None = None) -> pd.DataFrame:
    """The same requests, at the same load, through two real scheduling policies, in virtual time.

    Requests of ``profile`` (default: long documents in, short answers out) with equal outputs (``output_tokens``)
    arrive as a Poisson process for ``window_s`` seconds at ``rate`` requests/s (default ``ab_load``: the lowest load
    policy A no longer keeps up with). One row per policy (``ab_policies``), counted when the window closes, then
    ``throughput_ratio`` and ``keeps_up`` of the run drained to the end (as in ``mark_knee``). Deterministic.

    Why they differ: A runs a waiting prompt at once, so first tokens come early, but its prompt-only steps pause every
    running answer (a long time per output token) and each pays the whole per-step cost alone; B keeps every answer
    moving and slips prompts into the budget left over, so it finishes more answers per minute while a new prompt waits
    longer for its first token.
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
    # The window closes at window_s, or later if a request was still being handed over: both runs counted then.
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
    """TTFT p95 over every request sent in the window: at the close, the ones without a first token counted at
    their wait so far (a lower bound, ``kvlab.clocks.ttft_censored``); and each followed on to its first token,
    which the simulator's virtual clock gives for free."""
    c = ttft_censored(records, until_s, 0.95)
    followed = [r.first_token_s - r.scheduled_s for r in records if r.first_token_s is not None]
    return {"ttft_p95_close_s": c["value"], "ttft_censored": c["censored"], "ttft_sent_n": len(followed),
            "ttft_p95_sent_s": float(np.quantile(followed, 0.95)) if followed else float("nan")}


def ab_at_two_loads(cost_model: CostModel | None = None, low_fraction: float = 0.5, window_s: float = 60.0,
                    profile: str = "long_short", output_tokens: int = 32, seed: int = 0,
                    policies: dict[str, SchedulerConfig] | None = None) -> pd.DataFrame:
    """``ab_example`` at two loads: ``low_fraction`` x and 1 x ``ab_load`` (where A alone falls behind).

    One row per (load, policy); the column ``load`` says "below capacity" or "overloaded" (the A/B example itself).
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

    ``config`` defaults to the serving lessons' ~3M-parameter Llama (``lesson_config()``): its steps take milliseconds,
    long enough that a busy machine's jitter does not drown them, short enough that a real level lasts seconds.
    ``cost_model`` should be calibrated on this machine for ``config`` (default: the shipped calibration of that
    config). Real levels run in real time: keep ``requests`` / rate small.
    """
    config = lesson_config() if config is None else config if isinstance(config, ModelConfig) else preset(config)
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
        workload = profile_workload(profile, requests, seed, real.max_model_len)
        steps = [("real", real, "wall"), ("simulated", Engine(cost_model, spec), "virtual")]
        for source, engine, clock in progress(steps, total=2, desc="real, then simulated", unit="run"):
            f = load_sweep(engine, workload, rates, clock=clock)
            f.insert(0, "source", source)
            frames.append(f)
    return pd.concat(frames, ignore_index=True)


GAP_CLOCKS = ("achieved_rps", "ttft_p50_s", "ttft_p95_s", "tpot_p50_s", "e2e_p95_s")


def real_vs_simulated(frame: pd.DataFrame, clocks: Sequence[str] = GAP_CLOCKS) -> pd.DataFrame:
    """How far the simulator is from the real run: one row per (load, clock), real / simulated, with n.

    ``frame`` is ``simulated_vs_real`` output. ``ratio`` > 1: the real run was slower (a longer time) or, for
    ``achieved_rps``, served more. ``n_real`` / ``n_simulated`` are the completed requests behind each quantile (the
    level's request count for throughput).
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


__all__ = ["DEFAULT_SLO", "GAP_CLOCKS", "KEEPS_UP_RATIO", "ab_at_two_loads", "ab_example", "ab_holds", "ab_load",
           "ab_policies", "end_of_window_counts", "knee_ratio", "knee_rps", "real_vs_simulated", "scheduler_config",
           "service_curve", "service_curves", "simulated_vs_real", "lesson_spec"]
