"""Measuring a real server over the wire: start kvlab's server on loopback, load it from the client, count everything.

Everything here goes through a real socket:

- `start_server` runs `python -m kvlab serve` in a subprocess of *this* interpreter on 127.0.0.1 and a free port; it is
  stopped when the interpreter exits, even if a notebook cell failed before `stop()`.
- `measure_at_client` sends one seeded workload open-loop with the load generator and returns its client-side records
  (the four clocks).
- `accounting` checks that every request sent is accounted for: completed, rejected by backpressure (HTTP 429), or
  failed for a stated reason, and that the tokens the client counted match what the workload asked for.
- `client_vs_engine` puts client and engine clocks of the same requests side by side (`kvlab.http.compare`);
  `overhead_table` reads them in milliseconds.
- `server_metrics` reads kvlab's server's own counters (Prometheus `/metrics`), so the client's count of each outcome
  can be checked against the server's.
- `wire_service_curve` loads the server at several offered rates, each for the same length of time: one row per rate,
  the service curve at the client.

The same functions measure any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's server) given its URL, except
`client_vs_engine`, which needs the engine-side records only kvlab's server publishes.
"""
from __future__ import annotations

import atexit
import re
import time
from typing import Sequence, cast

import httpx
import numpy as np
import pandas as pd

from kvlab.clocks import RequestRecord
from kvlab.http.client import api_key_from_env, auth_headers
from kvlab.http.compare import measure_http_overhead
from kvlab.http.loadgen import LoadTestResult, base_url, http_workload, run_loadtest
from kvlab.http.local import LOOPBACK, ServerProcess
from kvlab.workload import ARRIVALS, PROFILE_NAMES
from kvlab.progress import Progress, no_progress
from kvlab.provenance import experiment

REJECTED = "http_429"  # fail_reason prefix of a request the server's bounded queue turned away
DEFAULT_RATES = (8.0, 32.0, 256.0)


# -- the server ---------------------------------------------------------------------------------
def serve_args(model: str | None = None, max_waiting: int = 32, max_seqs: int | None = None,
               extra: Sequence[str] = ()) -> list[str]:
    """The arguments after `python -m` that start kvlab's server (host and port are added by ServerProcess)."""
    if not (isinstance(max_waiting, int) and max_waiting >= 1):
        raise ValueError(f"max_waiting={max_waiting!r} must be an integer >= 1 (the server's queue bound)")
    if max_seqs is not None and not (isinstance(max_seqs, int) and max_seqs >= 1):
        raise ValueError(f"max_seqs={max_seqs!r} must be an integer >= 1, or None for the server's default")
    args = ["kvlab", "serve", "--max-waiting", str(max_waiting), "--log-level", "warning"]
    if model is not None:
        args += ["--model", model]
    if max_seqs is not None:
        args += ["--max-seqs", str(max_seqs)]
    return args + list(extra)


def start_server(model: str | None = None, max_waiting: int = 32, max_seqs: int | None = None,
                 extra: Sequence[str] = (), log_path: str | None = None, timeout_s: float = 120.0) -> ServerProcess:
    """Start `python -m kvlab serve` on 127.0.0.1 (a free port) and wait until `/health` answers.

    Uses this interpreter, so the server runs the same kvlab as the notebook; stopped at exit (atexit) too, so a cell
    that failed before `server.stop()` leaves no process behind. `model`: a preset or a checkpoint directory.
    """
    server = ServerProcess(serve_args(model, max_waiting, max_seqs, extra), host=LOOPBACK, log_path=log_path)
    atexit.register(server.stop)
    return server.start(timeout_s=timeout_s)


_METRIC = re.compile(r'^kvlab_(\w+?)(?:\{outcome="(\w+)"\})? ([0-9.eE+-]+)$')


def server_metrics(url: str, timeout_s: float = 10.0, api_key: str | None = None) -> dict:
    """kvlab's server's gauges and counters from `GET /metrics`: {name: value}, and `requests_total` by outcome.

    ``api_key`` (else ``$KVLAB_API_KEY``) for a server started with one (a teacher's, for a room)."""
    resp = httpx.get(base_url(url) + "/metrics", timeout=timeout_s, trust_env=False,
                     headers=auth_headers(api_key_from_env(api_key)))
    found = resp.status_code != 404
    if found:
        resp.raise_for_status()
    out: dict = {"requests_total": {}}
    for line in (resp.text.splitlines() if found else ()):
        m = _METRIC.match(line)
        if m is None:
            continue
        name, outcome, value = m[1], m[2], float(m[3])
        value = int(value) if value.is_integer() else value
        if outcome is not None:
            out["requests_total"][outcome] = value
        else:
            out[name] = value
    if not out["requests_total"]:
        raise ValueError(f"{base_url(url)}/metrics has no kvlab_requests_total; only kvlab's own server "
                         "(python -m kvlab serve) publishes these counters")
    return out


