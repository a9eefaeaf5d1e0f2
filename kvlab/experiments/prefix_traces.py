"""Real traffic: replay a production trace with its shared prefixes, and see what prefix caching buys.

Production prompts share prefixes: system prompts, a conversation's earlier turns, an agent's
tool descriptions. A Mooncake trace says which 512-token prompt blocks repeat (``kvlab.traces``);
this lesson measures what that sharing is worth, from the most any cache could reuse down to
what the engine reuses with the KV memory it has:

1. **ideal** (``ideal_hit_ratio``): every block ever seen is kept forever. A prompt block is a
   hit when an earlier request held the same chain of block ids (the block and everything before
   it), at least as long. Measured in the trace's own blocks.
2. **ideal at the engine's block size** (``reachable_hits``): the same with the engine's
   rules: it caches only *full* blocks of ``block_size`` tokens, and it always computes at least
   the prompt's last token (that token's logits give the first output token), so a prompt seen
   whole before still recomputes its last block.
3. **engine, cache larger than the trace**: requests that arrive while the request they share a
   prefix with is still computing it miss (the blocks are registered only once computed).
4. **engine at a KV capacity** (``capacity_curve``): blocks held by running requests cannot be
   reused by the cache, and freed blocks are evicted least recently used first when memory runs out.

Every run goes through the real ``BlockManager`` and scheduler, priced by the calibrated cost
model (``CostModelExecutor``, virtual time): a trace of hours replays in seconds. Hit ratios are
per request at its first admission (``RequestRecord.extra["cached_tokens"]``), over prompt tokens
and over prompt blocks. ``caching_on_off`` compares the same trace at the same offered load with
prefix caching on and off: TTFT quantiles (with n), prompt tokens computed, throughput.
``trace_curve`` is a service curve of a trace of either format, raising the replay rate level by
level (``python -m kvlab sweep --trace PATH``).
"""
from __future__ import annotations

import dataclasses
import math
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pandas as pd

from kvlab.clocks import SLO, RequestRecord
from kvlab.model.config import ModelConfig
from kvlab.serving.config import EngineSpec
from kvlab.serving.cost_model import CostModel, load_calibration
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import SchedulerConfig
from kvlab.serving.sweep import auto_rates, estimate_capacity_rps, level_row, load_sweep, mark_knee
from kvlab.traces import (MOONCAKE_SAMPLE_TRACE, detect_format, mooncake_frame, read_any_trace, replay_trace,
                          trace_requests)
from kvlab.workload import Request, Workload, at_rate, trace_rate
from kvlab.experiments.presets import DEFAULT_SLO, LESSON_SPEC, MAX_MODEL_LEN, scheduler_config
from kvlab.progress import Progress, no_progress
from kvlab.provenance import experiment

SAMPLE_LENGTH_SCALE = 16  # the shipped sample's prompts (median ~3,800 tokens, at most ~12,900) / 16 fit 1024


# -- 1. the ideal: every block ever seen kept -----------------------------------------------------
def _block_hits(frame: pd.DataFrame) -> Iterator[tuple[Any, list[tuple[int, int, int]]]]:  # an itertuples row
    """Each request of the trace in order, with its blocks as (block id, tokens in it, tokens an earlier
    request held there): the ideal cache's hits, found in the trie of chains (see ``prefix_sharing``)."""
    children: dict[tuple[int, int], int] = {}  # (parent node, block id) -> node: the trie of chains
    longest: dict[int, int] = {}  # node -> most tokens any earlier request held in that block
    b = int(frame["block_tokens"].iloc[0]) if len(frame) else 1
    for r in frame.itertuples(index=False):
        node, blocks = -1, []
        for i, block_id in enumerate(r.hash_ids):
            node = children.setdefault((node, block_id), len(children))
            size = min(b, r.prompt_tokens - i * b)  # the last block may be partial
            seen = longest.get(node, 0)
            blocks.append((block_id, size, min(seen, size)))
            longest[node] = max(seen, size)
        yield r, blocks


def prefix_sharing(frame: pd.DataFrame) -> pd.DataFrame:
    """Per request of a ``mooncake_frame`` (in arrival order), what an ideal prefix cache reuses.

    Columns: request_id, arrival_s, prompt_tokens, blocks, hit_blocks, hit_tokens. Block i is
    keyed by its chain hash_ids[:i+1] (a trie, so the key is exact); it is a hit when an earlier
    request held that chain with at least as many tokens in block i, and its hit tokens are at most
    what the longest earlier copy held (a partial block reuses only what was there).
    """
    rows = []
    for r, blocks in _block_hits(frame):
        hit_blocks = sum(hit == size for _, size, hit in blocks)
        hit_tokens = sum(hit for _, _, hit in blocks)
        rows.append((r.request_id, r.arrival_s, r.prompt_tokens, len(r.hash_ids), hit_blocks, hit_tokens))
    return pd.DataFrame(rows, columns=["request_id", "arrival_s", "prompt_tokens", "blocks", "hit_blocks",
                                       "hit_tokens"])


