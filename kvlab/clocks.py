"""The four clocks: per-request timestamps -> TTFT, time between tokens, E2E, throughput.

An engine (or the HTTP load generator) stamps one `RequestRecord` per request
at the *client side*; this module turns records into latencies, counts and
rates. Names and definitions follow vLLM's `bench serve` (its metrics documentation):

| kvlab name | vLLM   | definition (per request unless said)                       |
|------------|--------|------------------------------------------------------------|
| `ttft_s`   | TTFT   | first_token_s - scheduled_s                                |
| `tpot_s`   | TPOT   | (e2e_s - ttft_s) / (output_tokens - 1), output_tokens >= 2 |
| `itl_s`    | ITL    | every gap between consecutive token stamps, pooled over    |
|            |        | all requests (one stamp per streamed chunk over HTTP)      |
| `e2e_s`    | E2EL   | finished_s - scheduled_s (completed requests only)         |
| `queue_s`  | --     | admitted_s - scheduled_s (first admission to a batch)      |
| `send_delay_s` | -- | sent_s - scheduled_s (how far the client fell behind)      |

GuideLLM calls our TPOT "ITL" and E2E / output_tokens "TPOT"; we do not report the latter. Every clock starts at the
*scheduled* arrival, not at the actual send, so a client that falls behind under load cannot hide the wait (open loop;
no coordinated omission).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence, cast, get_args

import numpy as np
import pandas as pd

Status = Literal["waiting", "running", "completed", "failed"]
STATUSES: tuple[Status, ...] = get_args(Status)
CLOCKS = ("ttft", "tpot", "itl", "e2e", "queue")
DEFAULT_QS = (0.5, 0.9, 0.95, 0.99)
_NAN = float("nan")


@dataclass
class RequestRecord:
    """Timestamps of one request, all float seconds on one clock.

    The clock may be `time.perf_counter()` or a simulator's virtual time. `finished_s` is the time of the terminal
    event: completion, or failure (then `fail_reason` says why: "queue_full", "prompt_too_long", "cancelled",
    "preempted_too_often", ...). `admitted_s` is the *first* admission into a running batch; a request preempted and
    re-admitted keeps its first admission and its tokens already streamed. `output_tokens_reported` is the server's
    `usage` count; when given it is the `output_tokens` used for TPOT and throughput, because over HTTP one streamed
    chunk (one stamp in `token_s`) may carry several tokens.
    """

    request_id: int | str
    prompt_tokens: int
    max_new_tokens: int
    scheduled_s: float
    sent_s: float | None = None  # None -> scheduled_s
    admitted_s: float | None = None
    first_token_s: float | None = None
    token_s: list[float] = field(default_factory=list)
    finished_s: float | None = None
    status: Status = "waiting"
    fail_reason: str | None = None
    output_tokens_reported: int | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.sent_s is None:
            self.sent_s = self.scheduled_s
        if self.status not in STATUSES:
            raise ValueError(f"request {self.request_id}: status {self.status!r} is not one of {STATUSES}")

    @classmethod
    def from_request(cls, request, sent_s: float | None = None) -> "RequestRecord":
        """A fresh record for a `kvlab.workload.Request` (its profile goes to `extra`)."""
        return cls(request.request_id, request.prompt_tokens, request.max_new_tokens, request.arrival_s, sent_s,
                   extra={"profile": request.profile})

    # -- events, in the order an engine sees them --------------------------
    def admit(self, t: float) -> None:
        """The request joined a running batch (only the first admission is kept)."""
        if self.admitted_s is None:
            self.admitted_s = t
        self.status = "running"

    def token(self, t: float) -> None:
        """One output token (or streamed chunk) arrived at time `t`."""
        if self.first_token_s is None:
            self.first_token_s = t
        self.token_s.append(t)
        self.status = "running"

    def finish(self, t: float, output_tokens: int | None = None) -> None:
        """The request completed; `output_tokens` is the server's usage count, if known."""
        self.finished_s = t
        self.status = "completed"
        if output_tokens is not None:
            self.output_tokens_reported = output_tokens

    def fail(self, t: float, reason: str) -> None:
        """The request ended without completing, for `reason`."""
        self.finished_s = t
        self.status = "failed"
        self.fail_reason = reason

    # -- derived quantities --------------------------------------------------
    @property
    def output_tokens(self) -> int:
        """`output_tokens_reported` if the server gave it, else len(token_s)."""
        return len(self.token_s) if self.output_tokens_reported is None else self.output_tokens_reported

    def state_at(self, until_s: float) -> Status | None:
        """State at time `until_s`: None if not yet sent, else one of STATUSES.

        Ended (completed / failed) once `finished_s <= until_s`; running once admitted (or, with no admission stamp,
        once its first token came); waiting before that.
        """
        self.check()
        if cast(float, self.sent_s) > until_s:  # __post_init__ filled a None
            return None
        if self.finished_s is not None and self.finished_s <= until_s:
            return self.status
        started = self.admitted_s if self.admitted_s is not None else self.first_token_s
        if started is not None and started <= until_s:
            return "running"
        return "waiting"

    def check(self) -> None:
        """Raise ValueError if the stamps contradict the status."""
        ended = self.status in ("completed", "failed")
        if ended and self.finished_s is None:
            raise ValueError(f"request {self.request_id} is {self.status} but has no finished_s; "
                             "use record.finish(t) or record.fail(t, reason)")
        if not ended and self.finished_s is not None:
            raise ValueError(f"request {self.request_id} has finished_s={self.finished_s} but status {self.status!r}")

    def clocks(self) -> dict:
        """This request's clocks (NaN where not defined), as in the module table."""
        def since_scheduled(t):
            return _NAN if t is None else t - self.scheduled_s

        ttft = since_scheduled(self.first_token_s)
        e2e = since_scheduled(self.finished_s) if self.status == "completed" else _NAN
        n = self.output_tokens
        tpot = (e2e - ttft) / (n - 1) if n >= 2 and not math.isnan(e2e) else _NAN
        return {"send_delay_s": cast(float, self.sent_s) - self.scheduled_s,  # __post_init__ filled a None
                "queue_s": since_scheduled(self.admitted_s), "ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}

    def itl_s(self) -> list[float]:
        """Gaps between consecutive token stamps (vLLM's ITL, before pooling)."""
        return np.diff(self.token_s).tolist()


@dataclass(frozen=True)
class SLO:
    """Latency targets in seconds; a request meets the SLO if it meets every one given.

    A request with one output token has no TPOT and meets any TPOT target (as in vLLM, which counts its TPOT as 0).
    """

    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    def __post_init__(self) -> None:
        given = self.targets()
        if not given:
            raise ValueError("SLO needs at least one target, e.g. SLO(ttft_s=0.5) or SLO(tpot_s=0.05, e2e_s=5)")
        for k, v in given.items():
            if not v > 0:
                raise ValueError(f"SLO {k}={v} must be a positive number of seconds")

    def targets(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft_s", self.ttft_s), ("tpot_s", self.tpot_s), ("e2e_s", self.e2e_s))
                if v is not None}

    def met(self, clocks: Mapping[str, float]) -> bool:
        """Whether a completed request's clocks meet every target."""
        return all(clocks[k] <= target or (k == "tpot_s" and math.isnan(clocks[k]))
                   for k, target in self.targets().items())


def quantiles(values: Iterable[float], qs: Sequence[float] = DEFAULT_QS) -> dict[str, float]:
    """`{"n", "mean", "p50", ...}` of `values`, ignoring NaN.

    The sample size `n` always comes with the quantiles: a p99 of 20 values is the second-largest value, not a tail.
    With n = 0 every statistic is NaN. Quantiles use numpy's default (linear interpolation).
    """
    for q in qs:
        _check_quantile(q)
    x = np.asarray(list(values), dtype=float)
    x = x[~np.isnan(x)]
    return {"n": int(x.size), "mean": float(x.mean()) if x.size else _NAN,
            **{f"p{q * 100:g}": float(np.quantile(x, q)) if x.size else _NAN for q in qs}}


def _check_quantile(q: float, example: str = "write p95 as 0.95") -> None:
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} is outside [0, 1]; {example}")