def wait_until_idle(url: str, timeout_s: float = 10.0, api_key: str | None = None) -> dict:
    """Poll `server_metrics` until nothing waits or runs; return the metrics then (raise after `timeout_s`)."""
    deadline = time.perf_counter() + timeout_s
    while True:
        metrics = server_metrics(url, api_key=api_key)
        if metrics["num_requests_waiting"] == 0 and metrics["num_requests_running"] == 0:
            return metrics
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{url} still has {metrics['num_requests_waiting']} waiting and "
                               f"{metrics['num_requests_running']} running requests after {timeout_s} s")
        time.sleep(0.05)


# -- one measurement at the client ----------------------------------------------------------
def _check_workload(profile: str, num_requests: int, rate: float, arrival: str) -> None:
    if profile not in PROFILE_NAMES:
        raise ValueError(f"profile {profile!r} is not one of {', '.join(PROFILE_NAMES)}")
    if arrival not in ARRIVALS or arrival == "all_at_once":
        raise ValueError(f"arrival {arrival!r}: use one of constant, poisson, gamma (a rate is part of this lesson)")
    if isinstance(num_requests, bool) or not isinstance(num_requests, (int, np.integer)) or num_requests < 1:
        raise ValueError(f"num_requests={num_requests!r} must be an integer >= 1")
    if not (isinstance(rate, (int, float)) and rate > 0):
        raise ValueError(f"rate={rate!r} must be a positive number of requests per second")


def measure_at_client(url: str, num_requests: int = 24, rate: float = 6.0, profile: str = "short_short",
                      arrival: str = "poisson", seed: int = 0, model: str | None = None,
                      timeout_s: float = 30.0) -> LoadTestResult:
    """Send `num_requests` seeded requests open-loop at `rate` req/s to `url`; the client-side records.

    `ignore_eos` is sent so that every request writes exactly its `max_tokens` (kvlab and vLLM honour it): the token
    count is then known in advance and can be checked (`accounting`).
    """
    _check_workload(profile, num_requests, rate, arrival)
    requests = http_workload(profile, num_requests, arrival=arrival, rate=rate, seed=seed)
    settings = {"workload": {"profile": profile, "num_requests": num_requests, "arrival": arrival,
                             "rate": rate, "seed": seed}}
    return run_loadtest(url, requests, model, extra_body={"ignore_eos": True}, timeout_s=timeout_s,
                        progress=False, settings=settings)


def _records(result: LoadTestResult | Sequence[RequestRecord]) -> list[RequestRecord]:
    return list(result.records if isinstance(result, LoadTestResult) else result)


def accounting(result: LoadTestResult | Sequence[RequestRecord]) -> dict:
    """Where every request went, and whether the tokens add up.

    `rejected`: HTTP 429, the server's queue was full. `tokens_asked` (max_tokens of completed requests), `tokens_usage`
    (the server's `usage` counts) and `tokens_streamed` (text chunks the client stamped) are equal with `ignore_eos` and
    one token per chunk.
    """
    records = _records(result)
    done = [r for r in records if r.status == "completed"]
    rejected = sum(1 for r in records if r.status == "failed" and (r.fail_reason or "").startswith(REJECTED))
    failed = sum(1 for r in records if r.status == "failed")
    methods = {r.extra.get("output_tokens_from") for r in done}
    return {
        "sent": len(records), "completed": len(done), "rejected": rejected, "failed_other": failed - rejected,
        "accounted_for": len(done) + failed == len(records),
        "tokens_asked": sum(r.max_new_tokens for r in done),
        "tokens_usage": sum(r.output_tokens_reported for r in done if r.output_tokens_reported is not None),
        "tokens_streamed": sum(len(r.token_s) for r in done),
        "output_tokens_from": methods.pop() if len(methods) == 1 else ("mixed" if methods else "none"),
    }


# -- client clocks next to engine clocks ----------------------------------------------------------
@experiment  # a notebook's prediction of the overhead is checked to have been asked before this ran
def client_vs_engine(url: str, num_requests: int = 24, rate: float = 8.0, max_new_tokens: int = 8,
                     seed: int = 0) -> pd.DataFrame:
    """The same requests timed at the client and inside kvlab's engine (`kvlab.http.compare`).

    A low constant rate, so nothing waits for a batch slot and the difference between the two clocks is HTTP, the
    server's event loop and streaming. Only kvlab's server publishes the engine-side records (`GET /kvlab/requests`).
    """
    _check_workload("short_short", num_requests, rate, "constant")
    return measure_http_overhead(url, num_requests, rate=rate, max_new_tokens=max_new_tokens, seed=seed)


def median_overhead_ms(frame: pd.DataFrame) -> float:
    """The median over requests of client TTFT (from sending) minus engine TTFT, in ms (a prediction's measure)."""
    return float(frame["ttft_overhead_s"].median() * 1e3)


