"""Two real engines, one client: kvlab serve and transformers serve on one checkpoint, cold and warm, up to the knee.

`python -m kvlab bench serve` repeats it in rounds. Both servers load the same folder (`lesson_checkpoint`: the lesson
model with a byte tokenizer, so the two cut a text prompt into the same tokens), measured one at a time on loopback, and
get the same seeded open-loop workload from the same load client (`kvlab.http.loadgen`), text prompts, every answer run
to its `max_tokens`:

- **cold**: the first `cold_requests` requests after the server started, at the low rate;
- **warm**: after `warmup` more requests (not reported), the same low rate again;
- **sweep**: warm, at rising offered rates, each for `duration_s` seconds, stopped at the first rate past the *knee*:
  the highest rate with at least `min_served` of the requests completed and TTFT p95 within `slo_ttft_s`. Each rate is
  read at its *close*, `drain_s` after its last scheduled arrival: what is unfinished then counts as waiting or running,
  and the knee's TTFT p95 is over every request sent, an unanswered one counted at its wait so far
  (`kvlab.clocks.ttft_censored`), so an engine that falls behind is not waited out, nor judged on the requests it
  happened to finish.

One row per (engine, phase, rate) with the four clocks, their n and the counts (sent = completed + failed + waiting +
running). Both servers start together (each on its own process; starting is not what is measured), then each is measured
alone while the other idles. `same_greedy_answer` checks on the wire that the two servers hold the same weights: one
greedy completion, equal text.
"""
from __future__ import annotations

import dataclasses
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from kvlab.clocks import tpot_censored, ttft_censored
from kvlab.http.loadgen import LoadTestResult, http_workload, run_loadtest
from kvlab.http.peer import (LoopbackServer, greedy_answer, kvlab_server, transformers_serve_available,
                         transformers_server)
from kvlab.http.vllm import NAME as VLLM
from kvlab.http.vllm import vllm_server
from kvlab.http.shared_checkpoint import check_same_tokens, save_byte_tokenizer, save_shared_checkpoint
from kvlab.workload import Request
from kvlab.progress import Progress, no_progress
from kvlab.threads import LESSON_THREADS
from kvlab.serving.knee import KEEPS_UP_RATIO, Knee, find_knee, keeps_up

ENGINES = ("kvlab serve", "transformers serve")
GREEDY_PROMPT = "k3=v7;k5=v2;k9=v4;?k5:"  # a recall query: the lesson model answers it
CONTEXT = 512  # the lesson model's context: prompts are clipped so prompt + max_tokens fit
LOW_RATE = 8.0  # req/s of the cold and warm phases: well below either engine's knee, so little waits
DRAIN_S = 2.0  # a sweep rate is read this long after its last arrival; whatever is open then counts as waiting
# The lesson's ladder: both engines keep up at the low rungs; near the top transformers serve falls behind on a
# 2-core CPU while kvlab serve still keeps up. A second each (at least `min_requests`): about 4 s of sweep per engine.
SWEEP_RATES = (8.0, 24.0, 48.0)
SWEEP_DURATION_S = 1.0
CLOSE_SLACK_S = 0.05  # the client cuts off what is unfinished just after the close, so the close sees it open


