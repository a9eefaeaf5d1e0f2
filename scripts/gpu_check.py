"""One short device check of every CUDA branch of kvlab, and of the lessons' experiments on the device.

Prepared for one run on a lent GPU (about eight minutes of wall time; ``--budget-s`` bounds the
optional parts), and runnable on CPU end to end:

    python scripts/gpu_check.py                      # cuda if present, else cpu
    python scripts/gpu_check.py --device cpu --quick # small settings, to check the script itself

What it runs, in order (each section timed; an error in one is recorded and the rest go on):

1. caches: for every cache mode (none, dynamic, static, quantized 8/4/2, offloaded with the side-stream
   prefetch and without) ``kvlab.generate`` on a random-weight Llama (llama_30m, and on CUDA a
   hidden-2048 / 16-layer config so transfers matter): ms per token, tokens equal to dynamic's,
   bytes moved per step and the achieved transfer rate, and the cache's own device_bytes beside
   what ``torch.cuda.memory_allocated`` reports. The offloaded tier is read off its tensor
   (``is_pinned()``, its storage's bytes) against what the cache reports (``pinned_tier_verdict``).
   Quantized caches of llama_30m's shape filled with 1024 tokens: bytes vs dynamic's and vs the ideal ratio.
2. engine: the serving engine's paged executor (``ModelExecutor`` over ``PagedKVCache``) with chunked
   prefill, prefix caching, preemption by recompute and both decode paths (batched gather and one
   sequence at a time): every request's tokens equal ``generate``'s, the pool's bytes vs CUDA's.
3. checkpoints: tiny GPT-2, Llama and Qwen2 checkpoints with their tokenizers, saved here and loaded
   with ``kvlab.from_pretrained`` on the device: logits vs transformers' and greedy tokens; the
   real-model demonstration (``kvlab.lessons.l02_kv_cache.real_model``) on the Llama one.
4. half precision: bf16 and fp16 where the device computes them. ``build_model(..., dtype=...)``:
   greedy tokens of every cache mode (exact caches equal the same dtype's dynamic cache; agreement
   with fp32), teacher-forced logits vs fp32, the dynamic cache's bytes (half of fp32's).
   ``from_pretrained(..., dtype=...)`` on the tiny checkpoints vs transformers in the same dtype.
5. compiled step: ``kvlab.lessons.l03_cache_strategies.static_compile`` (torch.compile of the fixed-shape static
   decode step) in a child process bounded in time, and on CUDA again with
   ``mode="reduce-overhead"``, whose step must be recorded as a CUDA graph (``cuda_graph``).
6. HTTP: ``python -m kvlab serve --device <device>`` on 127.0.0.1, a few requests from kvlab's own
   load client (``kvlab.http.loadgen``): every request completes with its tokens, and a greedy
   completion equals ``generate``'s on the same device.
7. benchmarks: ``python -m kvlab bench decode --json`` at small settings on the device (every
   row ran, exact caches agree), and ``batch_scaling`` (notebook 05's experiment): per-sequence
   decode time falls with the batch, a batched prefill beats one-by-one.
8. lessons: the notebooks' start-up check (``kvlab.serving.device_check``: the device against the CPU),
   then, with KVLAB_DEVICE set to the device, the lessons' experiments at their device defaults
   (``kvlab.model.lessons.lesson_scale``): the slowdown (01), cache memory (02), strategies (03), a journey
   (04), batching policies (05), prefix caching and chunked prefill (08); then every notebook claim on
   its example (``kvlab.claims``), with its verdict, as long as the budget lasts.
9. pytest: the cache, generate, engine, checkpoint (tiny, real-model, recall) and lesson-scale tests
   with KVLAB_TEST_DEVICE and KVLAB_DEVICE set, so the shared fixtures (tests/conftest.py ``device``)
   put their models on the device (skip with --no-pytest).

Every check is PASS, FAIL or SKIP (not applicable here, or out of time) with what was expected and
what was measured. Results go to test-artifacts/gpu_check.json (or ``--json``) and, if $OUT is set,
to $OUT/gpu_check.json as well, with versions, device and settings; gpu_check.md beside each is the
short summary a person reads. Exit status 0 when no check failed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the checkout's kvlab, installed or not

import kvlab  # noqa: E402
from kvlab.cache import make_cache  # noqa: E402
from kvlab.results_io import write_json  # noqa: E402

# mode name -> (cache strategy, options)
MODES: dict[str, tuple[str, dict]] = {
    "none": ("none", {}),
    "dynamic": ("dynamic", {}),
    "static": ("static", {}),
    "quantized-8": ("quantized", dict(bits=8, residual=64)),
    "quantized-4": ("quantized", dict(bits=4, residual=64)),
    "quantized-2": ("quantized", dict(bits=2, residual=64)),
    "offloaded-prefetch": ("offloaded", dict(prefetch=True)),
    "offloaded-sync": ("offloaded", dict(prefetch=False)),
}


# --- checks: what was expected, what was measured, and the verdict --------------------------------

@dataclass
class Check:
    """One line of the report: PASS, FAIL or SKIP (not applicable here, or out of time), with the numbers."""

    name: str
    status: str  # "PASS" | "FAIL" | "SKIP"
    expected: str = ""
    measured: str = ""


def make_check(name: str, ok: bool | None, expected: str = "", measured: str = "") -> Check:
    """``ok`` True -> PASS, False -> FAIL, None -> SKIP (then ``measured`` says why)."""
    return Check(name, "SKIP" if ok is None else "PASS" if ok else "FAIL", str(expected), str(measured))


def summarize_checks(checks: list[Check]) -> dict:
    """Counts per status; ``ok`` when nothing failed and something passed (an empty run proves nothing)."""
    counts = {status: sum(c.status == status for c in checks) for status in ("PASS", "FAIL", "SKIP")}
    return dict(passed=counts["PASS"], failed=counts["FAIL"], skipped=counts["SKIP"], total=len(checks),
                ok=counts["FAIL"] == 0 and counts["PASS"] > 0,
                failed_names=[c.name for c in checks if c.status == "FAIL"])


def tier_facts(tier) -> dict:
    """What the offloaded tier is, read off the tensor itself: pinned or not, and the bytes its storage holds."""
    return dict(pinned=bool(tier.is_pinned()), storage_bytes=int(tier.untyped_storage().nbytes()),
                device=str(tier.device))


def pinned_tier_verdict(facts: dict, offloaded_bytes: int, expect_pinned: bool) -> tuple[bool, str, str]:
    """Does the offloaded tier hold what the cache reports? -> (ok, expected, measured).

    The tier (``tier_facts``) must be pinned exactly when the cache runs on CUDA (page-locked host
    memory the GPU copies from without staging), live on the host, and its storage must hold exactly
    the ``offloaded_bytes`` the cache reports. The pinned host allocator's counter
    (``torch.cuda.host_memory_stats()["active_bytes.current"]``) cannot decide this: a freed pinned
    block waits on the allocator's event list and is subtracted only at the next pinned allocation,
    so the next cache reuses that block and shows 0 extra pinned bytes, and the fastest repeat,
    usually that one, is the one kept.
    """
    ok = (facts["pinned"] == expect_pinned and facts["storage_bytes"] == offloaded_bytes
          and str(facts.get("device", "cpu")).startswith("cpu"))
    expected = f"{'pinned' if expect_pinned else 'not pinned'} host tensor of {offloaded_bytes} B"
    measured = (f"{'pinned' if facts['pinned'] else 'not pinned'} {facts.get('device', 'cpu')} tensor of "
                f"{facts['storage_bytes']} B")
    return ok, expected, measured


def markdown_summary(report: dict, checks: list[Check]) -> str:
    """The short human-readable report: where it ran, each check with expected and measured side by side."""
    env, settings, summary = report.get("env", {}), report.get("settings", {}), summarize_checks(checks)
    verdict = "PASS" if summary["ok"] else "FAIL"
    cell = lambda text: str(text).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines = [f"# gpu_check: {verdict}", "",
             f"{summary['passed']} passed, {summary['failed']} failed, {summary['skipped']} skipped of "
             f"{summary['total']} checks in {report.get('seconds', float('nan')):.0f} s on "
             f"{settings.get('device', '?')} ({env.get('device_name', '?')}); torch {env.get('torch', '?')}, "
             f"CUDA {env.get('cuda')}, kvlab {env.get('kvlab', '?')}; quick={settings.get('quick')}, "
             f"budget {settings.get('budget_s', float('nan')):.0f} s.", ""]
    seconds = report.get("section_seconds", {})
    if seconds:
        lines += ["Sections (s): " + ", ".join(f"{name} {s:.0f}" for name, s in seconds.items()), ""]
    lines += ["| status | check | expected | measured |", "|---|---|---|---|"]
    order = {"FAIL": 0, "SKIP": 1, "PASS": 2}
    for c in sorted(checks, key=lambda c: order[c.status]):  # failures first, otherwise in run order
        lines.append(f"| {c.status} | {cell(c.name)} | {cell(c.expected)} | {cell(c.measured)} |")
    return "\n".join(lines) + "\n"


def output_paths(json_arg: str | None, out_env: str | None) -> list[Path]:
    """Where the JSON goes: ``--json`` (a file, or a folder for gpu_check.json) or test-artifacts/, and $OUT too."""
    main = Path(json_arg) if json_arg else ROOT / "test-artifacts"
    paths = [main if main.suffix == ".json" else main / "gpu_check.json"]
    if out_env:
        extra = Path(out_env) / "gpu_check.json"
        if extra.resolve() != paths[0].resolve():
            paths.append(extra)
    return paths


# --- 1. caches ------------------------------------------------------------------------------------

def big_config() -> kvlab.ModelConfig:
    """~0.8B-parameter Llama shape: hidden 2048, 16 layers; 256 KB of K/V per token in fp32."""
    return kvlab.llama_30m(hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=16,
                           intermediate_size=5504, max_position_embeddings=4096, name="llama-0.8b-shape")


def cuda_mem(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def pinned_host_bytes(device: torch.device) -> int | None:
    """Bytes held by CUDA's pinned host allocator, if torch reports it: recorded, not checked (a freed pinned
    block is subtracted only at the next pinned allocation; see ``pinned_tier_verdict``)."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.host_memory_stats()["active_bytes.current"])  # rounded up to powers of two
    except Exception:  # older torch: no host allocator statistics
        return None