def ideal_hit_ratio(frame: pd.DataFrame) -> dict:
    """The trace's ideal prefix-cache hit ratio, in blocks and in tokens (see ``prefix_sharing``)."""
    s = prefix_sharing(frame)
    blocks, tokens = int(s["blocks"].sum()), int(s["prompt_tokens"].sum())
    return {"requests": len(s), "block_tokens": int(frame["block_tokens"].iloc[0]), "blocks": blocks,
            "hit_blocks": int(s["hit_blocks"].sum()), "block_hit_ratio": s["hit_blocks"].sum() / blocks,
            "prompt_tokens": tokens, "hit_tokens": int(s["hit_tokens"].sum()),
            "token_hit_ratio": s["hit_tokens"].sum() / tokens}


def ideal_hit_percent(frame: pd.DataFrame) -> tuple[float, dict]:
    """The ideal token hit ratio in percent, with the two counts it is computed from (a prediction's measure)."""
    ideal = ideal_hit_ratio(frame)
    return 100 * ideal["token_hit_ratio"], {"hit tokens": ideal["hit_tokens"], "prompt tokens": ideal["prompt_tokens"]}


SHARED_MIN_REQUESTS = 9  # the shipped sample's sessions have at most 8 requests: a block in 9 or more is shared


def hit_sources(frame: pd.DataFrame, shared_min_requests: int = SHARED_MIN_REQUESTS) -> pd.DataFrame:
    """Where the ideal cache's hits come from (``prefix_sharing``'s hits, request by request, split by block).

    A block id found in at least ``shared_min_requests`` prompts is counted as part of a *shared
    prompt* (a system prompt or an agent's tool list: many sessions send it); any other block is
    a session's *own* (an earlier turn of the same conversation or agent run, repeated in its later
    prompts). The split rests on that count alone: the trace has no session ids. The default fits
    the shipped sample, whose sessions have at most 8 requests; for another trace choose a count
    above its longest session. Columns: request_id, prompt_tokens, hit_tokens, shared_hit_tokens,
    own_hit_tokens and kind: "later turn" (reuses blocks of its own), "first turn under a shared
    prompt" (reuses shared blocks only) or "nothing reused".
    """
    if isinstance(shared_min_requests, bool) or not isinstance(shared_min_requests, int) or shared_min_requests < 1:
        raise ValueError(f"shared_min_requests={shared_min_requests!r}: need a whole number of requests >= 1")
    popularity: dict[int, int] = {}
    for ids in frame["hash_ids"]:
        for h in set(ids):
            popularity[h] = popularity.get(h, 0) + 1
    rows = []
    for r, blocks in _block_hits(frame):
        shared = sum(hit for block_id, _, hit in blocks if popularity[block_id] >= shared_min_requests)
        own = sum(hit for block_id, _, hit in blocks if popularity[block_id] < shared_min_requests)
        kind = "later turn" if own else ("first turn under a shared prompt" if shared else "nothing reused")
        rows.append((r.request_id, r.prompt_tokens, shared + own, shared, own, kind))
    return pd.DataFrame(rows, columns=["request_id", "prompt_tokens", "hit_tokens", "shared_hit_tokens",
                                       "own_hit_tokens", "kind"])


def hit_sources_table(sources: pd.DataFrame) -> pd.DataFrame:
    """``hit_sources`` by kind of request: n requests, their prompt tokens, and the ideal hits from each source."""
    kinds = ["later turn", "first turn under a shared prompt", "nothing reused"]
    g = sources.groupby("kind")[["prompt_tokens", "hit_tokens", "shared_hit_tokens", "own_hit_tokens"]].sum()
    g.insert(0, "requests", sources.groupby("kind").size())
    g = g.reindex(kinds).fillna(0).astype(int)
    total = g.sum().rename("all requests")
    return pd.concat([g, total.to_frame().T]).rename_axis("kind").reset_index()


