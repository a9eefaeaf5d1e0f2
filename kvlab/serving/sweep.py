"""Load sweeps: the same requests at rising offered load, one row of the four clocks per level, and the knee.

A service curve answers "at what load do answers stay correct, within what delay, with what failure rate and which
resources?" ``load_sweep`` runs one engine over a workload built once (``kvlab.workload.Workload``) at each offered rate
(the requests are the same at every level; only their arrivals are compressed) and returns one tidy row per level:

- offered vs achieved: ``offered_rps`` (the nominal rate), ``sent_rps`` (requests sent / the window they were sent in),
  ``achieved_rps`` (completed / first arrival to last finish), ``throughput_ratio`` = achieved_rps / sent_rps, and the
  same in output tokens/s;
- the four clocks of the completed requests (every request is served to the end), as ``summarize`` names them:
  ``ttft_p50_s``, ``ttft_p95_s``, ..., ``tpot_*``, ``itl_*``, ``e2e_*``, ``queue_*``, each with its sample size
  ``ttft_n``, ...;
- failures: ``failed``, ``failure_rate`` and ``failed_<reason>`` (a full queue, a prompt too long);
- counts at the end of the sending window, when the last request has been handed to the engine (``window_sent`` = all of
  them, ``window_completed``, ``window_waiting``, ...): the backlog a load level leaves behind;
- resources: peak KV blocks and bytes in use, peak running sequences, preemptions, steps;
- goodput under an SLO (requests meeting every target per second, and their share).

**The knee** (``mark_knee``): the highest load tested before the first one that does not keep up, by the one rule of
:mod:`kvlab.serving.knee`, which also says what a curve that keeps up everywhere, or nowhere, has instead.
"""
from __future__ import annotations

import math
import time
from typing import Callable, Iterable, Sequence, cast

import numpy as np
import pandas as pd

from kvlab.clocks import SLO, RequestRecord, summarize
from kvlab.workload import Request, Workload
from kvlab.serving.cost_model import CostModel
from kvlab.serving.engine import Engine
from kvlab.serving.knee import KEEPS_UP_RATIO, Knee, find_knee, keeps_up

LevelProgress = Callable[[Iterable], Iterable]
LevelRow = Callable[[Engine, list[RequestRecord], list[Request], float, SLO | None], dict]