def run_mode(model, prompt: list[int], new_tokens: int, mode: str, device: torch.device) -> dict:
    """One generate with a cache built here, so CUDA's allocator can be read before and after."""
    strategy, options = MODES[mode]
    options = dict(options)
    if strategy in ("static", "offloaded"):
        options["max_len"] = len(prompt) + new_tokens
    if device.type == "cuda":
        torch.cuda.empty_cache()
    before, pinned_before = cuda_mem(device), pinned_host_bytes(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    cache = make_cache(strategy, model.config, dtype=model.dtype, device=device, **options)
    after_build = cuda_mem(device)
    result = kvlab.generate(model, prompt, cache=cache, max_new_tokens=new_tokens)
    tl, mem = result.timeline, cache.memory()
    decode = tl.step_s[1:]
    moved = tl.bytes_moved[1:]
    row = dict(mode=mode, strategy=strategy, options=options, tokens=result.tokens,
               prefill_ms=1e3 * tl.prefill_s, ms_per_token=1e3 * statistics.mean(decode),
               ms_per_token_p50=1e3 * statistics.median(decode), tokens_per_s=result.tokens_per_s,
               memory=mem.to_dict())
    if hasattr(cache, "memory_breakdown"):
        row["breakdown"] = cache.memory_breakdown()
    if strategy == "offloaded":
        row["bytes_moved_last_step"] = tl.bytes_moved[-1]
        row["moved_GB_per_decode_s"] = sum(moved) / sum(decode) / 1e9  # bytes over the tier link / decode time
        row["prefetch_active"] = cache.prefetch
        row["tier"] = tier_facts(cache.tier)  # read while the cache is open: pinned or not, storage bytes
    if device.type == "cuda":
        end = cuda_mem(device)
        row["cuda"] = dict(allocated_after_build=after_build - before, allocated_after_generate=end - before,
                           peak_extra=torch.cuda.max_memory_allocated(device) - before,
                           cache_device_bytes=mem.device_bytes,
                           ratio_to_cache=(end - before) / mem.device_bytes if mem.device_bytes else None)
        pinned_after = pinned_host_bytes(device)
        if pinned_after is not None and pinned_before is not None:
            row["cuda"]["pinned_host_extra"] = pinned_after - pinned_before  # information only
    if hasattr(cache, "close"):
        cache.close()
    return row


def bench_model(config, prompt_len: int, new_tokens: int, modes: list[str], device: torch.device,
                repeats: int) -> dict:
    model = kvlab.build_model(config, seed=0, device=device)
    prompt = torch.randint(0, config.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    kvlab.generate(model, prompt[:32], cache="dynamic", max_new_tokens=4)  # warm-up: kernels, allocator
    rows = []
    for mode in modes:
        runs = [run_mode(model, prompt, new_tokens, mode, device) for _ in range(repeats)]
        rows.append(min(runs, key=lambda r: r["ms_per_token"]))  # best of the repeats
    ref = next(r for r in rows if r["mode"] == "dynamic")
    for r in rows:
        same = sum(a == b for a, b in zip(r["tokens"], ref["tokens"]))
        r["tokens_equal_dynamic"] = r["tokens"] == ref["tokens"]
        r["agreement_with_dynamic"] = same / len(ref["tokens"])
        r["latency_x_dynamic"] = r["ms_per_token"] / ref["ms_per_token"]
        r["bytes_x_dynamic"] = r["memory"]["allocated_bytes"] / ref["memory"]["allocated_bytes"]
    out = dict(model=config.to_dict(), weight_bytes=model.weight_bytes(), prompt_len=prompt_len,
               new_tokens=new_tokens, repeats=repeats, rows=rows)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def quantized_memory_ratios(device: torch.device, tokens: int = 1024) -> list[dict]:
    """llama_30m-shaped caches filled with ``tokens`` random tokens: quantized bytes / dynamic bytes."""
    cfg = kvlab.llama_30m()
    k = torch.randn(1, cfg.num_kv_heads, tokens, cfg.head_dim, device=device)
    dyn = make_cache("dynamic", cfg, device=device)
    for layer in range(cfg.num_layers):
        dyn.update(layer, k, k)
    base = dyn.memory().allocated_bytes
    rows = []
    for bits in (8, 4, 2):
        for group, residual in ((32, 0), (32, 64), (64, 0)):
            q = make_cache("quantized", cfg, device=device, bits=bits, group_size=group, residual=residual)
            for layer in range(cfg.num_layers):
                q.update(layer, k, k)
            quantized_share = (tokens - residual) / tokens
            ideal = quantized_share * (bits / 32 + 2 * 4 / (group * 4)) + residual / tokens  # fp32 scale+zero
            got = q.memory().allocated_bytes / base
            rows.append(dict(bits=bits, group_size=group, residual=residual, tokens=tokens, ratio=got,
                             ideal_ratio=ideal, bits_over_32=bits / 32, within_10pct=abs(got / ideal - 1) <= 0.10))
    return rows


def link_bandwidth(device: torch.device, nbytes: int = 256 * 2**20) -> dict:
    """Copy rate of the offloaded tier's link, timed alone: pinned host <-> GPU, or mmap'd file <-> RAM on CPU."""
    n = nbytes // 4
    if device.type == "cuda":
        host, dev = torch.empty(n, pin_memory=True), torch.empty(n, device=device)
        pairs = dict(read_GBps=(dev, host), write_GBps=(host, dev))
    else:
        import tempfile
        folder = tempfile.mkdtemp(prefix="kvlab-bw-")
        host = torch.from_file(os.path.join(folder, "bw.bin"), shared=True, size=n, dtype=torch.float32)
        pairs = dict(read_GBps=(torch.empty(n), host), write_GBps=(host, torch.ones(n)))
    out = {}
    for name, (dst, src) in pairs.items():
        dst.copy_(src)  # first touch: page faults, lazy mapping
        kvlab.device.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(3):
            dst.copy_(src, non_blocking=False)
        kvlab.device.synchronize(device)
        out[name] = 3 * nbytes / (time.perf_counter() - t0) / 1e9
    if device.type != "cuda":
        import shutil
        del host, pairs
        shutil.rmtree(folder, ignore_errors=True)
    return dict(bytes=nbytes, **out)


# --- 2. the engine's paged executor --------------------------------------------------------------

def engine_check(device: torch.device, quick: bool) -> list[dict]:
    """The engine on the real decoder (ModelExecutor over a PagedKVCache) against one-at-a-time ``generate``.

    Four runs of the same requests: chunked prefill with prefix caching (a shared system prompt),
    a KV budget small enough to force preemption by recompute, every decode attended on its own
    (``DECODE_BATCH_MAX_SLOTS = 0``), and static batching. Each request's tokens must equal
    ``generate``'s with a dynamic cache.
    """
    import kvlab.cache.paged as paged
    from kvlab.serving import Engine, SchedulerConfig, bytes_per_block
    from kvlab.workload import make_workload

    cfg = (kvlab.tiny_llama if quick else kvlab.llama_30m)(max_position_embeddings=512)
    model = kvlab.build_model(cfg, seed=0, device=device)
    n = 6 if quick else 12
    requests = make_workload("short_short", n, arrival="all_at_once", vocab_size=cfg.vocab_size, seed=3,
                             shared_prefix_tokens=32, max_context=256)
    reference = {r.request_id: kvlab.generate(model, r.prompt, cache="dynamic", max_new_tokens=r.max_new_tokens).tokens
                 for r in requests}
    per_block = bytes_per_block(cfg, 16)
    runs = {
        "chunked+prefix": dict(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=48, max_model_len=256)),
        "preemption": dict(scheduler=SchedulerConfig(max_seqs=8, max_batch_tokens=512, max_model_len=256),
                           kv_budget_bytes=(256 // 16 + 4) * per_block),
        "decode-one-by-one": dict(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=512, max_model_len=256),
                                  slots=0),
        "static-batching": dict(scheduler=SchedulerConfig(policy="static", max_seqs=4, max_batch_tokens=512,
                                                          max_model_len=256)),
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
            engine = Engine(model, block_size=16, **opts)
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
                   wall_s=wall, output_tokens_per_s=out_tokens / wall, pool_bytes=pool)
        if device.type == "cuda":
            row["cuda_pool_bytes"] = after_build - before
            row["cuda_over_pool"] = (after_build - before) / pool
        rows.append(row)
        del engine
    del model
    return rows


# --- 3. checkpoints with their tokenizers ----------------------------------------------------------

def checkpoint_check(device: torch.device, quick: bool) -> dict:
    """Tiny saved checkpoints of each family loaded on ``device``: logits and greedy tokens vs transformers (CPU)."""
    import transformers

    from kvlab.lessons.l02_kv_cache.real_model import real_model_demo, try_real_model
    from kvlab.model.tiny_checkpoint import FAMILIES, save_tiny_checkpoint

    transformers.utils.logging.disable_progress_bar()  # one bar per save and load otherwise
    rows, demo = [], None
    with tempfile.TemporaryDirectory(prefix="kvlab-ckpt-") as tmp:
        for family in FAMILIES:
            folder = save_tiny_checkpoint(Path(tmp) / family, family)
            hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                                   dtype=torch.float32).eval()
            tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
            model = kvlab.from_pretrained(folder, device=device)
            prompt = "The memory of a long context grows with layers, heads and tokens."
            ids = torch.tensor([tok.encode(prompt, add_special_tokens=False)])  # (1, T)
            with torch.inference_mode():
                expected = hf(ids).logits
                got = model(ids.to(device), kvlab.make_cache("dynamic", model.config, device=device)).cpu()
                ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
                                  do_sample=False, pad_token_id=tok.eos_token_id)[0, ids.size(1):].tolist()
            out = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=24)
            rows.append(dict(family=family, device=str(model.device), tokenizer=repr(model.tokenizer),
                             max_abs_logit_diff=(got - expected).abs().max().item(),
                             greedy_equal=out.tokens == ref,
                             agreement=sum(a == b for a, b in zip(out.tokens, ref)) / len(ref),
                             text_roundtrip=model.tokenizer.decode(model.tokenizer.encode(prompt)) == prompt))
            if family == "llama":
                real, note = try_real_model(folder, device=device)
                d = real_model_demo(real, new_tokens=16 if quick else 32, slowdown_prompt_tokens=32,
                                    slowdown_tokens=16 if quick else 32)
                demo = dict(note=note, **{k: v.to_dict(orient="records") for k, v in d.tables().items()})
    return dict(rows=rows, real_model_demo=demo)


