"""One short device check of every CUDA branch of kvlab, and of the lessons' experiments on the device.

Prepared for one run on a lent GPU (about five minutes, ``--budget-s`` bounds the optional parts),
and runnable on CPU end to end:

    python scripts/gpu_check.py                      # cuda if present, else cpu
    python scripts/gpu_check.py --device cpu --quick # small settings, to check the script itself

What it runs, in order (each section timed; an error in one is recorded and the rest go on):

1. caches: for every cache mode (none, dynamic, static, quantized 8/4/2, offloaded with the side-stream
   prefetch and without) ``kvlab.generate`` on a random-weight Llama (llama_30m, and on CUDA a
   hidden-2048 / 16-layer config so transfers matter): ms per token, tokens equal to dynamic's,
   bytes moved per step and the achieved transfer rate, and the cache's own device_bytes beside
   what ``torch.cuda.memory_allocated`` and the pinned host allocator report. Quantized caches of
   llama_30m's shape filled with 1024 tokens: bytes vs dynamic's and vs the ideal ratio.
2. engine: the serving engine's paged executor (``ModelExecutor`` over ``PagedKVCache``) with chunked
   prefill, prefix caching, preemption by recompute and both decode paths (batched gather and one
   sequence at a time): every request's tokens equal ``generate``'s, the pool's bytes vs CUDA's.
3. checkpoints: tiny GPT-2, Llama and Qwen2 checkpoints with their tokenizers, saved here and loaded
   with ``kvlab.from_pretrained`` on the device: logits vs transformers' and greedy tokens; the
   real-model demonstration (``kvlab.experiments.real_model``) on the Llama one.
4. lessons: with KVLAB_DEVICE set to the device, the lessons' experiments at their device defaults
   (``kvlab.device.lesson_scale``): the slowdown (01), cache memory (02), strategies (03), a journey
   (04), batching policies (05), prefix caching and chunked prefill (08); then every notebook claim on
   its example (``kvlab.claims``), with its verdict.
5. pytest: the cache, generate, engine, checkpoint and lesson-scale tests with KVLAB_DEVICE set
   (skip with --no-pytest).
Results go to $OUT/gpu_check.json if $OUT is set, else results/gpu_check.json, with versions,
device and settings. Exit status 0 when every check passed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
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


def big_config() -> kvlab.ModelConfig:
    """~0.8B-parameter Llama shape: hidden 2048, 16 layers; 256 KB of K/V per token in fp32."""
    return kvlab.llama_30m(hidden_size=2048, num_layers=16, num_heads=16, num_kv_heads=16,
                           intermediate_size=5504, max_position_embeddings=4096, name="llama-0.8b-shape")


def cuda_mem(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def pinned_host_bytes(device: torch.device) -> int | None:
    """Bytes held by CUDA's pinned host allocator (where the offloaded tier lives), if torch reports it."""
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
    if device.type == "cuda":
        end = cuda_mem(device)
        row["cuda"] = dict(allocated_after_build=after_build - before, allocated_after_generate=end - before,
                           peak_extra=torch.cuda.max_memory_allocated(device) - before,
                           cache_device_bytes=mem.device_bytes,
                           ratio_to_cache=(end - before) / mem.device_bytes if mem.device_bytes else None)
        pinned_after = pinned_host_bytes(device)
        if pinned_after is not None and pinned_before is not None:
            row["cuda"]["pinned_host_extra"] = pinned_after - pinned_before
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

    from kvlab.experiments.real_model import real_model_demo, try_real_model
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


# --- 4. the lessons' experiments on the device -----------------------------------------------------

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


def lesson_experiments(device: torch.device, quick: bool) -> dict:
    """The notebooks' own experiments at the device's lesson sizes, each summarised in a few numbers."""
    from kvlab.claims import verdicts
    from kvlab.course import setup_report
    from kvlab.device import lesson_scale
    from kvlab.experiments import measure_cache_memory, run_slowdown, slowdown_model, slowdown_summary
    from kvlab.experiments.batching import batching_table, compare_policies
    from kvlab.experiments.capacity import chunked_prefill_runs, prefix_caching_table, prefix_caching_runs
    from kvlab.experiments.four_clocks import journey_clocks, run_journey
    from kvlab.experiments.serving_run import lesson_model
    from kvlab.experiments.strategies import default_settings, run_strategies
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
    """Every notebook claim on its example, examples made in notebook order until ``budget_s`` is spent."""
    from kvlab.claims import CLAIMS

    made: dict = {}
    rows, t_start = [], time.perf_counter()
    for c in sorted(CLAIMS.values(), key=lambda c: c.notebook):
        if c.example not in made:
            if time.perf_counter() - t_start > budget_s:
                rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, verdict="skipped (budget)"))
                continue
            t0 = time.perf_counter()
            try:
                made[c.example] = (c.example(), None, time.perf_counter() - t0)
            except Exception as exc:
                made[c.example] = (None, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0)
        result, error, seconds = made[c.example]
        if error is not None:
            rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, verdict="example failed",
                             error=error, example_s=seconds))
            continue
        v = c.on(result)
        rows.append(dict(notebook=c.notebook, claim=c.name, clock=c.clock, example_s=seconds,
                         verdict={True: "holds", False: "does not hold", None: "not checked"}[v.holds], text=str(v)))
    return dict(rows=rows, seconds=time.perf_counter() - t_start)



