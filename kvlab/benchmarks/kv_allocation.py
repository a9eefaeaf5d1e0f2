"""Paged blocks vs max-length reservation, measured: the same requests in one KV budget, three allocators.

Part of ``python -m kvlab bench batching`` (its module doc says what is reported): paged blocks (``BlockManager``)
against max-length reservation (``ReservationEngine``, ``kvlab/serving/reservation.py``), reserving ``max_model_len`` or
each request's prompt + max_new_tokens.
"""
from __future__ import annotations

from typing import Protocol

import numpy as np

from kvlab.clocks import summarize
from kvlab.model.config import ModelConfig
from kvlab.serving.config import EngineSpec
from kvlab.serving.cost_model import CostModel
from kvlab.serving.engine import Engine
from kvlab.serving.reservation import ReservationEngine
from kvlab.serving.scheduler import SchedulerConfig
from kvlab.workload import Request


class PoolSettings(Protocol):
    """What the comparison reads of the batching benchmark's settings (``BenchSettings``)."""

    @property
    def block_size(self) -> int: ...
    @property
    def max_model_len(self) -> int: ...
    @property
    def max_batch_tokens(self) -> int: ...


def kv_usage(engine: Engine) -> dict:
    """Concurrency and waste over a finished run, from the engine's per-step trace (time-weighted by step)."""
    t = engine.trace_frame()
    w = t["duration_s"].to_numpy()
    allocated = t["kv_blocks_used"].to_numpy() * engine.block_size
    held = t["kv_tokens_held"].to_numpy()
    return {"peak_running": int(t["num_running"].max()), "mean_running": float(np.average(t["num_running"], weights=w)),
            "waste_fraction": float(1 - np.sum(held * w) / np.sum(allocated * w)),
            "peak_blocks_used": int(t["kv_blocks_used"].max()), "num_blocks": engine.num_blocks,
            "preemptions": engine.scheduler.num_preemptions, "steps": len(t), "makespan_s": float(t["end_s"].max())}


def paged_vs_reservation(requests: list[Request], cost_model: CostModel, s: PoolSettings,
                         kv_budget_tokens: int | None = None) -> dict:
    """The same requests in the same KV budget: paged blocks vs reserving max_model_len (and prompt+max_new)."""
    config = ModelConfig(**cost_model.config)
    tokens = kv_budget_tokens or 4 * s.max_model_len
    sched = SchedulerConfig(max_seqs=len(requests), max_batch_tokens=max(s.max_batch_tokens, len(requests)),
                            max_model_len=s.max_model_len)
    spec = EngineSpec(block_size=s.block_size, enable_prefix_caching=False,
                      scheduler=sched).with_blocks(config, tokens // s.block_size)
    rows = {}
    for name, make in (("paged", lambda: Engine(cost_model, spec)),
                       ("reserve_max_model_len", lambda: ReservationEngine(cost_model, spec, reserve="max_model_len")),
                       ("reserve_request", lambda: ReservationEngine(cost_model, spec, reserve="request"))):
        engine = make()
        records = engine.run(requests, clock="virtual")
        rows[name] = {**kv_usage(engine), "completed": sum(r.status == "completed" for r in records),
                      "simulated_output_tokens_per_s": summarize(records).output_tokens_per_s}
    p, r = rows["paged"], rows["reserve_max_model_len"]
    return {"kv_budget_tokens": tokens, "kv_budget_bytes": spec.kv_budget_bytes, "max_model_len": s.max_model_len,
            "accounting": "BlockManager (paged) vs ReservingBlockManager (kvlab.serving.reservation), "
                          "same scheduler, virtual time on the cost model",
            "runs": rows, "ratio_mean_running": p["mean_running"] / r["mean_running"],
            "ratio_peak_running": p["peak_running"] / r["peak_running"]}


def print_paging(p: dict) -> None:
    """The comparison's lines of the benchmark's report (``p``: what ``paged_vs_reservation`` returned)."""
    print(f"KV budget {p['kv_budget_tokens']} tokens (max_model_len {p['max_model_len']}):")
    for name, r in p["runs"].items():
        print(f"  {name:<22} peak {r['peak_running']:>3} sequences, mean {r['mean_running']:.1f}, "
              f"waste {r['waste_fraction']:.1%}, preemptions {r['preemptions']}")
    print(f"  paged / reserve max_model_len: {p['ratio_mean_running']:.2f}x mean concurrent sequences, "
          f"{p['ratio_peak_running']:.2f}x peak")


__all__ = ["PoolSettings", "kv_usage", "paged_vs_reservation", "print_paging"]