# --- 4. half precision -----------------------------------------------------------------------------

HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
EXACT_MODES = ("none", "static", "offloaded-prefetch", "offloaded-sync")  # same tokens as dynamic, in any dtype


def dtype_support(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when ``device`` computes in ``dtype`` (a matrix product, softmax and layer norm run), else why not."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16 arithmetic (torch.cuda.is_bf16_supported() is False)"
    try:
        x = torch.randn(4, 8, device=device).to(dtype)
        torch.nn.functional.layer_norm((x @ x.T).softmax(-1), (4,))
        kvlab.device.synchronize(device)
    except Exception as exc:  # e.g. an old CPU build without half kernels
        return f"{type(exc).__name__}: {exc}"
    return None


def _cache_for(mode: str, config, dtype: torch.dtype, device: torch.device, max_len: int):
    strategy, options = MODES[mode]
    options = dict(options, **({"max_len": max_len} if strategy in ("static", "offloaded") else {}))
    return make_cache(strategy, config, dtype=dtype, device=device, **options)


@torch.inference_mode()
def half_precision_check(device: torch.device, quick: bool) -> dict:
    """bf16 and fp16 against fp32 on the same seeded weights: ``build_model(..., dtype=...)`` through every
    cache mode, and ``from_pretrained(..., dtype=...)`` on the tiny checkpoints against transformers."""
    import transformers

    from kvlab.model.tiny_checkpoint import FAMILIES, save_tiny_checkpoint

    cfg = kvlab.tiny_llama() if quick else kvlab.llama_30m()
    prompt_len, new = (32, 16) if quick else (128, 32)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    f32 = kvlab.build_model(cfg, seed=0, device=device)
    ref = kvlab.generate(f32, prompt, cache="dynamic", max_new_tokens=new)
    ids = torch.tensor([prompt + ref.tokens[:-1]], device=device)  # (1, T): the fp32 greedy path, teacher-forced
    f32_cache = make_cache("dynamic", cfg, device=device)
    lf = f32(ids, f32_cache).float()  # (1, T, V)
    out: dict = dict(model=cfg.name, prompt_len=prompt_len, new_tokens=new, fp32_tokens=ref.tokens,
                     fp32_cache_bytes=f32_cache.memory().allocated_bytes, dtypes={}, checkpoints=[])
    del f32
    supported = {}
    for name, dt in HALF_DTYPES.items():
        why = dtype_support(device, dt)
        if why is not None:
            out["dtypes"][name] = dict(supported=False, reason=why)
            continue
        supported[name] = dt
        h = kvlab.build_model(cfg, seed=0, device=device, dtype=dt)
        cache = make_cache("dynamic", cfg, dtype=dt, device=device)
        lh = h(ids, cache).float()  # (1, T, V)
        scale = lf.abs().max().item()
        row = dict(supported=True, model_dtype=str(h.dtype), top1_vs_fp32=(lh.argmax(-1) == lf.argmax(-1)).float()
                   .mean().item(), max_abs_logit_diff=(lh - lf).abs().max().item(), max_abs_logit=scale,
                   tolerance=4 * torch.finfo(dt).eps * scale,  # 8 units of roundoff of the logits' scale
                   cache_bytes=cache.memory().allocated_bytes, modes={})
        for mode in MODES:
            try:
                c = _cache_for(mode, cfg, dt, device, prompt_len + new)
                tokens = kvlab.generate(h, prompt, cache=c, max_new_tokens=new).tokens
                if hasattr(c, "close"):
                    c.close()
                row["modes"][mode] = dict(tokens=tokens[:16], agreement_with_fp32=sum(
                    a == b for a, b in zip(tokens, ref.tokens)) / new, _tokens=tokens)
            except Exception as exc:  # one mode failing in half precision is a finding; the rest still run
                row["modes"][mode] = dict(error=f"{type(exc).__name__}: {exc}")
        dyn = row["modes"].get("dynamic", {}).get("_tokens")
        for m in row["modes"].values():
            if "_tokens" in m:
                m["equal_half_dynamic"] = m.pop("_tokens") == dyn
        out["dtypes"][name] = row
        del h
    transformers.utils.logging.disable_progress_bar()
    text = "The memory of a long context grows with layers, heads and tokens."
    with tempfile.TemporaryDirectory(prefix="kvlab-half-") as tmp:
        for family in FAMILIES:
            folder = save_tiny_checkpoint(Path(tmp) / family, family)
            tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
            ids = torch.tensor([tok.encode(text, add_special_tokens=False)])  # (1, T), on the CPU
            hf32 = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                                     dtype=torch.float32).eval()
            exact = hf32(ids).logits  # (1, T, V): the fp32 reference, on the CPU
            for name, dt in supported.items():
                try:
                    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                                           dtype=dt).to(device).eval()
                    theirs = hf(ids.to(device)).logits.float().cpu()
                    model = kvlab.from_pretrained(folder, device=device, dtype=dt)
                    ours = model(ids.to(device), make_cache("dynamic", model.config, dtype=dt, device=device))
                    ours = ours.float().cpu()
                    out["checkpoints"].append(dict(
                        family=family, dtype=name, model_dtype=str(model.dtype), device=str(model.device),
                        kvlab_vs_fp32=(ours - exact).abs().max().item(),
                        transformers_vs_fp32=(theirs - exact).abs().max().item(),
                        kvlab_vs_transformers=(ours - theirs).abs().max().item(),
                        top1_vs_transformers=(ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()))
                except Exception as exc:
                    out["checkpoints"].append(dict(family=family, dtype=name, error=f"{type(exc).__name__}: {exc}"))
    return out


def half_precision_checks(half: dict) -> list[Check]:
    """Exact caches equal the same dtype's dynamic cache; logits near fp32's; the cache half the bytes;
    a loaded checkpoint in half precision no further from fp32 than transformers' own (within 2x)."""
    checks = []
    for name, row in half["dtypes"].items():
        if not row["supported"]:
            checks.append(make_check(f"{name}: build_model and every cache", None, "runs where supported",
                                     f"not supported here: {row['reason']}"))
            continue
        failed = {m: r["error"] for m, r in row["modes"].items() if "error" in r}
        checks.append(make_check(f"{name} {half['model']}: every cache mode generates", not failed,
                                 f"{len(MODES)} modes", f"{len(MODES) - len(failed)} ran"
                                 + (f"; {failed}" if failed else "")))
        exact = {m: row["modes"][m].get("equal_half_dynamic") for m in EXACT_MODES if m in row["modes"]}
        checks.append(make_check(f"{name} {half['model']}: exact caches' tokens == {name} dynamic's",
                                 all(exact.values()), "all True", exact))
        agreement = {m: round(r["agreement_with_fp32"], 2) for m, r in row["modes"].items() if "error" not in r}
        checks.append(make_check(f"{name} {half['model']}: teacher-forced top-1 == fp32's", row["top1_vs_fp32"] >= 0.9,
                                 ">= 0.90", f"{row['top1_vs_fp32']:.3f} (greedy agreement with fp32 per mode: "
                                 f"{agreement})"))
        checks.append(make_check(f"{name} {half['model']}: max |logit - fp32 logit|",
                                 row["max_abs_logit_diff"] <= row["tolerance"],
                                 f"<= {row['tolerance']:.2e} (4 eps x max |logit| {row['max_abs_logit']:.2f})",
                                 f"{row['max_abs_logit_diff']:.2e}"))
        checks.append(make_check(f"{name}: dynamic cache bytes == fp32's / 2", 2 * row["cache_bytes"]
                                 == half["fp32_cache_bytes"], f"{half['fp32_cache_bytes'] // 2} B",
                                 f"{row['cache_bytes']} B"))
    for r in half["checkpoints"]:
        label = f"{r['dtype']} checkpoint {r['family']}"
        if "error" in r:
            checks.append(make_check(f"{label}: from_pretrained(dtype=...) vs transformers", False, "runs", r["error"]))
            continue
        checks.append(make_check(f"{label}: kvlab's |logit - fp32| <= 2 x transformers' in {r['dtype']}",
                                 r["kvlab_vs_fp32"] <= 2 * r["transformers_vs_fp32"] and
                                 r["model_dtype"] == f"torch.{r['dtype']}",
                                 f"<= {2 * r['transformers_vs_fp32']:.2e}, weights torch.{r['dtype']}",
                                 f"{r['kvlab_vs_fp32']:.2e} ({r['model_dtype']}; vs transformers "
                                 f"{r['kvlab_vs_transformers']:.2e}, top-1 {r['top1_vs_transformers']:.2f})"))
    return checks


# --- 5. the compiled decode step ---------------------------------------------------------------------

def compile_in_child(mode: str | None, budget_s: float, pairs: int, new_tokens: int) -> dict:
    """``compiled_decode`` on the shipped recall model in a child process stopped after ``budget_s``.

    ``mode=None`` is ``try_compiled_decode`` itself (the notebook's call); another mode runs the same module's
    command line with ``--mode``. The child runs on $KVLAB_DEVICE. Never raises: the answer has a ``status``
    ("compiled", "timeout" or "failed") and a one-line ``message``.
    """
    from kvlab.lessons.l03_cache_strategies.static_compile import try_compiled_decode

    if mode is None:
        return try_compiled_decode(budget_s=budget_s, pairs=pairs, new_tokens=new_tokens)
    cmd = [sys.executable, "-m", "kvlab.lessons.l03_cache_strategies.static_compile", "--pairs", str(pairs), "--new",
           str(new_tokens), "--threads", "1", "--mode", mode]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=budget_s,
                              env=dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1"))
    except subprocess.TimeoutExpired:
        return dict(status="timeout", seconds=time.perf_counter() - start,
                    message=f"torch.compile(mode={mode!r}) did not finish within {budget_s:.0f} s; skipped")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = next((line for line in reversed(proc.stderr.strip().splitlines()) if line.strip()), "no message")
        return dict(status="failed", seconds=time.perf_counter() - start,
                    message=f"torch.compile(mode={mode!r}) failed: {last.strip()[:300]}")
    return dict(json.loads(lines[-1]), seconds=time.perf_counter() - start)


def compiled_step_check(device: torch.device, quick: bool, budget_s: float) -> dict:
    """The compiled fixed-shape static step, default mode; on CUDA also reduce-overhead (CUDA graphs)."""
    pairs, new = (4, 16) if quick else (8, 32)
    keep = ("status", "message", "same_tokens", "device", "compile_s", "eager_ms", "compiled_ms", "speedup",
            "speedup_min", "speedup_max", "backend", "seconds")
    out = {}
    for label, mode in (("default", None), ("reduce-overhead", "reduce-overhead")):
        if mode == "reduce-overhead" and device.type != "cuda":
            out[label] = dict(status="not applicable", message=f"CUDA graphs need CUDA; this run is on {device}")
            continue
        r = compile_in_child(mode, budget_s, pairs, new)
        out[label] = dict({k: r[k] for k in keep if k in r}, mode=mode, cuda_graph=r.get("cuda_graph"))
        print(f"  {label}: {r.get('message')}")
    return out


def compiled_step_checks(compiled: dict, device: torch.device) -> list[Check]:
    checks = []
    for label, r in compiled.items():
        name = f"compiled step ({label})"
        if r["status"] in ("not applicable", "timeout"):
            checks.append(make_check(f"{name}: tokens == dynamic's", None, "compiled, same tokens",
                                     f"{r['status']}: {r['message']}"))
            continue
        if r["status"] != "compiled":
            checks.append(make_check(f"{name}: tokens == dynamic's", False, "compiled, same tokens", r["message"]))
            continue
        on = str(r.get("device", "?"))
        checks.append(make_check(f"{name}: tokens == dynamic's on {device.type}",
                                 r.get("same_tokens") is True and on.startswith(device.type),
                                 f"same tokens, on {device.type}",
                                 f"same_tokens={r.get('same_tokens')} on {on}; compile {r.get('compile_s', 0):.1f} s, "
                                 f"eager/compiled {r.get('speedup', float('nan')):.2f}x, "
                                 f"cuda_graph={r['cuda_graph']!r}"))
        if label == "reduce-overhead":
            graph = r["cuda_graph"]
            checks.append(make_check(f"{name}: the step replays a CUDA graph", None if graph is None else
                                     graph == "captured", "cuda_graph == 'captured'",
                                     "compiled_decode reports no cuda_graph field" if graph is None else repr(graph)))
    return checks


# --- 6. serving over HTTP ------------------------------------------------------------------------------

def http_check(device: torch.device, quick: bool) -> dict:
    """``python -m kvlab serve --device <device>`` on loopback, driven by kvlab's load client; one greedy
    completion compared with ``generate`` on the same model and device."""
    import httpx

    from kvlab.http.loadgen import http_workload, run_loadtest
    from kvlab.http.local import ServerProcess
    from kvlab.tasks.recall import load_recall_model

    n = 8 if quick else 16
    requests = http_workload("short_short", n, arrival="poisson", rate=20.0, seed=0, max_context=256)
    log_path = Path(tempfile.mkdtemp(prefix="kvlab-serve-")) / "serve.log"
    args = ["kvlab", "serve", "--device", str(device), "--threads", "1", "--max-seqs", "8",
            "--served-model-name", "recall-tiny", "--log-level", "warning"]
    server = ServerProcess(args, log_path=log_path)
    out: dict = dict(command="python -m " + " ".join(server.cmd[2:]), requests=n,
                     max_tokens=[r.max_new_tokens for r in requests])
    prompt = list(b"k3=v7 k9=v2 k3=")  # printable bytes: the recall model's own alphabet
    try:
        t0 = time.perf_counter()
        server.start(timeout_s=120)
        out["startup_s"] = time.perf_counter() - t0
        result = run_loadtest(server.url, requests, timeout_s=60.0, deadline_s=180.0,
                              extra_body={"ignore_eos": True}, progress=False)
        summary = result.summary()
        out.update(completed=summary.completed, failed=summary.failed, failed_by_reason=summary.failed_by_reason,
                   output_tokens=summary.output_tokens, expected_output_tokens=sum(out["max_tokens"]),
                   output_tokens_from=result.output_tokens_from, wall_s=result.wall_s,
                   output_tokens_per_s=summary.output_tokens_per_s,
                   ttft_p50_s=summary.latency.get("ttft", {}).get("p50"),
                   e2e_p50_s=summary.latency.get("e2e", {}).get("p50"))
        body = dict(model="recall-tiny", prompt=prompt, max_tokens=8, temperature=0.0, ignore_eos=True)
        answer = httpx.post(server.url + "/v1/completions", json=body, timeout=60.0, trust_env=False).json()
        out["greedy_text"] = answer["choices"][0]["text"]
        out["greedy_usage"] = answer.get("usage")
    except Exception as exc:  # the server's own log says why; keep its end with the error
        server.stop()
        tail = log_path.read_text()[-1500:] if log_path.exists() else "(no log)"
        raise RuntimeError(f"{type(exc).__name__}: {exc}; the server's log ends: {tail}") from exc
    out["exit_code"] = server.stop()  # uvicorn re-raises SIGTERM after its graceful shutdown: -15 is normal
    out["log_tail"] = log_path.read_text()[-2000:] if log_path.exists() else ""
    model = load_recall_model(device=device)
    expected = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=8)
    out.update(generate_text=expected.text, generate_device=str(model.device))
    return out


