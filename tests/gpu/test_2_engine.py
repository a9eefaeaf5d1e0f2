"""The serving engine's paged executor on the device: every request's tokens equal ``generate``'s.

The engine on the real decoder (``ModelExecutor`` over a ``PagedKVCache``) against one-at-a-time ``generate``
with a dynamic cache, in five runs of the same requests: chunked prefill with prefix caching (a shared system
prompt), a KV budget small enough to force preemption by recompute, every decode attended on its own
(``DECODE_BATCH_MAX_SLOTS = 0``), static batching, and ``attention="in_place"`` (kvlab's CPU kernel; on CUDA the
gather path). On CUDA the pool's bytes against the allocator's.
"""
from __future__ import annotations

import time

import pytest
import torch

import kvlab
from kvlab.serving.config import EngineSpec

pytestmark = [pytest.mark.full, pytest.mark.gpu]


def cuda_mem(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def engine_runs(device: torch.device, quick: bool) -> list[dict]:
    """One row per run: requests equal to generate's, steps, preemptions, prefix hits, mixed steps, pool bytes."""
    import kvlab.cache.paged as paged
    from kvlab.serving import Engine, EngineSpec, SchedulerConfig
    from kvlab.workload import make_workload

    cfg = (kvlab.tiny_llama if quick else kvlab.llama_30m)(max_position_embeddings=512)
    model = kvlab.build_model(cfg, seed=0, device=device)
    n = 6 if quick else 12
    requests = make_workload("short_short", n, arrival="all_at_once", vocab_size=cfg.vocab_size, seed=3,
                             shared_prefix_tokens=32, max_context=256)
    reference = {r.request_id: kvlab.generate(model, r.prompt, cache="dynamic", max_new_tokens=r.max_new_tokens).tokens
                 for r in requests}
    per_block = EngineSpec(block_size=16).block_bytes(cfg)
    runs = {
        "chunked+prefix": dict(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=48, max_model_len=256)),
        "preemption": dict(scheduler=SchedulerConfig(max_seqs=8, max_batch_tokens=512, max_model_len=256),
                           kv_budget_bytes=(256 // 16 + 4) * per_block),
        "decode-one-by-one": dict(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=512, max_model_len=256),
                                  slots=0),
        "static-batching": dict(scheduler=SchedulerConfig(policy="static", max_seqs=4, max_batch_tokens=512,
                                                          max_model_len=256)),
        # kvlab serve's at-its-best attention: read in the pool on a CPU, the gather path on CUDA (a clean fallback)
        "attention-in-place": dict(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=512, max_model_len=256),
                                   attention="in_place"),
    }
    rows = []
    for label, opts in runs.items():
        opts = dict(opts)
        saved = paged.DECODE_BATCH_MAX_SLOTS
        if "slots" in opts:
            paged.DECODE_BATCH_MAX_SLOTS = opts.pop("slots")
        try:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            before = cuda_mem(device)
            engine = Engine(model, EngineSpec(block_size=16, **opts))
            pool = engine.executor.cache.memory().allocated_bytes
            after_build = cuda_mem(device)
            t0 = time.perf_counter()
            records = engine.run(requests, clock="wall")
            wall = time.perf_counter() - t0
        finally:
            paged.DECODE_BATCH_MAX_SLOTS = saved
        same = [engine.sequences[r.request_id].output_token_ids == reference[r.request_id] for r in requests]
        out_tokens = sum(len(engine.sequences[r.request_id].output_token_ids) for r in requests)
        stats = engine.stats()
        trace = engine.trace_frame()
        row = dict(run=label, requests=len(requests), completed=sum(r.status == "completed" for r in records),
                   tokens_equal_generate=all(same), requests_equal=sum(same), steps=stats["steps"],
                   preemptions=stats["preemptions"], prefix_hit_tokens=stats["prefix_hit_tokens"],
                   mixed_steps=int(((trace.num_prefill_seqs > 0) & (trace.num_decode_seqs > 0)).sum()),
                   wall_s=wall, output_tokens_per_s=out_tokens / wall, pool_bytes=pool,
                   in_place=engine.executor.cache.in_place)
        if device.type == "cuda":
            row["cuda_pool_bytes"] = after_build - before
            row["cuda_over_pool"] = (after_build - before) / pool
        rows.append(row)
        del engine
    del model
    return rows


@pytest.fixture(scope="module")
def runs(gpu, gpu_report) -> dict[str, dict]:
    rows = engine_runs(gpu.device, gpu.quick)
    gpu_report.keep("engine", rows)
    return {r["run"]: r for r in rows}


def test_every_request_of_every_run_matches_generate(runs, record):
    for r in runs.values():
        record(f"engine {r['run']}: every request's tokens == generate", r["tokens_equal_generate"],
               f"{r['requests']} requests", f"{r['requests_equal']} equal, {r['output_tokens_per_s']:.0f} tok/s, "
               f"{r['steps']} steps, {r['preemptions']} preemptions, {r['prefix_hit_tokens']} prefix-hit tokens")
    record.verdict()


def test_cuda_allocated_is_the_pool(runs, gpu, record):
    for r in runs.values():
        if "cuda_over_pool" in r:
            record(f"engine {r['run']}: cuda allocated within 10% of the pool", abs(r["cuda_over_pool"] - 1) <= 0.10,
                   f"{r['pool_bytes']} B +-10%", f"{r['cuda_pool_bytes']} B ({r['cuda_over_pool']:.3f}x)")
        else:
            record(f"engine {r['run']}: cuda allocated within 10% of the pool", None, f"{r['pool_bytes']} B +-10%",
                   f"not applicable on {gpu.device.type}: no CUDA allocator")
    record.verdict()


def test_in_place_attention_reads_the_pool_on_a_cpu_and_falls_back_to_gather_elsewhere(runs, gpu, record):
    """``EngineSpec(attention="in_place")``: kvlab's CPU kernel where the pool is float32 on the CPU; on CUDA the
    gather path, with the same tokens as generate's (the first test checks them)."""
    r = runs["attention-in-place"]
    expected = gpu.device.type == "cpu"
    record("engine attention-in-place: the kernel only where it reads the pool", r["in_place"] == expected,
           f"in_place={expected} on {gpu.device.type}", f"in_place={r['in_place']}")
    record.verdict()


def test_the_runs_exercised_preemption_prefix_caching_and_mixed_steps(runs, record):
    record("engine exercised preemption", runs["preemption"]["preemptions"] > 0, "> 0 preemptions",
           runs["preemption"]["preemptions"])
    record("engine exercised prefix caching", runs["chunked+prefix"]["prefix_hit_tokens"] > 0,
           "> 0 prefix-hit tokens", runs["chunked+prefix"]["prefix_hit_tokens"])
    record("engine exercised mixed prefill + decode steps", runs["chunked+prefix"]["mixed_steps"] > 0,
           "> 0 mixed steps", runs["chunked+prefix"]["mixed_steps"])
    record.verdict()