TESTS = ["tests/test_cache_offloaded.py", "tests/test_cache_quantized.py", "tests/test_offloaded_link.py",
         "tests/test_generate.py", "tests/test_engine.py", "tests/test_paged_decode.py",
         "tests/test_pretrained_checkpoints.py", "tests/test_real_model.py"]


def run_tests(device: torch.device, timeout_s: float = 180) -> dict:
    cmd = [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
           "-o", "addopts=", "-W", "ignore::DeprecationWarning"]
    env = dict(os.environ, KVLAB_DEVICE=device.type, PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        return dict(command=" ".join(cmd[1:]), KVLAB_DEVICE=device.type, returncode=None,
                    seconds=time.perf_counter() - t0, tail=f"timed out after {timeout_s:.0f} s: "
                    + str(exc.stdout or "")[-2000:])
    return dict(command=" ".join(cmd[1:]), KVLAB_DEVICE=device.type, returncode=proc.returncode,
                seconds=time.perf_counter() - t0, tail=(proc.stdout + proc.stderr)[-3000:])


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
                        help="seconds for the whole run; the claims get what is left before the tests "
                             "(default 480 on CUDA, 120 with --quick)")
    parser.add_argument("--json", default=None, help="output path (default $OUT/gpu_check.json or results/)")
    args = parser.parse_args(argv)
    device = kvlab.pick_device(args.device)
    os.environ["KVLAB_DEVICE"] = device.type  # the lessons' defaults and the claims' examples run here too
    budget = args.budget_s or (120.0 if args.quick else 420.0 if device.type == "cuda" else 900.0)
    t0 = time.perf_counter()

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
    checks: list[tuple[str, bool]] = []

    def timed(name: str, fn):
        """Run one section; an error is recorded (and fails its check) without stopping the others."""
        print(f"\n== {name} ({time.perf_counter() - t0:.0f} s into the run)", flush=True)
        start = time.perf_counter()
        try:
            value = fn()
        except Exception as exc:
            value = dict(error=f"{type(exc).__name__}: {exc}", trace=traceback.format_exc()[-3000:])
            print(value["trace"])
            checks.append((f"{name} ran", False))
        report.setdefault("section_seconds", {})[name] = time.perf_counter() - start
        return value

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
                    checks.append((f"{name} {r['mode']} tokens == dynamic", r["tokens_equal_dynamic"]))
                if r["strategy"] == "offloaded":  # what the copies should cost at the link's rate, vs what was added
                    r["copy_ms_at_link_rate"] = 1e3 * r["bytes_moved_last_step"] / (1e9 * bw["read_GBps"])
                    r["added_ms_vs_dynamic"] = r["ms_per_token"] - dyn_ms[name]
                    print(f"  {name} {r['mode']}: {r['bytes_moved_last_step'] / 1e6:.1f} MB/step -> "
                          f"{r['copy_ms_at_link_rate']:.2f} ms at link rate; added {r['added_ms_vs_dynamic']:+.2f} "
                          f"ms per token vs dynamic")
                    if device.type == "cuda":
                        checks.append((f"{name} {r['mode']} prefetch on the side stream == {r['mode'].endswith('prefetch')}",
                                       r["prefetch_active"] == r["mode"].endswith("prefetch")))
                cuda = r.get("cuda")
                if cuda and r["memory"]["device_bytes"] >= 2**20 and r["strategy"] in ("dynamic", "static", "offloaded"):
                    # the cache's own device bytes vs what CUDA's allocator holds after the run (its blocks round up)
                    checks.append((f"{name} {r['mode']} cuda allocated within 10% of the cache's device bytes",
                                   abs(cuda["ratio_to_cache"] - 1) <= 0.10))
                if cuda and r["strategy"] == "offloaded" and cuda.get("pinned_host_extra") is not None:
                    tier = r["memory"]["offloaded_bytes"]  # the pinned allocator rounds up to a power of two
                    checks.append((f"{name} {r['mode']} pinned host bytes hold the offloaded tier",
                                   tier <= cuda["pinned_host_extra"] <= 2 * tier))
    report["quantized_memory"] = timed("quantized memory", lambda: quantized_memory_ratios(device))
    if isinstance(report["quantized_memory"], list):
        print("\nquantized / dynamic bytes, llama_30m shape, 1024 tokens (ideal = bits/32 + fp32 scale+zero per group)")
        for r in report["quantized_memory"]:
            print(f"  bits {r['bits']} group {r['group_size']:3d} residual {r['residual']:3d}: "
                  f"{r['ratio']:.4f}  ideal {r['ideal_ratio']:.4f}  bits/32 {r['bits_over_32']:.4f}")
            checks.append((f"quantized bits {r['bits']} group {r['group_size']} residual {r['residual']} bytes "
                           f"within 10% of ideal", r["within_10pct"]))

    # 2. engine
    report["engine"] = timed("engine", lambda: engine_check(device, args.quick))
    if isinstance(report["engine"], list):
        for r in report["engine"]:
            print(f"  {r['run']:18s} {r['requests_equal']}/{r['requests']} requests == generate, {r['steps']} steps, "
                  f"{r['preemptions']} preemptions, {r['prefix_hit_tokens']} prefix-hit tokens, {r['mixed_steps']} "
                  f"mixed steps, {r['output_tokens_per_s']:.0f} tok/s"
                  + (f", cuda/pool bytes {r['cuda_over_pool']:.3f}" if "cuda_over_pool" in r else ""))
            checks.append((f"engine {r['run']}: every request's tokens == generate", r["tokens_equal_generate"]))
            if "cuda_over_pool" in r:
                checks.append((f"engine {r['run']}: cuda allocated within 10% of the pool",
                               abs(r["cuda_over_pool"] - 1) <= 0.10))
        by = {r["run"]: r for r in report["engine"]}
        checks.append(("engine exercised preemption", by["preemption"]["preemptions"] > 0))
        checks.append(("engine exercised prefix caching", by["chunked+prefix"]["prefix_hit_tokens"] > 0))
        checks.append(("engine exercised mixed prefill + decode steps", by["chunked+prefix"]["mixed_steps"] > 0))

    # 3. checkpoints
    report["checkpoints"] = timed("checkpoints", lambda: checkpoint_check(device, args.quick))
    if "rows" in report["checkpoints"]:
        for r in report["checkpoints"]["rows"]:
            print(f"  {r['family']:6s} on {r['device']}: max |logit diff| {r['max_abs_logit_diff']:.2e}, greedy "
                  f"agreement {r['agreement']:.2f}, text round-trip {r['text_roundtrip']}")
            checks.append((f"checkpoint {r['family']}: logits within 1e-3 of transformers",
                           r["max_abs_logit_diff"] <= 1e-3))
            checks.append((f"checkpoint {r['family']}: greedy tokens == transformers", r["greedy_equal"]))
        demo = report["checkpoints"]["real_model_demo"]
        print(f"  real-model demo: {demo['note']}")
        checks.append(("real-model demo: dynamic bytes == formula",
                       all(m["allocated_bytes"] == m["formula_bytes"] for m in demo["memory"] if m["cache"] == "dynamic")))

    # 4. lessons
    report["lessons"] = timed("lessons", lambda: lesson_experiments(device, args.quick))
    lessons = report["lessons"]
    for name, value in lessons.items():
        if isinstance(value, dict) and "seconds" in value:
            checks.append((f"lesson {name} ran at the device's sizes", "error" not in value))
    if "02_memory" in lessons and "dynamic_equals_formula" in lessons["02_memory"]:
        checks.append(("lesson 02: dynamic cache bytes == formula", lessons["02_memory"]["dynamic_equals_formula"]))
    if "01_slowdown" in lessons and "verdicts" in lessons["01_slowdown"]:
        print("  lesson 01 on this device:\n    " + "\n    ".join(lessons["01_slowdown"]["verdicts"]))
    if not args.no_claims:
        left = budget - (time.perf_counter() - t0) - (120 if not args.no_pytest else 0)
        report["claims"] = timed("claims", lambda: claims_on_device(max(0.0, left)))
        rows = report["claims"].get("rows", [])
        for r in rows:
            if r["clock"] == "deterministic" and r["verdict"] not in ("holds", "skipped (budget)"):
                checks.append((f"claim {r['claim']} (deterministic) holds", False))
        counts = {v: sum(r["verdict"] == v for r in rows) for v in {r["verdict"] for r in rows}}
        print(f"  claims: {counts}")
        for r in rows:
            if r["verdict"] in ("does not hold", "example failed"):
                print(f"    {r['notebook']} {r['claim']} ({r['clock']}): {r.get('text') or r.get('error')}")

    # 5. tests
    if not args.no_pytest:
        report["pytest"] = run_tests(device)
        checks.append(("pytest on the device", report["pytest"]["returncode"] == 0))
        print("\npytest:", (report["pytest"]["tail"].strip().splitlines() or ["(no output)"])[-1])

    report["checks"] = {name: bool(ok) for name, ok in checks}
    report["seconds"] = time.perf_counter() - t0
    print()
    for name, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}")

    out = Path(args.json) if args.json else (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "results")
    path = out if out.suffix == ".json" else out / "gpu_check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for bench in report["benchmarks"] if isinstance(report["benchmarks"], list) else []:
        for r in bench["rows"]:  # token lists are long and only needed for the comparison
            r["tokens"] = r["tokens"][:16]
    write_json(path, report)  # strict JSON: NaN and inf as null
    print(f"\nwrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} in {report['seconds']:.0f} s")
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
    sys.exit(0 if all(report["checks"].values()) else 1)