def http_checks(http: dict, device: torch.device) -> list[Check]:
    return [
        make_check(f"serve --device {device.type}: every request completed", http["completed"] == http["requests"]
                   and http["failed"] == 0, f"{http['requests']} completed, 0 failed",
                   f"{http['completed']} completed, {http['failed']} failed"
                   + (f" {http['failed_by_reason']}" if http["failed_by_reason"] else "") + "; "
                   f"{http['output_tokens_per_s']:.0f} output tok/s, server up in {http['startup_s']:.1f} s"),
        make_check(f"serve --device {device.type}: output tokens == max_tokens asked (ignore_eos)",
                   http["output_tokens"] == http["expected_output_tokens"],
                   f"{http['expected_output_tokens']} tokens", f"{http['output_tokens']} tokens "
                   f"(counted from {http['output_tokens_from']})"),
        make_check(f"serve --device {device.type}: greedy completion == generate's on {device.type}",
                   http["greedy_text"] == http["generate_text"], repr(http["generate_text"]),
                   repr(http["greedy_text"])),
    ]


# --- 7. benchmarks: bench decode and batch_scaling -------------------------------------------------------

def bench_decode_check(device: torch.device, quick: bool, timeout_s: float) -> dict:
    """``python -m kvlab bench decode --json`` on the device (KVLAB_DEVICE), at small settings, no compile."""
    small = quick or device.type != "cuda"
    settings = (["--config", "tiny", "--prompt", "64", "--new", "16", "--rounds", "2", "--bandwidth-mb", "64"]
                if small else ["--config", "llama-30m", "--prompt", "256", "--new", "64", "--rounds", "3"])
    path = Path(tempfile.mkdtemp(prefix="kvlab-bench-")) / "decode.json"
    cmd = [sys.executable, "-m", "kvlab", "bench", "decode", *settings, "--no-compile", "--json", str(path),
           *(["--threads", "1"] if device.type != "cuda" else [])]
    env = dict(os.environ, KVLAB_DEVICE=device.type)
    t0 = time.perf_counter()
    out: dict = dict(command="python -m " + " ".join(cmd[2:]))
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return dict(out, returncode=None, seconds=time.perf_counter() - t0, error=f"timed out after {timeout_s:.0f} s")
    out.update(returncode=proc.returncode, seconds=time.perf_counter() - t0, tail=(proc.stdout + proc.stderr)[-2500:])
    if not path.exists():
        return dict(out, error="no JSON written")
    report = json.loads(path.read_text())
    keep = ("impl", "cache", "compiled", "status", "reason", "tokens_per_s", "decode_ms_median", "achieved_GBps",
            "roofline_fraction", "same_tokens_as_kvlab_dynamic")
    out.update(device_used=report["env"].get("device_used"), settings=report["settings"],
               matvec_GBps=report["summary"]["matvec_GBps"].get("median"),
               rows=[{k: r.get(k) for k in keep} for r in report["results"]])
    return out