def ttft_censored(records: Iterable[RequestRecord], until_s: float, q: float = 0.95) -> dict:
    """The TTFT quantile ``q`` over every request sent by ``until_s`` and not refused: the unfinished are counted.

    A request whose first token came by the cut-off gives its TTFT; one with no first token yet gives the wait so
    far, ``until_s - scheduled_s``, which its TTFT can only exceed (right-censored). Dropping those, as a quantile
    over completed requests does, keeps the lucky survivors and hides the longest waits. The quantile of these
    values is a lower bound of the true one (``at_least``) when any wait is censored (a true wait can only be
    longer, which can only raise the quantile), and exact when none is. Failed requests (refused, errors) have no
    first token to wait for: counted apart.

    Returns ``{"value", "n", "censored", "failed", "at_least"}``.
    """
    _check_quantile(q)
    waits, open_waits, failed = [], [], 0
    for r in records:
        state = r.state_at(until_s)
        if state is None:
            continue
        if r.first_token_s is not None and r.first_token_s <= until_s:
            waits.append(r.first_token_s - r.scheduled_s)
        elif state == "failed":
            failed += 1
        else:
            open_waits.append(until_s - r.scheduled_s)
    x = np.asarray(waits + open_waits, dtype=float)
    value = float(np.quantile(x, q)) if x.size else _NAN
    return {"value": value, "n": int(x.size), "censored": len(open_waits), "failed": failed,
            "at_least": bool(open_waits)}


