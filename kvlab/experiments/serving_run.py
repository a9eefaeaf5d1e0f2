"""Serving runs: one workload through the engine, kept as the tables the serving lessons plot.

``serve`` builds an ``Engine``, runs a list of requests and returns a ``ServingRun``: the records (the four clocks' raw
stamps), one row per request, one row per (step, request) for Gantt charts, and one row per step (batch composition, KV
blocks). ``runs_frame`` stacks several runs into one DataFrame for a panel, ``runs_table`` gives one summary row per
run.

``FixedStepCostExecutor`` prices every step at a fixed cost and runs no model. With the engine's virtual clock it gives
exact, machine-independent timestamps — the engine's real scheduler and block manager decide everything — so notebooks
can check them and learners can work them out by hand. It is not a model of any machine's speed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from kvlab.clocks import SLO, RequestRecord, Summary, requests_frame, summarize
from kvlab.model.config import ModelConfig
from kvlab.model.decoder import Decoder
from kvlab.model.lessons import lesson_model  # the serving experiments' model
from kvlab.progress import Progress
from kvlab.serving.config import EngineSpec
from kvlab.serving.engine import Engine
from kvlab.serving.executor import Executor, StepResult
from kvlab.serving.scheduler import SchedulerConfig, SchedulerOutput
from kvlab.threads import LESSON_THREADS, torch_threads
from kvlab.workload import Request


class FixedStepCostExecutor(Executor):
    """An executor with fixed prices: each step costs ``step_s`` + ``token_s`` x tokens computed.

    No model runs: every sampled token is ``token_id``. On the virtual clock a request's TTFT can be worked out by hand
    from the steps it waited for (the module doc).
    """

    name = "fixed_step_cost"

    def __init__(self, step_s: float = 0.010, token_s: float = 0.0, token_id: int = 0) -> None:
        if not step_s >= 0 or not token_s >= 0 or step_s + token_s <= 0:
            raise ValueError(f"step_s ({step_s!r}) and token_s ({token_s!r}) must be >= 0 and not both 0; "
                             "a step that costs nothing would never advance the virtual clock")
        self.step_s, self.token_s, self.token_id = float(step_s), float(token_s), int(token_id)

    def execute(self, out: SchedulerOutput) -> StepResult:
        tokens = [self.token_id if sample else None for sample in out.do_sample]
        return StepResult(tokens, self.step_s + self.token_s * out.shape.num_tokens)


@dataclass
class ServingRun:
    """One workload served by one engine configuration, as tables.

    - ``requests``: one row per request (``kvlab.clocks.requests_frame`` plus ``run``, ``token_s``
      — the list of token stamps — ``cached_tokens``, ``preemptions``);
    - ``steps``: one row per (step, request) that ran (``Engine.step_requests_frame`` plus ``run``);
    - ``trace``: one row per step (``Engine.trace_frame`` plus ``run``).
    Times are seconds since the run started, on the run's clock.
    """

    label: str
    records: list[RequestRecord]
    requests: pd.DataFrame
    steps: pd.DataFrame
    trace: pd.DataFrame
    stats: dict
    settings: dict
    wall_s: float  # wall time of the whole run (virtual runs are much faster than their clock)
    extra: dict = field(default_factory=dict)

    @classmethod
    def from_engine(cls, label: str, engine: Engine, records: list[RequestRecord], wall_s: float) -> "ServingRun":
        frame = requests_frame(records)
        frame.insert(0, "run", label)
        frame["token_s"] = [list(r.token_s) for r in records]
        steps = engine.step_requests_frame()
        steps.insert(0, "run", label)
        trace = engine.trace_frame()
        trace.insert(0, "run", label)
        return cls(label, records, frame, steps, trace, engine.stats(), engine.settings(), wall_s)

    def summary(self, slo: SLO | None = None) -> Summary:
        """The four clocks of the run (``kvlab.clocks.summarize``) at its last event."""
        return summarize(self.records, slo=slo)

    def record(self, request_id) -> RequestRecord:
        for r in self.records:
            if r.request_id == request_id:
                return r
        raise ValueError(f"request {request_id!r} is not in run {self.label!r}; its ids are "
                         f"{[r.request_id for r in self.records][:20]}")

    def tokens(self) -> pd.DataFrame:
        """One row per output token: run, request_id, token (0 = first), t_s, gap_s (since the previous token)."""
        return tokens_frame(self.requests)


def tokens_frame(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per output token from a requests frame with a ``token_s`` column (gap_s NaN for token 0)."""
    rows = [(getattr(row, "run", ""), row.request_id, i, t, t - row.token_s[i - 1] if i else np.nan)
            for row in requests.itertuples(index=False) for i, t in enumerate(row.token_s)]
    return pd.DataFrame(rows, columns=["run", "request_id", "token", "t_s", "gap_s"])


def serve(model_or_config: Decoder | ModelConfig, requests: Sequence[Request], spec: EngineSpec | None = None, *,
          label: str = "run", clock: str = "wall", executor: Executor | None = None,
          threads: int | None = LESSON_THREADS) -> ServingRun:
    """Run ``requests`` through a fresh ``Engine(model_or_config, spec)`` and keep every table of the run."""
    engine = Engine(model_or_config, spec, executor=executor)
    with torch_threads(threads):
        start = time.perf_counter()
        records = engine.run(requests, clock=clock)
        wall = time.perf_counter() - start
    return ServingRun.from_engine(label, engine, records, wall)


_WARM: set[int] = set()