def bench_decode_checks(bench: dict, device: torch.device) -> list[Check]:
    checks = [make_check(f"bench decode on {device.type}: ran and wrote its JSON",
                         bench.get("returncode") == 0 and "rows" in bench and
                         str(bench.get("device_used", "")).startswith(device.type),
                         f"exit 0, device_used {device.type}",
                         f"exit {bench.get('returncode')}, device_used {bench.get('device_used')}"
                         + (f"; {bench['error']}" if "error" in bench else ""))]
    if "rows" not in bench:
        return checks
    rows = {f"{r['impl']}/{r['cache']}": r for r in bench["rows"] if not r["compiled"]}
    kvlab_rows = {k: r for k, r in rows.items() if r["impl"] == "kvlab"}
    broken = {k: r["reason"] for k, r in kvlab_rows.items() if r["status"] != "ok"}
    checks.append(make_check(f"bench decode on {device.type}: every kvlab cache ran", not broken,
                             f"{len(kvlab_rows)} ok", f"{len(kvlab_rows) - len(broken)} ok" + (f"; {broken}" if broken
                                                                                              else "")))
    exact = {k: r["same_tokens_as_kvlab_dynamic"] for k, r in rows.items()
             if r["status"] == "ok" and k in ("kvlab/none", "kvlab/static", "kvlab/offloaded")}
    # transformers' rows are shown, not checked: their parity on the device is section 3's (with an attention
    # mask); bench decode's own generate call passes pad_token_id=0 and no mask, so a prompt holding token 0
    # differs there for a reason that is not the device's
    theirs = {k: r["same_tokens_as_kvlab_dynamic"] for k, r in rows.items() if r["impl"] == "transformers"
              and r["status"] == "ok"}
    speed = ", ".join(f"{k} {r['tokens_per_s']:.0f} tok/s" for k, r in rows.items() if r["status"] == "ok")
    checks.append(make_check(f"bench decode on {device.type}: exact kvlab caches' tokens == kvlab dynamic's",
                             bool(exact) and all(exact.values()), "all True",
                             f"{exact}; transformers rows, information: {theirs}; {speed}"))
    return checks


BATCH_CLAIMS = ("decode_step_stays_flat_for_small_batches", "per_sequence_decode_time_falls_with_batch",
                "batch_one_decode_reads_below_the_bandwidth", "batched_prompts_all_get_first_tokens_sooner",
                "first_prompt_waits_for_the_batch")


def batch_scaling_check(device: torch.device, quick: bool) -> dict:
    """Notebook 05's experiment (``batch_scaling``) on the lesson model at its claim's small settings."""
    from kvlab.lessons import verdicts
    from kvlab.lessons.l01_the_slowdown.slowdown import slowdown_model
    from kvlab.lessons.l05_batching.batch_scaling import batch_scaling, crossover_batch

    sizes = (1, 2, 4, 8, 16) if quick or device.type != "cuda" else (1, 2, 4, 8, 16, 32, 64)
    result = batch_scaling(slowdown_model(), batch_sizes=sizes, steps=3, repeats=3, prompts=4, prefill_tokens=16)
    d = result.decode.set_index("batch")
    p = result.prefill.set_index("way")
    shown = verdicts(result, *BATCH_CLAIMS)
    return dict(settings=result.settings, machine=result.machine, crossover_batch=crossover_batch(result),
                decode=result.decode.to_dict(orient="records"), prefill=result.prefill.to_dict(orient="records"),
                per_seq_ms={int(b): 1e3 * d.loc[b, "per_seq_s"] for b in d.index},
                step_ms={int(b): 1e3 * d.loc[b, "step_s"] for b in d.index},
                all_first_ms={w: 1e3 * p.loc[w, "all_first_s"] for w in p.index},
                claims=[dict(claim=n, holds=v.holds, text=str(v)) for n, v in zip(BATCH_CLAIMS, shown)])


def batch_scaling_checks(scaling: dict, device: torch.device) -> list[Check]:
    per_seq, first = scaling["per_seq_ms"], scaling["all_first_ms"]
    big = max(per_seq)
    return [
        make_check(f"batch_scaling on {device.type}: per-sequence decode time at batch {big} < half of batch 1's "
                   "(wall clock)", per_seq[big] < per_seq[1] / 2, f"< {per_seq[1] / 2:.3f} ms",
                   f"{per_seq[big]:.3f} ms (step {scaling['step_ms'][1]:.2f} ms at batch 1, "
                   f"{scaling['step_ms'][big]:.2f} ms at batch {big})"),
        make_check(f"batch_scaling on {device.type}: a batched prefill gives every first token sooner (wall clock)",
                   first["batched"] < first["one by one"], f"< {first['one by one']:.2f} ms (one by one)",
                   f"{first['batched']:.2f} ms batched"),
    ]