def parse_rates(text: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--rates {text!r}: give numbers separated by commas, e.g. 0.5,1,2,4") from None


def _check_rates(rates: Sequence[float]) -> list[float]:
    rates = list(rates)
    if not rates:
        raise ValueError("rates is empty; give at least one offered load in requests/s (or use auto_rates)")
    for r in rates:
        if isinstance(r, bool) or not isinstance(r, (int, float, np.number)) or not math.isfinite(r) or r <= 0:
            raise ValueError(f"offered rate {r!r} requests/s: every rate must be a finite number > 0")
    if sorted(rates) != rates or len(set(rates)) != len(rates):
        raise ValueError(f"rates {rates} must rise strictly (a service curve walks up the load)")
    return [float(r) for r in rates]


def level_row(engine: Engine, records: list[RequestRecord], requests: list[Request], rate: float,
              slo: SLO | None = None) -> dict:
    """One service-curve row from a finished run of ``engine`` over ``requests`` offered at ``rate``."""
    arrivals = [r.arrival_s for r in requests]
    window = max(arrivals) - min(arrivals)
    drained = summarize(records, slo=slo)
    at_window = summarize(records, until_s=max(cast(float, r.sent_s) for r in records))  # at the last hand-over
    finished = [r.finished_s for r in records if r.status == "completed" and r.finished_s is not None]
    makespan = (max(finished) - min(arrivals)) if finished else float("nan")
    mean_out = float(np.mean([r.max_new_tokens for r in requests]))
    sent_rps = (len(requests) - 1) / window if window > 0 and len(requests) > 1 else float("inf")
    achieved_rps = drained.completed / makespan if finished and makespan > 0 else float("nan")
    trace = engine.trace_frame()
    per_block = engine.spec.block_bytes(engine.config, engine.kv_dtype)
    peak_blocks = int(trace["kv_blocks_used"].max()) if len(trace) else 0
    row = {
        "offered_rps": rate, "sent_rps": sent_rps, "achieved_rps": achieved_rps,
        "throughput_ratio": achieved_rps / sent_rps if math.isfinite(sent_rps) else float("nan"),
        "offered_output_tokens_per_s": rate * mean_out,
        "achieved_output_tokens_per_s": drained.output_tokens / makespan if finished and makespan > 0 else float("nan"),
        "requests": len(requests), "sent": drained.sent, "completed": drained.completed, "failed": drained.failed,
        "failure_rate": drained.failed / drained.sent if drained.sent else float("nan"),
        "window_s": window, "makespan_s": makespan,
        **{f"window_{k}": getattr(at_window, k) for k in ("sent", "completed", "failed", "waiting", "running")},
        "peak_kv_blocks": peak_blocks, "kv_blocks_total": engine.num_blocks, "peak_kv_bytes": peak_blocks * per_block,
        "peak_kv_tokens": int(trace["kv_tokens_held"].max()) if len(trace) else 0,
        "peak_running": int(trace["num_running"].max()) if len(trace) else 0,
        "peak_waiting": int(trace["num_waiting"].max()) if len(trace) else 0,
        "preemptions": engine.scheduler.num_preemptions, "steps": len(trace),
        "busy_s": float(trace["duration_s"].sum()) if len(trace) else 0.0,
    }
    row.update({k: v for k, v in drained.to_dict().items()  # the four clocks with their n, failures by reason, goodput
                if k.endswith(("_s", "_n")) and k.split("_")[0] in ("ttft", "tpot", "itl", "e2e", "queue", "send")
                or k.startswith(("failed_", "slo_")) or k in ("goodput_rps", "slo_share")})
    return row


def load_sweep(engine: Engine, workload: Workload, rates: Sequence[float], *, slo: SLO | None = None,
               clock: str = "virtual", row: LevelRow = level_row, progress: LevelProgress | None = None) -> pd.DataFrame:
    """Run ``engine`` over ``workload`` at each offered rate (requests/s): one ``row`` per level (see the module doc).

    The workload is built once; each level sends the same requests timed at its rate (``Workload.at_rate``), so
    levels differ only in when requests arrive. ``clock="virtual"`` with a cost-model executor simulates; ``"wall"``
    with the model executor measures for real (in real time: a level of 40 requests at 2/s lasts 20 s).
    """
    rates = _check_rates(rates)
    levels = progress(rates) if progress else rates
    rows = []
    for level, rate in enumerate(levels):
        reqs = workload.at_rate(rate)
        t0 = time.perf_counter()
        records = engine.run(reqs, clock=clock)
        wall = time.perf_counter() - t0
        rows.append({"level": level, "profile": workload.name, "arrival": workload.arrival, "clock": clock,
                     **row(engine, records, reqs, rate, slo), "run_wall_s": wall})
    frame = pd.DataFrame(rows)
    reasons = [c for c in frame if c.startswith("failed_")]
    frame[reasons] = frame[reasons].fillna(0).astype(int)  # a reason absent at a level counted 0 there
    s = engine.scheduler_config
    frame.insert(2, "policy", s.policy if s.policy == "static" else f"{s.policy}/{s.priority}")
    frame.insert(3, "executor", engine.executor.name)
    frame.attrs.update(settings=engine.settings(), slo=None if slo is None else slo.targets(), seed=workload.seed,
                       requests=len(workload.requests), burstiness=workload.burstiness)
    return frame


def mark_knee(frame: pd.DataFrame, min_throughput_ratio: float = KEEPS_UP_RATIO, slo_ttft_s: float | None = None,
              by: Sequence[str] = ("profile", "policy")) -> pd.DataFrame:
    """Add ``keeps_up`` and ``is_knee`` columns, one knee per curve (rows grouped by ``by``), by the one rule
    (:mod:`kvlab.serving.knee`); ``frame.attrs["knees"]`` says each curve's knee in words, its case included.

    ``slo_ttft_s`` defaults to the frame's ``slo_ttft_s`` column when the sweep had an SLO.
    """
    if not 0 < min_throughput_ratio <= 1:
        raise ValueError(f"min_throughput_ratio={min_throughput_ratio} must be in (0, 1], e.g. 0.9 for 90%")
    frame = frame.copy()
    if slo_ttft_s is None and "slo_ttft_s" in frame:
        slo_ttft_s = float(frame["slo_ttft_s"].iloc[0])
    p95 = frame["ttft_p95_s"] if "ttft_p95_s" in frame else pd.Series(math.nan, index=frame.index)
    frame["keeps_up"] = [keeps_up(r, t, slo_ttft_s, min_throughput_ratio)
                         for r, t in zip(frame["throughput_ratio"], p95)]
    frame["is_knee"] = False
    keys = [k for k in by if k in frame]
    groups = frame.groupby(keys, sort=False).groups.items() if keys else [((), frame.index)]
    knees = {}
    for key, index in groups:
        curve = frame.loc[index].sort_values("offered_rps")
        knee = find_knee(curve["offered_rps"].tolist(), curve["keeps_up"].tolist())
        if knee.index is not None:
            frame.loc[curve.index[knee.index], "is_knee"] = True
        knees[" / ".join(map(str, key if isinstance(key, tuple) else (key,)))] = str(knee)
    frame.attrs.update(knee_rule={"min_throughput_ratio": min_throughput_ratio, "slo_ttft_s": slo_ttft_s}, knees=knees)
    return frame


def estimate_capacity_rps(cost_model: CostModel, requests: Sequence[Request], max_seqs: int) -> float:
    """Roughly the most requests/s the engine sustains on ``requests``, from a cost model.

    At capacity ``max_seqs`` sequences decode together; each request adds its prompt (priced
    as tokens and attention, riding along in decode steps) and ``max_new_tokens`` decode rows,
    each step's fixed cost shared by the batch. Used to place the levels of a sweep, not as a result.
    """
    if not requests:
        raise ValueError("estimate_capacity_rps needs at least one request")
    c = cost_model.coefficients
    prompt = np.array([r.prompt_tokens for r in requests], dtype=float)
    out = np.array([r.max_new_tokens for r in requests], dtype=float)
    batch = max(1, int(max_seqs))
    longest = float(np.quantile(prompt + out, 0.9))  # the batch's longest context sets the decode gather
    step = cost_model.decode_step_s(batch, int(longest))
    prefill = c["prefill_tokens"] * prompt + c["attention_calls"] + c["prefill_attention"] * prompt ** 2 / 2
    per_request = float(np.mean(prefill + out * step / batch))
    return 1.0 / per_request


def auto_rates(capacity_rps: float, levels: int = 10, low: float = 0.1, high: float = 1.5) -> list[float]:
    """``levels`` evenly spaced offered loads from ``low`` to ``high`` times the estimated capacity."""
    if not capacity_rps > 0:
        raise ValueError(f"capacity_rps={capacity_rps} must be > 0")
    if not isinstance(levels, int) or levels < 2:
        raise ValueError(f"levels={levels!r}: a curve needs an integer >= 2 levels")
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got low={low}, high={high}")
    return [float(f"{r:.4g}") for r in np.linspace(low, high, levels) * capacity_rps]


__all__ = ["KEEPS_UP_RATIO", "Knee", "auto_rates", "estimate_capacity_rps", "find_knee", "level_row", "load_sweep",
           "mark_knee", "parse_rates"]