@dataclass(frozen=True)
class Protocol:
    """How an engine is measured over the wire (the module doc), passed whole to every phase; checked when made."""

    low_rate: float = LOW_RATE  # req/s of the cold and warm phases
    cold_requests: int = 6  # the first requests after the server started
    warmup: int = 4  # unreported requests before the warm phase, and of the sweep's profile before every sweep
    warm_requests: int = 12
    low_profile: str = "short_short"
    sweep_profile: str = "mixture"
    duration_s: float = 2.0  # of load per sweep rate (at least `min_requests` requests)
    slo_ttft_s: float = 1.0  # a rate keeps up when TTFT p95 over every request sent is within this
    min_served: float = KEEPS_UP_RATIO  # and at least this share of its requests completed
    bisect: int = 2  # halvings of the gap between the last rate kept up and the first not (`knee_search`)
    seed: int = 0
    timeout_s: float = 30.0
    drain_s: float = DRAIN_S

    def __post_init__(self) -> None:
        for name in ("low_rate", "duration_s", "slo_ttft_s", "timeout_s", "drain_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not (isinstance(v, (int, float)) and v > 0):
                raise ValueError(f"{name}={v!r} must be a positive number (req/s or seconds)")
        for name, least in (("cold_requests", 1), ("warmup", 0), ("warm_requests", 1), ("bisect", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < least:
                raise ValueError(f"{name}={v!r} must be a whole number >= {least}")
        keeps_up(1.0, min_served=self.min_served)  # refuses a share outside (0, 1]


# -- the checkpoint and the servers ---------------------------------------------------------------
def lesson_checkpoint(folder: str | Path | None = None) -> Path:
    """The lesson model (recall-tiny) with a byte tokenizer as one folder both servers load; checked.

    The shipped files are in transformers' format already (config.json, model.safetensors), so they are copied as they
    are, beside `save_byte_tokenizer`'s files (`save_shared_checkpoint` does the same for any kvlab model)."""
    from kvlab.experiments.recall import RECALL_MODEL_DIR, load_recall_model

    folder = Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="kvlab-two-engines-")) / "recall-tiny"
    if not (folder / "tokenizer.json").is_file():
        if not (RECALL_MODEL_DIR / "model.safetensors").is_file():
            save_shared_checkpoint(load_recall_model(), folder)  # says what is missing, or saves what loads
        else:
            folder.mkdir(parents=True, exist_ok=True)
            for name in ("config.json", "generation_config.json", "model.safetensors"):
                shutil.copy2(RECALL_MODEL_DIR / name, folder / name)
            save_byte_tokenizer(folder)
    check_same_tokens(folder)
    return folder


def make_server(engine: str, folder: str | Path, threads: int | None = LESSON_THREADS, **settings) -> LoopbackServer:
    """`kvlab_server`, `transformers_server` or `vllm_server` (its threads are its own) by name, not started."""
    if engine == "kvlab serve":
        return kvlab_server(folder, threads=threads, **settings)
    if engine == "transformers serve":
        return transformers_server(folder, threads=threads, **settings)
    if engine == VLLM:
        return vllm_server(folder, **settings)
    raise ValueError(f"engine {engine!r} is not one of {(*ENGINES, VLLM)}")


def start_together(servers: Sequence[LoopbackServer]) -> list[LoopbackServer]:
    """Start every server at once (each loads its model in its own process) and wait for all; if one fails,
    stop the others and raise its error."""
    with ThreadPoolExecutor(max(1, len(servers))) as pool:
        futures = [pool.submit(s.start) for s in servers]
        errors = [f.exception() for f in futures]
    if any(errors):
        for s in servers:
            s.stop()
        raise next(e for e in errors if e is not None)
    return list(servers)


def same_greedy_answer(servers: Sequence[LoopbackServer], prompt: str = GREEDY_PROMPT, max_tokens: int = 12) -> dict:
    """{engine: greedy text} of one prompt on each running server, and `same`: whether all are equal."""
    answers = {s.name: greedy_answer(s, prompt, max_tokens) for s in servers}
    return {"prompt": prompt, "answers": answers, "same": len(set(answers.values())) == 1}


# -- one measurement ----------------------------------------------------------------------------------
def engine_workload(profile: str, num_requests: int, rate: float, seed: int = 0,
                    arrival: str = "poisson") -> list[Request]:
    """The seeded workload every engine gets: printable-ASCII prompts, clipped to the model's context."""
    return http_workload(profile, num_requests, arrival=arrival, rate=rate, seed=seed, max_context=CONTEXT)


def measure(server: LoopbackServer, requests: Sequence[Request], timeout_s: float = 30.0,
            close_s: float | None = None) -> LoadTestResult:
    """Send `requests` open-loop to the running `server` as text, every answer run to its max_tokens.

    `close_s` (seconds from the run's start): what has not finished then is cut off just after it, to be read at the
    close by `clock_row`; None: every request runs to its end or timeout."""
    deadline = None if close_s is None else close_s + CLOSE_SLACK_S
    return run_loadtest(server.url, requests, server.model, prompt_format="text", extra_body=server.extra_body,
                        timeout_s=timeout_s, deadline_s=deadline, progress=False,
                        settings={"engine": server.name, "close_s": close_s})


def burst(requests: Sequence[Request]) -> list[Request]:
    """The same requests, all arriving at once: a warm-up, never reported, need not wait for a schedule."""
    return [dataclasses.replace(r, arrival_s=0.0) for r in requests]


def clock_row(engine: str, phase: str, rate: float, result: LoadTestResult, num_requests: int | None = None) -> dict:
    """One row: the counts, served share, and n / p50 / p95 of TTFT, TPOT and E2E (seconds), achieved rates.

    Read at the run's close (`measure`'s `close_s`) if one came before every request ended. `ttft_p95_sent_s` is the p95
    over every request sent, the unfinished counted at their wait so far (a lower bound when `ttft_censored` > 0);
    `tpot_p50_sent_s` likewise over every open stream (`kvlab.clocks.tpot_censored`); the other quantiles are over the
    completed requests."""
    close = result.settings.get("close_s")
    s = result.summary()
    if close is not None and s.until_s > close:
        s = result.summary(until_s=close)
    sent = ttft_censored(result.records, s.until_s)
    row = {"engine": engine, "phase": phase, "offered_rps": float(rate), "sent": s.sent, "completed": s.completed,
           "failed": s.failed, "waiting": s.waiting + s.running,
           "failed_reasons": ", ".join(f"{k} {v}" for k, v in sorted(s.failed_by_reason.items())),
           "served": s.completed / s.sent if s.sent else float("nan")}
    for clock in ("ttft", "tpot", "e2e"):
        q = s.latency[clock]
        row.update({f"{clock}_n": q["n"], f"{clock}_p50_s": q["p50"], f"{clock}_p95_s": q["p95"]})
    gaps = tpot_censored(result.records, s.until_s)
    row.update(ttft_p95_sent_s=sent["value"], ttft_censored=sent["censored"], tpot_p50_sent_s=gaps["value"],
               tpot_sent_n=gaps["n"], tpot_censored=gaps["censored"])
    # the client's own lateness: how long after its scheduled time each request went out, and the connections it had
    # to open on the way (a server slow to accept shows here, not only in TTFT)
    lags = [r.sent_s - r.scheduled_s for r in result.records if r.sent_s is not None]
    connects = [r.extra["connect_s"] for r in result.records if "connect_s" in r.extra]
    row.update(send_delay_p95_s=float(np.percentile(lags, 95)) if lags else float("nan"),
               new_connections=len(connects), connect_max_s=max(connects) if connects else 0.0)
    if num_requests is not None:  # what the schedule held: `sent` is counted from the records, so they can differ
        row["num_requests"] = int(num_requests)
    row.update(requests_per_s=s.requests_per_s, output_tokens_per_s=s.output_tokens_per_s, wall_s=result.wall_s)
    return row


def within_knee(row: dict | pd.Series, slo_ttft_s: float, min_served: float = KEEPS_UP_RATIO) -> bool:
    """Whether a rate keeps up (`kvlab.serving.knee.keeps_up`): at least `min_served` of its requests completed and
    TTFT p95 <= `slo_ttft_s` (over every request sent, `ttft_p95_sent_s`, where the row has it)."""
    p95 = row["ttft_p95_sent_s"] if "ttft_p95_sent_s" in row else row["ttft_p95_s"]
    return keeps_up(float(row["served"]), float(p95), slo_ttft_s, min_served)


def knee(rows: pd.DataFrame, slo_ttft_s: float, min_served: float = KEEPS_UP_RATIO) -> Knee:
    """The knee of one engine's sweep rows (`kvlab.serving.knee.find_knee` over `within_knee`)."""
    rows = rows.sort_values("offered_rps")
    return find_knee(rows["offered_rps"].astype(float).tolist(),
                     [within_knee(row, slo_ttft_s, min_served) for _, row in rows.iterrows()])


def cold_and_warm(server: LoopbackServer, protocol: Protocol) -> list[dict]:
    """Cold (the first requests after start), then `warmup` unreported requests, then warm, at the low rate."""
    p, rate = protocol, protocol.low_rate
    cold = measure(server, engine_workload(p.low_profile, p.cold_requests, rate, p.seed), p.timeout_s)
    if p.warmup:
        measure(server, burst(engine_workload(p.low_profile, p.warmup, rate, p.seed + 1)), p.timeout_s)
    return [clock_row(server.name, "cold", rate, cold, p.cold_requests), warm_row(server, protocol)]


def warm_row(server: LoopbackServer, protocol: Protocol) -> dict:
    """The warm phase: `warm_requests` at the low rate, measured."""
    p = protocol
    warm = measure(server, engine_workload(p.low_profile, p.warm_requests, p.low_rate, p.seed + 2), p.timeout_s)
    return clock_row(server.name, "warm", p.low_rate, warm, p.warm_requests)


def sweep(server: LoopbackServer, rates: Sequence[float], protocol: Protocol, *, warm_up: bool = True,
          stop_past_knee: bool = True, min_requests: int = 8) -> list[dict]:
    """Warm rows at each offered rate (rate x `duration_s` requests, at least `min_requests`), lowest first,
    each read at its close, `drain_s` after its last scheduled arrival (`clock_row`).

    `warm_up`: `warmup` unreported requests of the sweep's profile go first, all at once, so an engine's first long
    prompt (shapes the low-load phases never sent) does not land in the first level's p95. With `stop_past_knee` the
    sweep ends at the first rate not served (`within_knee`)."""
    p = protocol
    if warm_up and p.warmup:
        lowest = min(float(r) for r in rates)
        measure(server, burst(engine_workload(p.sweep_profile, p.warmup, lowest, p.seed + 1)), p.timeout_s)
    rows = []
    for rate in sorted(float(r) for r in rates):
        n = max(min_requests, int(round(rate * p.duration_s)))
        requests = engine_workload(p.sweep_profile, n, rate, p.seed)
        close = max(r.arrival_s for r in requests) + p.drain_s
        rows.append(clock_row(server.name, "sweep", rate, measure(server, requests, p.timeout_s, close_s=close), n))
        if stop_past_knee and not within_knee(rows[-1], p.slo_ttft_s, p.min_served):
            break
    return rows


# -- the whole comparison ---------------------------------------------------------------------------
@dataclass
class EnginesRun:
    """What `compare_engines` measured: one row per (engine, phase, rate), the servers, the same-weights check.

    `frame.attrs` carries the rest too, for a panel or a claim that holds only the frame."""

    frame: pd.DataFrame
    servers: dict = field(default_factory=dict)  # engine -> LoopbackServer.describe()
    greedy: dict = field(default_factory=dict)  # engine -> greedy text of GREEDY_PROMPT
    settings: dict = field(default_factory=dict)
    unavailable: str | None = None  # why transformers serve was not measured, if it was not

    def knees(self) -> dict:
        """{engine: the `Knee` of its sweep}."""
        return engine_knees(self.frame, self.settings["slo_ttft_s"], self.settings["min_served"])


def engine_knees(frame: pd.DataFrame, slo_ttft_s: float, min_served: float = KEEPS_UP_RATIO) -> dict:
    """{engine: the `Knee` of its sweep rows}."""
    return {e: knee(g, slo_ttft_s, min_served) for e, g in frame[frame.phase == "sweep"].groupby("engine", sort=False)}


def compare_engines(folder: str | Path | None = None, rates: Sequence[float] = (4.0, 16.0),
                    protocol: Protocol = Protocol(), threads: int | None = LESSON_THREADS,
                    engines: Sequence[str] = ENGINES, progress: Progress = no_progress) -> EnginesRun:
    """Start the engines together on the same folder; measure each in turn (cold, warm, a sweep), then stop it.

    Where transformers serve cannot run, it is left out and `EnginesRun.unavailable` says why in one line."""
    if not rates or any(not (isinstance(r, (int, float)) and r > 0) for r in rates):
        raise ValueError(f"rates={list(rates)!r} must be positive numbers of requests per second")
    unknown = [e for e in engines if e not in ENGINES]
    if unknown:
        raise ValueError(f"engines {unknown} are not among {ENGINES}")
    folder = lesson_checkpoint(folder)
    ok, why = transformers_serve_available()
    todo = [e for e in engines if ok or e != "transformers serve"]
    rows, servers, greedy = [], {}, {}
    started = start_together([make_server(e, folder, threads=threads) for e in todo])
    try:
        for server in progress(started, total=len(started), desc="engines", unit="engine"):
            try:
                rows += cold_and_warm(server, protocol) + sweep(server, rates, protocol)
                greedy[server.name] = greedy_answer(server, GREEDY_PROMPT, 12)
                servers[server.name] = server.describe()
            finally:
                server.stop()
    finally:
        for server in started:
            server.stop()
    settings = {"folder": str(folder), "rates": [float(r) for r in rates], **dataclasses.asdict(protocol),
                "threads": threads}
    frame = pd.DataFrame(rows)
    frame.attrs.update(servers=servers, greedy=greedy, settings=settings, unavailable=None if ok else why)
    return EnginesRun(frame, servers, greedy, settings, None if ok else why)


def clocks_table(run: EnginesRun | pd.DataFrame) -> pd.DataFrame:
    """The rows a learner reads: engine, phase, rate, counts, and each clock's n, p50 and p95 in ms (over the
    completed requests, n of them; TTFT's p95 also over every request sent, the knee's)."""
    t = run.frame if isinstance(run, EnginesRun) else run
    ms = 1e3
    return pd.DataFrame({
        "engine": t["engine"], "phase": t["phase"], "offered req/s": t["offered_rps"], "sent": t["sent"],
        "completed": t["completed"], "failed": t["failed"], "waiting": t["waiting"],
        "TTFT n": t["ttft_n"], "TTFT p50 ms": t["ttft_p50_s"] * ms, "TTFT p95 ms": t["ttft_p95_s"] * ms,
        "TTFT p95 ms, all sent": t["ttft_p95_sent_s"] * ms,
        "TPOT n": t["tpot_n"], "TPOT p50 ms": t["tpot_p50_s"] * ms, "TPOT p95 ms": t["tpot_p95_s"] * ms,
        "E2E p50 ms": t["e2e_p50_s"] * ms, "E2E p95 ms": t["e2e_p95_s"] * ms,
        "achieved req/s": t["requests_per_s"], "output tok/s": t["output_tokens_per_s"],
        # how late the client's requests went out (p95): a machine that leaves the client waiting shows here
        "client late p95 ms": t["send_delay_p95_s"] * ms if "send_delay_p95_s" in t else np.nan,
    })


__all__ = ["CONTEXT", "DRAIN_S", "ENGINES", "LOW_RATE", "SWEEP_DURATION_S", "SWEEP_RATES", "EnginesRun", "GREEDY_PROMPT",
           "Protocol", "burst", "clock_row", "clocks_table", "cold_and_warm", "compare_engines", "engine_knees",
           "engine_workload", "knee", "lesson_checkpoint", "make_server", "measure", "same_greedy_answer",
           "start_together", "sweep", "warm_row", "within_knee"]