# --- 8. the lessons' experiments on the device -----------------------------------------------------

def _ensure_ipywidgets() -> str:
    """kvlab.widgets needs ipywidgets (a kvlab dependency). The device image lacks it; the claims only call
    the widgets' plain functions, so a stand-in module lets them import. Says which one is used."""
    try:
        import ipywidgets  # noqa: F401
        return "installed"
    except ImportError:
        from unittest import mock

        stub = types.ModuleType("ipywidgets")
        stub.__getattr__ = lambda name: mock.MagicMock(name=f"ipywidgets.{name}")  # type: ignore[attr-defined]
        sys.modules["ipywidgets"] = stub
        return "stand-in (not installed here)"


def startup_check(device: torch.device) -> dict:
    """The notebooks' start-up check (``kvlab.serving.device_check``): greedy tokens of every cache and one
    paged-engine batch on the device against the CPU's. A notebook falls back to the CPU when it fails."""
    from kvlab.serving.device_check import device_check

    check = device_check(device)
    return dict(device=check.device, ok=check.ok, problems=check.problems, seconds=check.seconds, line=check.line())


def lesson_experiments(device: torch.device, quick: bool) -> dict:
    """The notebooks' own experiments at the device's lesson sizes, each summarised in a few numbers."""
    from kvlab.lessons import verdicts
    from kvlab.course import setup_report
    from kvlab.model.lessons import lesson_scale
    from kvlab.lessons.l02_kv_cache.memory import measure_cache_memory
    from kvlab.lessons.l01_the_slowdown.slowdown import run_slowdown, slowdown_model, slowdown_summary
    from kvlab.lessons.l05_batching.batching import batching_table, compare_policies
    from kvlab.lessons.l08_prefix_and_chunks.prefix_and_chunks import chunked_prefill_runs, prefix_caching_table, prefix_caching_runs
    from kvlab.lessons.l04_four_clocks.four_clocks import journey_clocks, run_journey
    from kvlab.runs.serving_run import lesson_model
    from kvlab.lessons.l03_cache_strategies.strategies import default_settings, run_strategies
    from kvlab.tasks.recall import load_recall_model

    scale = lesson_scale()
    out: dict = dict(scale=scale.describe(), setup_report=setup_report())
    model = slowdown_model()
    out["lesson_model"] = dict(name=model.config.name, parameters=model.num_parameters(), device=str(model.device))

    def section(name, fn):
        t0 = time.perf_counter()
        try:
            out[name] = dict(fn(), seconds=time.perf_counter() - t0)
        except Exception as exc:  # recorded; the other lessons still run
            out[name] = dict(error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-2000:],
                             seconds=time.perf_counter() - t0)
        print(f"  {name}: {out[name].get('error', 'ok')} ({out[name]['seconds']:.1f} s)")

    def slowdown():
        kw = dict(prompt_tokens=64, max_new_tokens=40) if quick else {}  # else the device's lesson sizes
        frame = run_slowdown(model, repeats=1 if quick else 2, **kw)
        summary = slowdown_summary(frame)
        shown = verdicts(frame, "uncached_tokens_slow_down", "cached_steps_stay_flat", "uncached_wait_gap_widens")
        return dict(attrs=dict(frame.attrs), summary=summary.to_dict(orient="records"),
                    verdicts=[str(v) for v in shown], holds=[v.holds for v in shown])

    def memory():
        frame = measure_cache_memory(model, prompt_tokens=64, max_new_tokens=32)
        last = frame.groupby("cache").tail(1)
        dyn = frame[frame["cache"] == "dynamic"]
        return dict(last=last.astype(object).where(last.notna(), None).to_dict(orient="records"),
                    dynamic_equals_formula=bool((dyn["allocated_bytes"] == dyn["formula_bytes"]).all()))

    def strategies():
        recall = load_recall_model(device=device)
        frame = run_strategies(recall, default_settings(device), pairs=(4, 16), new_tokens=8, repeats=1,
                               examples=0 if quick else 8, quality_prompts=1)
        cols = [c for c in ("setting", "pairs", "allocated_bytes", "device_bytes", "offloaded_bytes", "memory_ratio",
                            "ideal_memory_ratio", "token_ms_p50", "latency_ratio", "bytes_moved_per_step",
                            "moved_gb_per_s", "top1_agreement")
                if c in frame.columns]
        return dict(rows=frame[cols].astype(object).where(frame[cols].notna(), None).to_dict(orient="records"),
                    settings=len(default_settings(device)))

    def journey():
        run = run_journey(lesson_model(), n_ahead=2, max_seqs=1, prompt_tokens=16, max_new_tokens=8)
        return dict(clocks=journey_clocks(run).to_dict(orient="records"))

    def batching():
        runs = compare_policies(lesson_model(), n=8, max_seqs=4, prompt_tokens=32, max_new_tokens=24)
        return dict(table=batching_table(runs).to_dict(orient="records"))

    def prefix_and_chunks():
        prefix = prefix_caching_table(prefix_caching_runs(lesson_model(), n=4, system_prompt_tokens=128))
        chunks = chunked_prefill_runs(lesson_model(), n_decoding=3, decode_tokens=40, long_prompt_tokens=512)
        return dict(prefix=prefix.to_dict(orient="records"), chunked_runs=[r.label for r in chunks],
                    chunked_wall_s=[r.wall_s for r in chunks])

    for name, fn in (("01_slowdown", slowdown), ("02_memory", memory), ("03_strategies", strategies),
                     ("04_journey", journey), ("05_batching", batching), ("08_prefix_and_chunks", prefix_and_chunks)):
        section(name, fn)
    return out


def claims_on_device(budget_s: float) -> dict:
    """Every notebook claim on its example, examples made in notebook order until ``budget_s`` is spent.

    The examples are test fixtures (tests/claim_examples/), not part of the package: this reads them from the
    checkout."""
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from claim_examples import example_of
    from kvlab.lessons import CLAIMS

    made: dict = {}
    rows, t_start = [], time.perf_counter()
    for c in sorted(CLAIMS.values(), key=lambda c: c.notebook):
        make = example_of(c)
        if make not in made:
            if time.perf_counter() - t_start > budget_s:
                rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, verdict="skipped (budget)"))
                continue
            t0 = time.perf_counter()
            try:
                made[make] = (make(), None, time.perf_counter() - t0)
            except Exception as exc:
                made[make] = (None, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
        result, error, seconds = made[make]
        if error is not None:
            rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, verdict="example failed",
                             error=error, example_s=seconds))
            continue
        v = c.on(result)
        rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, example_s=seconds,
                         verdict={True: "holds", False: "does not hold", None: "not checked"}[v.holds], text=str(v)))
    return dict(rows=rows, seconds=time.perf_counter() - t_start)



# --- 9. the tests, on the device -------------------------------------------------------------------

# The shared fixtures (tests/conftest.py: device, model, each_model) follow KVLAB_TEST_DEVICE, as do
# test_generate's and the checkpoint tests' models; the lesson-scale tests check the sizes per device.
TESTS = ["tests/test_cache_offloaded.py", "tests/test_cache_quantized.py", "tests/test_offloaded_link.py",
         "tests/test_generate.py", "tests/test_engine.py", "tests/test_paged_decode.py",
         "tests/test_pretrained_checkpoints.py", "tests/test_real_model.py", "tests/test_recall_task.py",
         "tests/test_lesson_scale.py"]


