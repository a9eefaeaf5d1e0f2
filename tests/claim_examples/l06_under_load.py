"""Claim examples of notebook 06 (under load): small results of each of its four kinds (the simulator against the
real model, service curves, counts on a round-number cost model, the A/B rules), and checks built by hand
on which each wall-clock sentence is false."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import pandas as pd

from kvlab.experiments.service_curves import (ab_at_two_loads, scheduler_config, service_curve, service_curves,
                                               simulated_vs_real)

from . import counterexample, example


@example("simulator_throughput_close_to_real", "simulator_medians_within_factor_two",
         "real_and_simulated_rise_with_load")
@lru_cache(maxsize=2)
def _check_example(seed: int = 0) -> pd.DataFrame:
    from kvlab.model.lessons import lesson_config
    from kvlab.serving.calibrate import calibrate

    from kvlab.serving.sweep import estimate_capacity_rps
    from kvlab.workload import make_workload

    small = lesson_config()  # as in the notebook, smaller: a shorter calibration, fewer requests
    cost = calibrate(small, budget_s=1)
    sample = make_workload("short_short", 12, arrival="all_at_once", seed=seed)
    capacity = estimate_capacity_rps(cost, sample, max_seqs=16)
    return simulated_vs_real([round(f * capacity, 1) for f in (0.3, 0.7, 1.2)], requests=30, config=small,
                             cost_model=cost, seed=seed)


@example("simulator_much_faster_than_real_time", "long_traffic_bends_at_lower_rate",
         "latency_climbs_and_refusals_start_past_the_knee")
@lru_cache(maxsize=2)
def _curves_example(seed: int = 0) -> pd.DataFrame:
    return service_curves(requests=80, levels=5, scheduler=scheduler_config(max_seqs=16, max_waiting=16), seed=seed)


@example("quantile_counts_fewer_than_sent")
@lru_cache(maxsize=1)
def _exact_example() -> pd.DataFrame:
    from kvlab.model.config import llama_30m
    from kvlab.serving.cost_model import CostModel

    round_model = CostModel(coefficients=dict(step=0.02, prefill_tokens=1e-3, attention_calls=1e-4,
                                              decode_seqs=1e-3, decode_kv_slots=1e-5, prefill_attention=1e-6),
                            config=llama_30m().to_dict(), settings={"block_size": 16})
    return service_curve("mixture", rates=[1.0, 3.0, 6.0], requests=100, cost_model=round_model,
                         scheduler=scheduler_config(max_seqs=16, max_waiting=16))


@example("ab_overloaded_more_throughput_later_first_token", "ab_overloaded_prefill_first_streams_slower",
         "ab_below_capacity_both_keep_up")
@lru_cache(maxsize=1)
def _ab_example() -> pd.DataFrame:
    return ab_at_two_loads()


def check_by_hand(real: dict, simulated: dict, rates: Sequence[float] = (10.0, 20.0, 40.0),
                  n: int = 12) -> pd.DataFrame:
    """A ``simulated_vs_real`` frame built by hand: per source, each clock's value at each load."""
    rows = []
    for source, values in (("real", real), ("simulated", simulated)):
        for i, rate in enumerate(rates):
            rows.append({"source": source, "offered_rps": rate, "completed": n, "ttft_n": n, "tpot_n": n,
                         "e2e_n": n, **{k: v[i] for k, v in values.items()}})
    return pd.DataFrame(rows)


_SIM = dict(achieved_rps=[10.0, 19.0, 30.0], ttft_p50_s=[0.010, 0.012, 0.020], ttft_p95_s=[0.012, 0.015, 0.030],
            tpot_p50_s=[0.003, 0.004, 0.006], e2e_p50_s=[0.07, 0.09, 0.13], e2e_p95_s=[0.10, 0.14, 0.20])


