"""Claim examples of notebook 09 (measure a real server): measurements of kvlab's server on loopback, the schedule
sent to a scripted server, the two-engine comparison; and those measurements edited so that each wall-clock
sentence is false. They need kvlab's "serve" extra (httpx, FastAPI, uvicorn), imported only when one runs."""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import pandas as pd

from kvlab.lessons.l09_measure_a_real_server.claims import _rows

from . import counterexample, example


@lru_cache(maxsize=1)
def _server():
    """kvlab's server on loopback, started once for the examples (stopped when the interpreter exits)."""
    from kvlab.experiments.wire import measure_at_client, start_server

    server = start_server(max_waiting=8)
    measure_at_client(server.url, num_requests=8, rate=8)  # warm, as the notebook's earlier sections leave it
    return server


@example("wire_adds_little_on_loopback")
def _side(seed: int = 0) -> pd.DataFrame:
    from kvlab.experiments.wire import client_vs_engine

    return client_vs_engine(_server().url, num_requests=12, rate=10, seed=seed)


@example("achieved_rate_below_offered_explained", "full_queue_turns_requests_away", "wait_grows_past_capacity")
def _curve(seed: int = 0) -> pd.DataFrame:
    from kvlab.experiments.wire import wire_service_curve

    return wire_service_curve(_server().url, rates=(8, 256), duration_s=1.0, seed=seed)


@example("seeded_schedule_sends_near_offered")
@lru_cache(maxsize=1)
def _scheduled_curve() -> pd.DataFrame:
    """The notebook's rates and seconds per rate, sent to the scripted server (no model): only the schedule matters."""
    from kvlab.experiments.wire import wire_service_curve
    from kvlab.http.local import ServerThread
    from kvlab.http.scripted import scripted_app

    with ServerThread(scripted_app(ttft_s=0.002, gap_s=0.001)) as server:
        return wire_service_curve(server.url, rates=(8, 32, 256), duration_s=1.5)


@counterexample("wire_adds_little_on_loopback")
def _wire_over_the_goal(side: pd.DataFrame) -> pd.DataFrame:  # HTTP and streaming add 8 ms to every request
    side["ttft_overhead_s"] = 0.008
    return side


def _curve_edit(curve: Any, row: int, **values) -> pd.DataFrame:
    t = _rows(curve)
    for col, v in values.items():
        t.loc[t.index[row], col] = v(t.loc[t.index[row]]) if callable(v) else v
    return t


@counterexample("achieved_rate_below_offered_explained")
def _kept_up_but_slow(curve: Any) -> pd.DataFrame:  # nothing turned away, the highest rate served at half the rate
    t = _rows(curve)  # the claim reads the highest clean rate, which a fast machine makes the last one
    t["rejected"], t["failed_other"], t["completed"] = 0, 0, t["sent"]
    window = lambda r: r.scheduled_span_s * 2 + r.e2e_p50_s  # noqa: E731 - a queue that ran a span past the last arrival
    return _curve_edit(t, -1, window_s=window, drain_s=lambda r: window(r) - r.scheduled_span_s,
                       requests_per_s=lambda r: r.completed / window(r))


@counterexample("full_queue_turns_requests_away")
def _nobody_turned_away(curve: Any) -> pd.DataFrame:  # the highest rate rejected nothing
    return _curve_edit(curve, -1, rejected=0)


@counterexample("wait_grows_past_capacity")
def _wait_rises_then_falls(_example: Any) -> pd.DataFrame:  # TTFT p50 7 -> 60 -> 20 ms over three rates
    return pd.DataFrame({"offered_rps": [8.0, 32.0, 128.0], "ttft_p50_s": [0.007, 0.060, 0.020],
                         "ttft_n": [8, 32, 100]})


@lru_cache(maxsize=1)
def engines_run():
    """Both servers on the lesson model with the notebook's settings (kvlab alone where transformers serve cannot
    run): made only where this session's run of notebook 09 did not show these claims, and by
    scripts/claims_robustness.py."""
    from kvlab.experiments.two_engines import SWEEP_DURATION_S, SWEEP_RATES, Protocol, compare_engines

    return compare_engines(rates=SWEEP_RATES, protocol=Protocol(duration_s=SWEEP_DURATION_S))


@example("two_engines_account_for_every_request", "two_engines_same_weights", "cold_start_costs_the_first_requests",
         "two_engines_at_low_load", "per_token_time_under_load", "kvlab_knee_beyond_transformers")
def _engines() -> pd.DataFrame:
    return engines_run().frame


@counterexample("per_token_time_under_load")
def _same_token_time(engines: pd.DataFrame) -> pd.DataFrame:  # every TPOT p50 4 ms, on both engines
    same = {k: 0.004 for k in ("tpot_p50_s", "tpot_p50_sent_s") if k in engines or k == "tpot_p50_s"}
    return engines.assign(**same)