def warm_up(model: Decoder, threads: int | None = LESSON_THREADS) -> None:
    """Pay one-time costs (first allocations, first kernels) once per model before timed runs."""
    if id(model) in _WARM:
        return
    vocab = model.config.vocab_size
    requests = [Request(i, 24, 4, 0.0, "warm-up", prompt=[(7 * i + j) % vocab for j in range(24)]) for i in range(3)]
    serve(model, requests, EngineSpec(scheduler=SchedulerConfig(max_seqs=2, max_batch_tokens=32, max_model_len=64)),
          label="warm-up", threads=threads)
    _WARM.add(id(model))


def serve_plan(model: Decoder, plan: Sequence[tuple[str, Sequence[Request], EngineSpec, dict]], desc: str, *,
               clock: str, executor: Executor | None, threads: int | None, progress: Progress) -> list[ServingRun]:
    """Warm ``model`` up (unless an ``executor`` stands in for it), then serve each (label, requests, spec, extra)
    of ``plan`` in turn, with ``extra`` in ``run.extra``."""
    if executor is None:
        warm_up(model, threads)
    runs = []
    for label, requests, spec, extra in progress(plan, total=len(plan), desc=desc, unit="run"):
        run = serve(model.config if executor is not None else model, requests, spec, label=label, clock=clock,
                    executor=executor, threads=threads)
        run.extra.update(extra)
        runs.append(run)
    return runs


# -- tables over several runs -----------------------------------------------------------------------
def runs_table(runs: Iterable[ServingRun]) -> pd.DataFrame:
    """One row per run: counts, throughput, the clocks' quantiles (with n), steps, batch size, KV use.

    ``mean_batch`` is the mean number of sequences per executed step; ``busy_s`` the summed step durations (time the
    model was computing), so ``tokens_per_busy_s`` is output per second of work.
    """
    rows = []
    for run in runs:
        s = run.summary().to_dict()
        trace = run.trace
        busy = float(trace["duration_s"].sum()) if len(trace) else 0.0
        rows.append({
            "run": run.label, "sent": s["sent"], "completed": s["completed"], "failed": s["failed"],
            "output_tokens": s["output_tokens"], "duration_s": s["duration_s"],
            "output_tokens_per_s": s["output_tokens_per_s"],
            "ttft_n": s["ttft_n"], "ttft_mean_s": s["ttft_mean_s"], "ttft_p50_s": s["ttft_p50_s"],
            "ttft_p95_s": s["ttft_p95_s"], "tpot_p50_s": s["tpot_p50_s"], "itl_max_s": _max_gap(run.records),
            "e2e_p50_s": s["e2e_p50_s"], "e2e_p95_s": s["e2e_p95_s"],
            "steps": len(trace), "mean_batch": float(trace["num_seqs"].mean()) if len(trace) else np.nan,
            "busy_s": busy, "tokens_per_busy_s": s["output_tokens"] / busy if busy > 0 else np.nan,
            "peak_running": int(trace["num_running"].max()) if len(trace) else 0,
            "peak_blocks_used": int(trace["kv_blocks_used"].max()) if len(trace) else 0,
            "preemptions": run.stats["preemptions"], "prefix_hit_rate": run.stats["prefix_hit_rate"],
            "wall_s": run.wall_s,
        })
    return pd.DataFrame(rows)


def _max_gap(records: Iterable[RequestRecord]) -> float:
    gaps = [g for r in records if r.status == "completed" for g in r.itl_s()]
    return float(max(gaps)) if gaps else np.nan


def records_from_frame(requests: pd.DataFrame) -> list[RequestRecord]:
    """RequestRecords rebuilt from a requests frame with ``token_s`` (so a panel's frame can be summarized)."""
    def opt(v):
        return None if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)
    return [RequestRecord(request_id=r.request_id, prompt_tokens=int(r.prompt_tokens),
                          max_new_tokens=int(r.max_new_tokens), scheduled_s=float(r.scheduled_s),
                          sent_s=opt(r.sent_s), admitted_s=opt(r.admitted_s), first_token_s=opt(r.first_token_s),
                          token_s=list(r.token_s), finished_s=opt(r.finished_s),
                          status=r.status, fail_reason=r.fail_reason if isinstance(r.fail_reason, str) else None)
            for r in requests.itertuples(index=False)]


def runs_frame(runs: Sequence[ServingRun]) -> pd.DataFrame:
    """The requests of every run stacked (column ``run``), for a panel.

    ``frame.attrs`` carries what the figures need besides: ``steps`` and ``trace`` (stacked the same way), ``runs``
    (``runs_table``) and ``settings`` (per run label).
    """
    if not runs:
        raise ValueError("runs_frame needs at least one ServingRun")
    frame = pd.concat([r.requests for r in runs], ignore_index=True)
    frame.attrs.update(steps=pd.concat([r.steps for r in runs], ignore_index=True),
                       trace=pd.concat([r.trace for r in runs], ignore_index=True),
                       runs=runs_table(runs), settings={r.label: r.settings for r in runs})
    return frame


def check_positive_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


def resolve_model(model: Decoder | None) -> Decoder:
    if model is None:
        return lesson_model()
    if not isinstance(model, Decoder):
        raise TypeError(f"model must be a kvlab Decoder (kvlab.build_model(...)), got {type(model).__name__}")
    return model


__all__ = ["FixedStepCostExecutor", "ServingRun", "lesson_model", "records_from_frame", "runs_frame", "runs_table",
           "serve", "tokens_frame", "warm_up"]