def tpot_censored(records: Iterable[RequestRecord], until_s: float, q: float = 0.5) -> dict:
    """The TPOT quantile ``q`` over every request with a first token by ``until_s``: the unfinished are counted.

    A request completed by the cut-off gives its TPOT. One still streaming, with ``k`` tokens (streamed chunks)
    by then, gives ``(until_s - first_token_s) / k``: its next token comes after the cut-off, so its TPOT at
    that token can only be larger (right-censored). Dropping those keeps the requests that got through and
    hides a stalled stream. The quantile is then a lower bound of the true one (``at_least``), exact when
    nothing is open. Failed requests and those without a first token count apart (the latter are TTFT's wait,
    ``ttft_censored``). Over HTTP an open request's ``k`` counts chunks: a server packing several tokens into
    one chunk makes its gap per chunk, not per token.

    Returns ``{"value", "n", "censored", "at_least"}``.
    """
    _check_quantile(q, "write p50 as 0.5")
    done, open_gaps = [], []
    for r in records:
        state = r.state_at(until_s)
        if state is None or state == "failed" or r.first_token_s is None or r.first_token_s > until_s:
            continue
        if state == "completed":
            done.append(r.clocks()["tpot_s"])
        else:
            k = sum(t <= until_s for t in r.token_s)
            open_gaps.append((until_s - r.first_token_s) / k)
    x = np.asarray(done + open_gaps, dtype=float)
    x = x[~np.isnan(x)]  # a completed one-token request has no TPOT
    value = float(np.quantile(x, q)) if x.size else _NAN
    return {"value": value, "n": int(x.size), "censored": len(open_gaps), "at_least": bool(open_gaps)}


def requests_frame(records: Iterable[RequestRecord]) -> pd.DataFrame:
    """One row per request: ids, lengths, status, raw stamps and every clock; keys of `record.extra` (`profile`) too."""
    rows = []
    for r in records:
        r.check()
        row = {k: getattr(r, k) for k in ("request_id", "status", "fail_reason", "prompt_tokens", "max_new_tokens",
                                          "output_tokens", "scheduled_s", "sent_s", "admitted_s", "first_token_s",
                                          "finished_s")} | r.clocks()
        rows.append(row | {k: v for k, v in r.extra.items() if k not in row})
    return pd.DataFrame(rows)