def run_tests(device: torch.device, timeout_s: float = 180) -> dict:
    cmd = [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-o", "addopts=", "-W", "ignore::DeprecationWarning"]
    env = dict(os.environ, KVLAB_DEVICE=device.type, KVLAB_TEST_DEVICE=device.type, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    base = dict(command=" ".join(cmd[1:]), KVLAB_TEST_DEVICE=device.type)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return dict(base, returncode=None, seconds=time.perf_counter() - t0,
                    tail=f"timed out after {timeout_s:.0f} s: " + partial[-2000:],
                    last_line=f"timed out after {timeout_s:.0f} s")
    tail = (proc.stdout + proc.stderr)[-3000:]
    return dict(base, returncode=proc.returncode, seconds=time.perf_counter() - t0, tail=tail,
                last_line=(tail.strip().splitlines() or ["(no output)"])[-1])


def print_table(bench: dict) -> None:
    m = bench["model"]
    print(f"\n{m['name']}: hidden {m['hidden_size']}, {m['num_layers']} layers, prompt {bench['prompt_len']}, "
          f"{bench['new_tokens']} new tokens")
    print(f"{'mode':20s} {'ms/tok':>8s} {'x dyn':>6s} {'prefill ms':>10s} {'same tok':>8s} "
          f"{'alloc MB':>9s} {'device MB':>9s} {'cuda MB':>8s} {'moved MB/step':>13s} {'GB/s':>6s}")
    for r in bench["rows"]:
        cuda_mb = r.get("cuda", {}).get("allocated_after_generate")
        moved = r.get("bytes_moved_last_step")
        print(f"{r['mode']:20s} {r['ms_per_token']:8.2f} {r['latency_x_dynamic']:6.2f} {r['prefill_ms']:10.1f} "
              f"{r['agreement_with_dynamic']:8.2f} {r['memory']['allocated_bytes'] / 1e6:9.2f} "
              f"{r['memory']['device_bytes'] / 1e6:9.2f} "
              f"{'-' if cuda_mb is None else f'{cuda_mb / 1e6:.2f}':>8s} "
              f"{'-' if moved is None else f'{moved / 1e6:.1f}':>13s} "
              f"{'-' if moved is None else format(r['moved_GB_per_decode_s'], '.2f'):>6s}")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    parser.add_argument("--quick", action="store_true", help="small settings: check the script runs")
    parser.add_argument("--big", action="store_true", help="also the hidden-2048 model on CPU (slow)")
    parser.add_argument("--no-pytest", action="store_true", help="skip running the tests")
    parser.add_argument("--no-claims", action="store_true", help="skip the notebook claims on their examples")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="seconds for the whole run; the compiles, the claims and the tests get what is left "
                             "(default 450 on CUDA, about eight minutes with start-up; 240 with --quick)")
    parser.add_argument("--json", default=None, help="output path (default test-artifacts/gpu_check.json; "
                                                     "$OUT/gpu_check.json as well when $OUT is set)")
    args = parser.parse_args(argv)
    device = kvlab.pick_device(args.device)
    os.environ["KVLAB_DEVICE"] = device.type  # the lessons' defaults, the claims' examples and the children too
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    budget = args.budget_s or (240.0 if args.quick else 450.0 if device.type == "cuda" else 900.0)
    pytest_reserve = 0.0 if args.no_pytest else 150.0  # seconds kept for the tests at the end
    t0 = time.perf_counter()

    def left() -> float:
        """Seconds of the budget not yet spent, the tests' share kept aside."""
        return budget - (time.perf_counter() - t0) - pytest_reserve

    plans = [(kvlab.llama_30m(), 256, 64, list(MODES))]
    if device.type == "cuda" or args.big:
        plans.append((big_config(), 1536, 32, [m for m in MODES if m != "none"]))
    if args.quick:
        plans = [(cfg, 64, 8, modes) for cfg, _, _, modes in plans]
    repeats = 2 if device.type == "cuda" else 1

    report: dict = {"env": _environment(device), "settings": dict(device=str(device), quick=args.quick,
                                                                  repeats=repeats, dtype="float32", greedy=True,
                                                                  budget_s=budget)}
    report["env"]["ipywidgets"] = _ensure_ipywidgets()
    checks: list[Check] = []

    def add(name: str, ok: bool | None, expected="", measured="") -> None:
        checks.append(make_check(name, ok, expected, measured))

    def timed(name: str, fn):
        """Run one section; an error is recorded (and fails its check) without stopping the others."""
        print(f"\n== {name} ({time.perf_counter() - t0:.0f} s into the run)", flush=True)
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:
            value = dict(error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-3000:])
            print(value["trace"])
            add(f"{name} ran", False, "no error", value["error"])
        report.setdefault("section_seconds", {})[name] = time.perf_counter() - start
        return value

    def judge(name: str, value, fn) -> None:
        """Add a section's checks (``fn(value, device)``); a section that raised has its FAIL already."""
        if isinstance(value, dict) and "error" in value and "trace" in value:
            return
        try:
            new = fn(value, device)
        except Exception as exc:  # a result without the expected fields is a failure, not a crash
            new = [make_check(f"{name}: result has what the checks read", False, "the section's fields",
                              f"{type(exc).__name__}: {exc}")]
        checks.extend(new)
        for c in new:
            print(f"  {c.status}  {c.name}: {c.measured}")

    # 1. caches
    def caches():
        out = []
        for cfg, prompt_len, new_tokens, modes in plans:
            bench = bench_model(cfg, prompt_len, new_tokens, modes, device, repeats)
            out.append(bench)
            print_table(bench)
        return out

    report["benchmarks"] = timed("caches", caches)
    report["link"] = bw = timed("link", lambda: link_bandwidth(device))
    if isinstance(report["benchmarks"], list) and "read_GBps" in bw:
        print(f"\ntier link, timed alone: read {bw['read_GBps']:.1f} GB/s, write {bw['write_GBps']:.1f} GB/s")
        dyn_ms = {b["model"]["name"]: next(r for r in b["rows"] if r["mode"] == "dynamic")["ms_per_token"]
                  for b in report["benchmarks"]}
        for bench in report["benchmarks"]:
            name = bench["model"]["name"]
            for r in bench["rows"]:
                if r["strategy"] in ("static", "offloaded"):
                    add(f"{name} {r['mode']} tokens == dynamic", r["tokens_equal_dynamic"], "same tokens",
                        f"agreement {r['agreement_with_dynamic']:.2f}, {r['ms_per_token']:.2f} ms/token "
                        f"({r['latency_x_dynamic']:.2f}x dynamic)")
                if r["strategy"] == "offloaded":  # what the copies should cost at the link's rate, vs what was added
                    r["copy_ms_at_link_rate"] = 1e3 * r["bytes_moved_last_step"] / (1e9 * bw["read_GBps"])
                    r["added_ms_vs_dynamic"] = r["ms_per_token"] - dyn_ms[name]
                    print(f"  {name} {r['mode']}: {r['bytes_moved_last_step'] / 1e6:.1f} MB/step -> "
                          f"{r['copy_ms_at_link_rate']:.2f} ms at link rate; added {r['added_ms_vs_dynamic']:+.2f} "
                          f"ms per token vs dynamic")
                    if device.type == "cuda":
                        prefetch = r["mode"].endswith("prefetch")
                        add(f"{name} {r['mode']} prefetch on the side stream == {prefetch}",
                            r["prefetch_active"] == prefetch, prefetch, r["prefetch_active"])
                    # the tier itself, read off its tensor while the cache was open (not the pinned allocator's
                    # counter, which lags a freed block: see pinned_tier_verdict)
                    ok, expected, measured = pinned_tier_verdict(r["tier"], r["memory"]["offloaded_bytes"],
                                                                 expect_pinned=device.type == "cuda")
                    add(f"{name} {r['mode']} offloaded tier is "
                        f"{'pinned host memory' if device.type == 'cuda' else 'host memory'} of the reported size",
                        ok, expected, measured + (f"; pinned allocator delta {r['cuda']['pinned_host_extra']} B "
                                                  "(information)" if "pinned_host_extra" in r.get("cuda", {}) else ""))
                cuda = r.get("cuda")
                if cuda and r["memory"]["device_bytes"] >= 2**20 and r["strategy"] in ("dynamic", "static", "offloaded"):
                    # the cache's own device bytes vs what CUDA's allocator holds after the run (its blocks round up)
                    add(f"{name} {r['mode']} cuda allocated within 10% of the cache's device bytes",
                        abs(cuda["ratio_to_cache"] - 1) <= 0.10, f"{r['memory']['device_bytes']} B +-10%",
                        f"{cuda['allocated_after_generate']} B ({cuda['ratio_to_cache']:.3f}x)")
    report["quantized_memory"] = timed("quantized memory", lambda: quantized_memory_ratios(device))
    if isinstance(report["quantized_memory"], list):
        print("\nquantized / dynamic bytes, llama_30m shape, 1024 tokens (ideal = bits/32 + fp32 scale+zero per group)")
        for r in report["quantized_memory"]:
            print(f"  bits {r['bits']} group {r['group_size']:3d} residual {r['residual']:3d}: "
                  f"{r['ratio']:.4f}  ideal {r['ideal_ratio']:.4f}  bits/32 {r['bits_over_32']:.4f}")
            add(f"quantized bits {r['bits']} group {r['group_size']} residual {r['residual']} bytes within 10% of ideal",
                r["within_10pct"], f"{r['ideal_ratio']:.4f} of dynamic +-10%", f"{r['ratio']:.4f}")

    # 2. engine
    report["engine"] = timed("engine", lambda: engine_check(device, args.quick))
    if isinstance(report["engine"], list):
        for r in report["engine"]:
            print(f"  {r['run']:18s} {r['requests_equal']}/{r['requests']} requests == generate, {r['steps']} steps, "
                  f"{r['preemptions']} preemptions, {r['prefix_hit_tokens']} prefix-hit tokens, {r['mixed_steps']} "
                  f"mixed steps, {r['output_tokens_per_s']:.0f} tok/s"
                  + (f", cuda/pool bytes {r['cuda_over_pool']:.3f}" if "cuda_over_pool" in r else ""))
            add(f"engine {r['run']}: every request's tokens == generate", r["tokens_equal_generate"],
                f"{r['requests']} requests", f"{r['requests_equal']} equal, {r['output_tokens_per_s']:.0f} tok/s")
            if "cuda_over_pool" in r:
                add(f"engine {r['run']}: cuda allocated within 10% of the pool", abs(r["cuda_over_pool"] - 1) <= 0.10,
                    f"{r['pool_bytes']} B +-10%", f"{r['cuda_pool_bytes']} B ({r['cuda_over_pool']:.3f}x)")
        by = {r["run"]: r for r in report["engine"]}
        add("engine exercised preemption", by["preemption"]["preemptions"] > 0, "> 0 preemptions",
            by["preemption"]["preemptions"])
        add("engine exercised prefix caching", by["chunked+prefix"]["prefix_hit_tokens"] > 0, "> 0 prefix-hit tokens",
            by["chunked+prefix"]["prefix_hit_tokens"])
        add("engine exercised mixed prefill + decode steps", by["chunked+prefix"]["mixed_steps"] > 0,
            "> 0 mixed steps", by["chunked+prefix"]["mixed_steps"])

    # 3. checkpoints
    report["checkpoints"] = timed("checkpoints", lambda: checkpoint_check(device, args.quick))
    if "rows" in report["checkpoints"]:
        for r in report["checkpoints"]["rows"]:
            print(f"  {r['family']:6s} on {r['device']}: max |logit diff| {r['max_abs_logit_diff']:.2e}, greedy "
                  f"agreement {r['agreement']:.2f}, text round-trip {r['text_roundtrip']}")
            add(f"checkpoint {r['family']}: logits within 1e-3 of transformers", r["max_abs_logit_diff"] <= 1e-3,
                "<= 1e-3", f"{r['max_abs_logit_diff']:.2e} on {r['device']}")
            add(f"checkpoint {r['family']}: greedy tokens == transformers", r["greedy_equal"], "same tokens",
                f"agreement {r['agreement']:.2f}")
        demo = report["checkpoints"]["real_model_demo"]
        print(f"  real-model demo: {demo['note']}")
        dyn = [m for m in demo["memory"] if m["cache"] == "dynamic"]
        add("real-model demo: dynamic bytes == formula", all(m["allocated_bytes"] == m["formula_bytes"] for m in dyn),
            [m["formula_bytes"] for m in dyn], [m["allocated_bytes"] for m in dyn])

    # 4. half precision
    report["half_precision"] = half = timed("half precision", lambda: half_precision_check(device, args.quick))
    judge("half precision", half, lambda value, _: half_precision_checks(value))

    # 5. the compiled step (children bounded in time: a compile that does not finish is a SKIP, not a hang)
    compile_s = max(30.0, min(150.0 if device.type == "cuda" else 120.0, left() / 3))
    report["compiled_step"] = compiled = timed("compiled step", lambda: compiled_step_check(device, args.quick,
                                                                                            compile_s))
    judge("compiled step", compiled, compiled_step_checks)

    # 6. the HTTP server on the device
    report["http"] = http = timed("http serve", lambda: http_check(device, args.quick))
    judge("http serve", http, http_checks)

    # 7. benchmarks
    report["bench_decode"] = bench = timed("bench decode", lambda: bench_decode_check(device, args.quick,
                                                                                      max(60.0, min(240.0, left()))))
    judge("bench decode", bench, bench_decode_checks)
    report["batch_scaling"] = scaling = timed("batch scaling", lambda: batch_scaling_check(device, args.quick))
    judge("batch scaling", scaling, batch_scaling_checks)
    if isinstance(scaling, dict) and "claims" in scaling:
        for c in scaling["claims"]:
            print(f"    05 claim {c['claim']} (wall clock, information): {c['text']}")

    # 8. lessons: the notebooks' start-up check once, here; then it is switched off (KVLAB_DEVICE_CHECK=0) so
    # that setup_report() inside the lessons and claims neither repeats it nor moves KVLAB_DEVICE to the CPU
    report["startup_check"] = start = timed("startup check", lambda: startup_check(device))
    judge("startup check", start, lambda v, d: [make_check(
        f"notebook start-up check: {d.type} computes what the CPU computes", v["ok"],
        "same tokens for every cache and the engine", v["line"])])
    os.environ["KVLAB_DEVICE_CHECK"] = "0"
    report["lessons"] = timed("lessons", lambda: lesson_experiments(device, args.quick))
    lessons = report["lessons"]
    for name, value in lessons.items():
        if isinstance(value, dict) and "seconds" in value:
            add(f"lesson {name} ran at the device's sizes", "error" not in value, "no error",
                value.get("error", f"{value['seconds']:.1f} s"))
    if "02_memory" in lessons and "dynamic_equals_formula" in lessons["02_memory"]:
        add("lesson 02: dynamic cache bytes == formula", lessons["02_memory"]["dynamic_equals_formula"], True,
            lessons["02_memory"]["dynamic_equals_formula"])
    if "01_slowdown" in lessons and "verdicts" in lessons["01_slowdown"]:
        print("  lesson 01 on this device:\n    " + "\n    ".join(lessons["01_slowdown"]["verdicts"]))
    if not args.no_claims:
        claims_budget = max(0.0, left())
        report["claims"] = timed("claims", lambda: claims_on_device(claims_budget))
        rows = report["claims"].get("rows", [])
        for r in rows:
            if r["clock"] == "deterministic" and r["verdict"] not in ("holds", "skipped (budget)"):
                add(f"claim {r['claim']} (deterministic) holds", False, "holds", r.get("text") or r.get("error"))
        counts = {v: sum(r["verdict"] == v for r in rows) for v in {r["verdict"] for r in rows}}
        print(f"  claims: {counts} (in {claims_budget:.0f} s of budget)")
        deterministic = [r for r in rows if r["clock"] == "deterministic" and r["verdict"] != "skipped (budget)"]
        add("claims: every deterministic claim checked holds on its example",
            all(r["verdict"] == "holds" for r in deterministic) if deterministic else None,
            "every one holds", f"{counts}" if deterministic else
            f"none checked: {claims_budget:.0f} s of the budget were left for them ({counts})")
        for r in rows:
            if r["verdict"] in ("does not hold", "example failed"):
                print(f"    {r['notebook']} {r['claim']} ({r['clock']}): {r.get('text') or r.get('error')}")

    add(f"KVLAB_DEVICE stayed {device.type} through the lessons and claims",
        os.environ.get("KVLAB_DEVICE") == device.type, device.type, os.environ.get("KVLAB_DEVICE"))

    # 9. tests
    if not args.no_pytest:
        timeout = max(180.0, budget - (time.perf_counter() - t0))
        report["pytest"] = tests = timed("pytest", lambda: run_tests(device, timeout_s=timeout))
        if "returncode" in tests:
            add(f"pytest on {device.type} ({len(TESTS)} files, KVLAB_TEST_DEVICE={device.type})",
                tests["returncode"] == 0, "exit 0", f"exit {tests['returncode']}: {tests.get('last_line', '')}")
            print("\npytest:", tests.get("last_line", tests["tail"][-300:]))

    summary = summarize_checks(checks)
    report["checks"] = [asdict(c) for c in checks]
    report["summary"] = summary
    report["seconds"] = time.perf_counter() - t0
    print()
    for c in checks:
        print(f"{c.status}  {c.name}" + (f"  (expected {c.expected}; measured {c.measured})"
                                         if c.status != "PASS" else ""))
    print(f"\n{'PASS' if summary['ok'] else 'FAIL'}: {summary['passed']} passed, {summary['failed']} failed, "
          f"{summary['skipped']} skipped of {summary['total']} checks in {report['seconds']:.0f} s on {device}")

    for bench in report["benchmarks"] if isinstance(report["benchmarks"], list) else []:
        for r in bench["rows"]:  # token lists are long and only needed for the comparison
            r["tokens"] = r["tokens"][:16]
    text = markdown_summary(report, checks)
    for path in output_paths(args.json, os.environ.get("OUT")):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, report)  # strict JSON: NaN and inf as null
        path.with_suffix(".md").write_text(text)
        shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        print(f"wrote {shown} and {shown.with_suffix('.md')}")
    return report


def _environment(device: torch.device) -> dict:
    try:
        from kvlab.env import environment
        env = environment()
    except Exception as e:  # the environment helper is optional here
        env = {"error": repr(e)}
    env.update(torch=torch.__version__, cuda=torch.version.cuda, kvlab=kvlab.__version__,
               threads=torch.get_num_threads(),
               device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    return env


if __name__ == "__main__":
    report = main()
    sys.exit(0 if report["summary"]["ok"] else 1)