# -- 2. the ideal under the engine's rules ---------------------------------------------------------
def reachable_hits(requests: Sequence[Request], engine: Engine) -> pd.DataFrame:
    """Per request, the prompt tokens ``engine`` with an unbounded cache could reuse, requests taken one by one.

    The engine's rules (``BlockManager.match_prefix``): only full blocks of its ``block_size`` tokens,
    within the first prompt_tokens - 1 tokens, matched as a chain from the start. Only earlier
    *prompts* count as seen (what the engine generated is not in the trace). Columns: request_id,
    prompt_tokens, hit_tokens.
    """
    block_size = engine.block_size
    children: dict[tuple[int, tuple[int, ...]], int] = {}
    rows = []
    for r in sorted(requests, key=lambda q: q.arrival_s):
        if r.prompt is None:
            raise ValueError(f"request {r.request_id} has no token ids; replay the trace with a vocab_size")
        node, hits = -1, 0
        for i in range((r.prompt_tokens - 1) // block_size):
            key = (node, tuple(r.prompt[i * block_size:(i + 1) * block_size]))
            hits += block_size if key in children else 0  # after a miss every key is new: the chain is broken
            node = children.setdefault(key, len(children))
        for i in range((r.prompt_tokens - 1) // block_size, r.prompt_tokens // block_size):  # the full last block
            children.setdefault((node, tuple(r.prompt[i * block_size:(i + 1) * block_size])), len(children))
        rows.append((r.request_id, r.prompt_tokens, hits))
    return pd.DataFrame(rows, columns=["request_id", "prompt_tokens", "hit_tokens"])


# -- 3 and 4. the engine -----------------------------------------------------------------------------
def trace_engine(kv_blocks: int | None = None, prefix_caching: bool = True, cost_model: CostModel | None = None,
                 scheduler: SchedulerConfig | None = None) -> Engine:
    """The simulator (``Engine(cost_model, spec)``) with ``kv_blocks`` blocks of KV and an unbounded queue.

    ``kv_blocks`` None: the default pool (max_seqs requests of max_model_len tokens).
    """
    cost_model = load_calibration("llama-30m") if cost_model is None else cost_model
    config = ModelConfig(**cost_model.config)
    spec = EngineSpec(block_size=cost_model.block_size, enable_prefix_caching=prefix_caching,
                      scheduler=scheduler or scheduler_config(max_waiting=None))
    return Engine(cost_model, spec if kv_blocks is None else spec.with_blocks(config, kv_blocks))


def engine_hits(engine: Engine, records: Sequence[RequestRecord]) -> pd.DataFrame:
    """Per request ``engine`` ran: prompt tokens, tokens found in the prefix cache at its first admission, and the
    same in blocks.

    Requests never admitted (failed on arrival) have NaN hits. Columns: request_id, status,
    prompt_tokens, hit_tokens, blocks (ceil(prompt / block_size)), hit_blocks.
    """
    block_size, rows = engine.block_size, []
    for r in records:
        admitted = r.admitted_s is not None
        hit = r.extra.get("cached_tokens", 0) if admitted else math.nan
        rows.append((r.request_id, r.status, r.prompt_tokens, hit, -(-r.prompt_tokens // block_size),
                     hit / block_size if admitted else math.nan))
    return pd.DataFrame(rows, columns=["request_id", "status", "prompt_tokens", "hit_tokens", "blocks", "hit_blocks"])


def replay_row(engine: Engine, records: list[RequestRecord], requests: list[Request], rate: float | None = None,
               slo: SLO | None = None) -> dict:
    """One row of a replay: ``level_row`` (the four clocks with n, throughput, failures, KV peaks) plus prefix reuse.

    Added: token_hit_ratio and block_hit_ratio (engine, at first admission, over admitted
    requests), prompt_tokens, hit_tokens, prefill_tokens_computed (every prompt token run through
    the model, recomputes after preemption included) and kv_blocks_in_use_after (0 after a clean run).
    """
    rate = trace_rate(requests) if rate is None else rate
    row = level_row(engine, records, requests, rate, slo)
    hits = engine_hits(engine, records).dropna(subset=["hit_tokens"])
    row.update(prefix_caching=engine.enable_prefix_caching, kv_blocks=engine.num_blocks,
               kv_tokens=engine.num_blocks * engine.block_size, block_size=engine.block_size,
               prompt_tokens=int(hits["prompt_tokens"].sum()), hit_tokens=int(hits["hit_tokens"].sum()),
               token_hit_ratio=hits["hit_tokens"].sum() / hits["prompt_tokens"].sum() if len(hits) else math.nan,
               block_hit_ratio=hits["hit_blocks"].sum() / hits["blocks"].sum() if len(hits) else math.nan,
               prefill_tokens_computed=sum(step.num_prefill_tokens for step in engine.trace),
               kv_blocks_in_use_after=engine.block_manager.stats().used)
    return row


def _frame_and_requests(frame: pd.DataFrame | None, engine: Engine) -> tuple[pd.DataFrame, list[Request]]:
    if frame is None:
        frame = mooncake_frame(MOONCAKE_SAMPLE_TRACE, length_scale=SAMPLE_LENGTH_SCALE,
                               max_context=engine.max_model_len)
    return frame, trace_requests(frame, vocab_size=engine.config.vocab_size)


def footprint_blocks(requests: Sequence[Request], engine: Engine) -> int:
    """``engine``'s KV blocks for every request's prompt and output together: a pool this large never evicts."""
    return int(sum(-(-(r.prompt_tokens + r.max_new_tokens) // engine.block_size) for r in requests))


def capacity_curve(frame: pd.DataFrame | None = None, kv_blocks: Sequence[int] | None = None, points: int = 8,
                   cost_model: CostModel | None = None, scheduler: SchedulerConfig | None = None,
                   progress: Progress = no_progress) -> pd.DataFrame:
    """The engine's prefix-cache hit ratio as a function of its KV capacity, next to the ideal ones.

    ``frame``: a ``mooncake_frame`` (default: the shipped sample, lengths / 16). ``kv_blocks``
    default: ``points`` capacities spaced evenly on a log scale from the smallest pool the engine
    accepts (one request of max_model_len) to the trace's footprint (every block of every request:
    a cache larger than the trace). One row per capacity (``replay_row`` columns), plus
    kv_share_of_footprint and the constant columns ideal_token_hit_ratio, ideal_block_hit_ratio
    (trace blocks) and reachable_token_hit_ratio (the engine's block size, unbounded cache).
    """
    probe = trace_engine(None, True, cost_model, scheduler)
    frame, requests = _frame_and_requests(frame, probe)
    footprint = footprint_blocks(requests, probe)
    if kv_blocks is None:
        smallest = -(-probe.max_model_len // probe.block_size)
        kv_blocks = sorted({int(round(x)) for x in np.geomspace(smallest, max(footprint, smallest), points)})
    ideal = ideal_hit_ratio(frame)
    reach = reachable_hits(requests, probe)
    rows = []
    for blocks in progress(list(kv_blocks), total=len(kv_blocks), desc="KV capacities", unit="run"):
        engine = trace_engine(blocks, True, cost_model, scheduler)
        records = engine.run(requests, clock="virtual")
        rows.append({**replay_row(engine, records, requests), "kv_share_of_footprint": blocks / footprint})
    out = pd.DataFrame(rows)
    out["ideal_token_hit_ratio"] = ideal["token_hit_ratio"]
    out["ideal_block_hit_ratio"] = ideal["block_hit_ratio"]
    out["reachable_token_hit_ratio"] = reach["hit_tokens"].sum() / reach["prompt_tokens"].sum()
    out.attrs.update(footprint_blocks=footprint, trace_block_tokens=ideal["block_tokens"], requests=len(requests))
    return out


def caching_on_off(frame: pd.DataFrame | None = None, rate: float | None = None, kv_blocks: int | None = None,
                   cost_model: CostModel | None = None, scheduler: SchedulerConfig | None = None,
                   slo: SLO | None = None) -> pd.DataFrame:
    """The same requests at the same offered load, prefix caching on and off: two ``replay_row`` rows.

    ``rate`` (requests/s) replays the trace faster or slower (``kvlab.workload.at_rate``); None: at
    its own pace. Read ttft_p50_s / ttft_p95_s / ttft_p99_s with ttft_n, prefill_tokens_computed
    against prompt_tokens, achieved_rps and achieved_output_tokens_per_s against sent_rps, and
    busy_s (seconds the engine computed): the work caching saved.
    """
    rows = []
    for on in (True, False):
        engine = trace_engine(kv_blocks, on, cost_model, scheduler)
        frame, requests = _frame_and_requests(frame, engine)
        if rate is not None:
            requests = at_rate(requests, rate)
        records = engine.run(requests, clock="virtual")
        rows.append(replay_row(engine, records, requests, slo=slo))
    out = pd.DataFrame(rows)
    first = ["prefix_caching", "sent_rps", "requests", "completed", "failed", "ttft_n", "ttft_p50_s", "ttft_p95_s",
             "ttft_p99_s", "prompt_tokens", "prefill_tokens_computed", "token_hit_ratio", "achieved_rps",
             "achieved_output_tokens_per_s", "busy_s", "makespan_s"]
    return out[first + [c for c in out if c not in first]]


# -- the shipped sample, replayed -----------------------------------------------------------------------
def sample_frame() -> pd.DataFrame:
    """The shipped Mooncake sample as replayed: lengths / 16, cut to the simulator's 1024-token context."""
    return mooncake_frame(MOONCAKE_SAMPLE_TRACE, length_scale=SAMPLE_LENGTH_SCALE, max_context=MAX_MODEL_LEN)


@experiment
def load_sample_trace() -> pd.DataFrame:
    """``sample_frame``, run as a notebook's experiment: the result notes the cell that loaded it, so a prediction
    of its hit ratio is checked to have been asked first (``guess.against(trace, ideal_hit_percent)``)."""
    return sample_frame()


@lru_cache(maxsize=2)
def _sample_curve(points: int) -> pd.DataFrame:
    return capacity_curve(sample_frame(), points=points)


def sample_curve(points: int = 8) -> pd.DataFrame:
    """``capacity_curve`` of the sample at its own pace: the same on every run, so computed once (a copy each call)."""
    return _sample_curve(points).copy()


# -- a service curve of a trace ------------------------------------------------------------------------
def trace_curve(path: str | Path, rates: Sequence[float] | None = None, trace_format: str | None = None,
                length_scale: float = 1.0, requests: int | None = None, engine: Engine | None = None,
                cost_model: CostModel | None = None, levels: int = 10, seed: int = 0,
                slo: SLO | None = DEFAULT_SLO, clock: str = "virtual",
                progress: Progress = no_progress) -> pd.DataFrame:
    """A trace replayed at rising rates: one ``replay_row`` per level, knee marked (``mark_knee``).

    Each level replays the same requests (the first ``requests`` of the trace, lengths divided by
    ``length_scale`` and cut to the engine's max_model_len) with arrival gaps scaled so they come
    at that level's rate: ``time_scale`` = the trace's own rate / the level's. ``rates`` None:
    ``levels`` rates from 0.1 to 1.5 x the capacity the cost model estimates for the prompt
    tokens an unbounded prefix cache would leave to compute (``reachable_hits``; all of them with
    caching off, or for an Azure trace). ``engine`` None: the simulator.
    """
    cost_model = load_calibration("llama-30m") if cost_model is None else cost_model
    engine = Engine(cost_model, LESSON_SPEC) if engine is None else engine
    trace_format = detect_format(path) if trace_format is None else trace_format
    base = replay_trace(path, trace_format=trace_format, length_scale=length_scale, max_requests=requests,
                        vocab_size=engine.config.vocab_size, max_context=engine.max_model_len, seed=seed)
    native = trace_rate(base)
    if rates is None:  # around the capacity the cost model estimates for the prompt tokens a prefix cache leaves
        left = base
        if engine.enable_prefix_caching and base[0].prompt is not None:
            hits = reachable_hits(base, engine).set_index("request_id")["hit_tokens"]
            left = [dataclasses.replace(r, prompt_tokens=r.prompt_tokens - int(hits[r.request_id]), prompt=None)
                    for r in base]
        rates = auto_rates(estimate_capacity_rps(cost_model, left, engine.scheduler_config.max_seqs), levels)
    workload = Workload(tuple(base), f"trace:{Path(path).name}", arrival="replay", seed=seed)
    frame = load_sweep(engine, workload, rates, slo=slo, clock=clock, row=replay_row,
                       progress=lambda it: progress(it, total=len(rates), desc=Path(path).name, unit="level"))
    frame.insert(5, "trace_format", trace_format)
    frame.insert(6, "length_scale", length_scale)
    frame.insert(7, "time_scale", native / frame["offered_rps"])
    frame.attrs.update(trace=str(path), trace_rps=native)
    return mark_knee(frame)


def clipped_requests(path: str | Path, trace_format: str | None, length_scale: float, max_context: int) -> int:
    """How many requests of the trace do not fit ``max_context`` after dividing their lengths by ``length_scale``."""
    t = read_any_trace(path, trace_format)
    prompt = np.ceil(t["prompt_tokens"] / length_scale)
    out = np.maximum(1, np.round(t["output_tokens"] / length_scale))
    return int((prompt + out > max_context).sum())


__all__ = ["SAMPLE_LENGTH_SCALE", "SHARED_MIN_REQUESTS", "caching_on_off", "capacity_curve", "clipped_requests",
           "engine_hits", "footprint_blocks", "hit_sources", "hit_sources_table", "ideal_hit_percent", "ideal_hit_ratio",
           "load_sample_trace", "prefix_sharing",
           "reachable_hits", "replay_row", "sample_curve", "sample_frame", "trace_curve", "trace_engine"]