@dataclass
class Summary:
    """The four clocks of a run, at the cut-off `until_s`.

    Counts: sent = completed + failed + waiting + running. `latency` maps each clock in CLOCKS to its `quantiles()`
    dict. Throughput is over `duration_s` = first scheduled arrival -> `until_s`.
    """

    until_s: float
    duration_s: float
    sent: int
    completed: int
    failed: int
    waiting: int
    running: int
    failed_by_reason: dict[str, int]
    latency: dict[str, dict[str, float]]
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    streamed_tokens_per_s: float
    slo: SLO | None = None
    slo_met: int | None = None
    goodput_rps: float = _NAN
    slo_share: float = _NAN

    def to_dict(self) -> dict:
        """Flat dict: counts, `{clock}_n`, `{clock}_mean_s`, `{clock}_p50_s`, ..., rates, SLO."""
        counts = ("until_s", "duration_s", "sent", "completed", "failed", "waiting", "running")
        d = {k: getattr(self, k) for k in counts}
        d.update({f"failed_{reason}": n for reason, n in sorted(self.failed_by_reason.items())})
        for clock, stats in self.latency.items():
            for stat, v in stats.items():
                d[f"{clock}_n" if stat == "n" else f"{clock}_{stat}_s"] = v
        d.update(output_tokens=self.output_tokens, output_tokens_per_s=self.output_tokens_per_s,
                 requests_per_s=self.requests_per_s, streamed_tokens_per_s=self.streamed_tokens_per_s)
        if self.slo is not None:
            d.update({f"slo_{k}": v for k, v in self.slo.targets().items()})
            d.update(slo_met=self.slo_met, goodput_rps=self.goodput_rps, slo_share=self.slo_share)
        return d

    def to_frame(self) -> pd.DataFrame:
        """`to_dict()` as a one-row DataFrame (concatenate rows across load levels)."""
        return pd.DataFrame([self.to_dict()])

    def latency_frame(self) -> pd.DataFrame:
        """One row per clock, columns n, mean, p50, p90, ... (seconds)."""
        return pd.DataFrame.from_dict(self.latency, orient="index").rename_axis("clock")


def summarize(records: Sequence[RequestRecord], window_s: float | None = None, slo: SLO | None = None,
              until_s: float | None = None, qs: Sequence[float] = DEFAULT_QS) -> Summary:
    """Counts, latency quantiles, throughput and goodput at a cut-off.

    The cut-off is `until_s` (absolute), or `window_s` after the first scheduled arrival, or by default the last event
    of any record. At the cut-off each sent request is completed, failed, running or waiting (see
    `RequestRecord.state_at`). Latency samples come from requests completed by the cut-off, as in vLLM (failed and
    unfinished requests have no E2E); their count is `completed`, next to `waiting` and `running`.

    - `output_tokens_per_s`: output tokens of completed requests / duration (vLLM).
    - `streamed_tokens_per_s`: every token stamped by the cut-off, any status / duration.
    - `requests_per_s`: completed requests / duration.
    - `goodput_rps`: completed requests meeting every SLO target / duration;
      `slo_share`: those / requests ended by the cut-off (a failure misses the SLO).
    """
    records = list(records)
    if not records:
        raise ValueError("summarize() needs at least one RequestRecord")
    if window_s is not None and until_s is not None:
        raise ValueError(f"give window_s ({window_s}) or until_s ({until_s}), not both")
    start = min(r.scheduled_s for r in records)
    if window_s is not None:
        if not window_s > 0:
            raise ValueError(f"window_s={window_s} must be > 0 seconds")
        until_s = start + window_s
    elif until_s is None:
        until_s = max(t for r in records for t in (r.scheduled_s, r.sent_s, r.admitted_s, r.first_token_s, r.finished_s,
                                                   *r.token_s) if t is not None)  # the last event of any record
    duration = until_s - start

    counts, by_reason, streamed = dict.fromkeys(STATUSES, 0), dict[str, int](), 0
    done: list[RequestRecord] = []
    for r in records:
        state = r.state_at(until_s)
        if state is None:
            continue
        counts[state] += 1
        streamed += sum(1 for t in r.token_s if t <= until_s)
        if state == "failed":
            by_reason[r.fail_reason or "unknown"] = by_reason.get(r.fail_reason or "unknown", 0) + 1
        elif state == "completed":
            done.append(r)

    per_request = [r.clocks() for r in done]
    samples = {c: [x[f"{c}_s"] for x in per_request] for c in ("ttft", "tpot", "e2e", "queue")}
    samples["itl"] = [gap for r in done for gap in r.itl_s()]
    latency = {c: quantiles(samples[c], qs) for c in CLOCKS}

    def rate(count: float) -> float:
        return count / duration if duration > 0 else _NAN

    output_tokens = sum(r.output_tokens for r in done)
    summary = Summary(until_s, duration, sum(counts.values()), counts["completed"], counts["failed"], counts["waiting"],
                      counts["running"], by_reason, latency, output_tokens, rate(output_tokens), rate(len(done)),
                      rate(streamed))
    if slo is not None:
        met = sum(slo.met(x) for x in per_request)
        ended = summary.completed + summary.failed
        summary.slo, summary.slo_met = slo, met
        summary.goodput_rps = rate(met)
        summary.slo_share = met / ended if ended else _NAN
    return summary