def overhead_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Median, p90 and max in milliseconds of each clock of `client_vs_engine`'s frame, with n."""
    if frame.empty:
        raise ValueError("no request completed on both sides; is this kvlab's server, and did any request complete?")
    rows = [("client TTFT (from scheduled arrival)", "client_ttft_s"),
            ("client TTFT (from sending)", "client_ttft_from_sent_s"),
            ("engine TTFT (from receiving)", "engine_ttft_s"),
            ("TTFT overhead: HTTP + streaming", "ttft_overhead_s"),
            ("E2E overhead: HTTP + streaming", "e2e_overhead_s")]
    out = []
    for label, col in rows:
        ms = frame[col].to_numpy(dtype=float) * 1e3
        out.append({"clock": label, "n": int(ms.size), "p50_ms": float(np.median(ms)),
                    "p90_ms": float(np.quantile(ms, 0.9)), "max_ms": float(ms.max())})
    return pd.DataFrame(out)


# -- the service curve over the wire ------------------------------------------------------------
def check_rates(rates: Sequence[float]) -> tuple[float, ...]:
    """The rates as floats, refused unless every one is a positive number and they do not repeat."""
    rates = tuple(rates)
    if not rates:
        raise ValueError("rates is empty; give offered loads in requests per second, e.g. (8, 32, 256)")
    bad = [r for r in rates if isinstance(r, bool) or not isinstance(r, (int, float, np.number)) or not r > 0]
    if bad:
        raise ValueError(f"rates {bad} are not positive numbers of requests per second")
    if len(set(rates)) != len(rates):
        raise ValueError(f"rates {list(rates)} repeat a value; give each offered load once")
    return tuple(float(r) for r in rates)


def sent_schedule(result: LoadTestResult | Sequence[RequestRecord]) -> dict:
    """The rate actually offered: requests scheduled, and the span from the first to the last scheduled arrival.

    A seeded Poisson schedule of `n` requests at `rate` spans about `n / rate` seconds but not exactly: `sent_rps` = n /
    span is the rate this run really offered (the same on every machine).
    """
    records = _records(result)
    arrivals = [r.scheduled_s for r in records]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    return {"scheduled_span_s": span, "sent_rps": len(records) / span if span > 0 else float("nan")}


def service_row(rate: float, result: LoadTestResult) -> dict:
    """One row of the service curve: offered rate, what came back, and the four clocks (`wire_service_curve`)."""
    summary = result.summary()
    row = {"offered_rps": rate, **accounting(result), **summary.to_dict(), "wall_s": result.wall_s}
    row.update(sent_schedule(result), window_s=summary.duration_s)
    row["drain_s"] = row["window_s"] - row["scheduled_span_s"]
    delays = [r.clocks()["send_delay_s"] for r in result.records if r.extra.get("sent")]
    row["send_delay_max_s"] = max(delays) if delays else float("nan")
    return row


def requests_per_rate(rate: float, num_requests: int | None = None, duration_s: float | None = None,
                      min_requests: int = 8) -> int:
    """How many requests one rate of a service curve sends: `num_requests`, or `rate` × `duration_s` (at least `min_requests`).

    A fixed count stretches low rates and squeezes high ones into a short burst; a fixed duration exposes every rate to
    the same length of load, which is what a steady-state curve needs.
    """
    if (num_requests is None) == (duration_s is None):
        raise ValueError(f"give num_requests ({num_requests}) or duration_s ({duration_s}), exactly one")
    if duration_s is not None:
        if not (isinstance(duration_s, (int, float)) and duration_s > 0):
            raise ValueError(f"duration_s={duration_s!r} must be a positive number of seconds")
        return max(int(min_requests), int(round(rate * duration_s)))
    return cast(int, num_requests)  # exactly one of the two was given


def wire_service_curve(url: str, rates: Sequence[float] = DEFAULT_RATES, num_requests: int | None = None,
                       duration_s: float | None = 2.0, profile: str = "short_short", arrival: str = "poisson",
                       seed: int = 0, model: str | None = None, timeout_s: float = 30.0,
                       progress: Progress = no_progress) -> pd.DataFrame:
    """Seeded requests at each offered rate, measured at the client; one row per rate.

    Each rate sends `num_requests` requests, or (the default) `rate` × `duration_s` of them, at least 8
    (`requests_per_rate`); give `num_requests` and `duration_s=None` for a fixed count. Same profile and seed at every
    rate, so the rows differ by load alone. Columns: `offered_rps`, `num_requests`, `accounting`'s counts, the run's
    `Summary`, `sent_schedule`'s, `window_s` (first scheduled arrival to the last event: what `requests_per_s` divides
    by), `drain_s` (window minus span: the last answers finishing after the last arrival), `wall_s` and
    `send_delay_max_s` (how far the client itself fell behind its schedule).
    """
    rates = check_rates(rates)
    counts = [requests_per_rate(rate, num_requests, duration_s) for rate in rates]
    for rate, n in zip(rates, counts):
        _check_workload(profile, n, rate, arrival)
    results = [(rate, n, measure_at_client(url, n, rate, profile, arrival, seed, model, timeout_s))
               for rate, n in progress(list(zip(rates, counts)), total=len(rates), desc="offered rates", unit="rate")]
    table = pd.DataFrame([{"num_requests": n, **service_row(rate, result)} for rate, n, result in results])
    table.attrs["settings"] = {"url": url, "num_requests": num_requests, "duration_s": duration_s,
                               "profile": profile, "arrival": arrival, "seed": seed}
    return table
