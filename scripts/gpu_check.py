"""One short device check of the five caches: tokens, CUDA-synchronised timings, bytes moved, memory.

Prepared for one run on a lent GPU (a few minutes), and runnable on CPU end to end:

    python scripts/gpu_check.py                      # cuda if present, else cpu
    python scripts/gpu_check.py --device cpu --quick # small settings, to check the script itself

For every cache mode it runs ``kvlab.generate`` on a random-weight Llama (llama_30m, and on CUDA
a larger hidden-2048 / 16-layer config so transfers matter) and records ms per token, tokens
equal to dynamic's, bytes moved per step and the achieved transfer rate (offloaded, prefetch on
and off), and the cache's own device_bytes beside what CUDA's allocator reports. It also fills
llama_30m-shaped quantized caches with 1024 tokens and compares their bytes with dynamic's and
with the ideal bits/32 + scale overhead. Then it runs the cache tests with KVLAB_DEVICE set to
the device (skip with --no-pytest). Results go to $OUT/gpu_check.json if $OUT is set, else
results/gpu_check.json, with versions, device and settings.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import kvlab
from kvlab.cache import make_cache

ROOT = Path(__file__).resolve().parent.parent

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
                           ratio_cuda_to_cache=(end - before) / mem.device_bytes if mem.device_bytes else None)
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


def run_tests(device: torch.device) -> dict:
    cmd = [sys.executable, "-m", "pytest", "tests/test_cache_offloaded.py", "tests/test_cache_quantized.py",
           "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
    env = dict(os.environ, KVLAB_DEVICE=device.type)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
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
    parser.add_argument("--no-pytest", action="store_true", help="skip running the cache tests")
    parser.add_argument("--json", default=None, help="output path (default $OUT/gpu_check.json or results/)")
    args = parser.parse_args(argv)
    device = kvlab.pick_device(args.device)
    t0 = time.perf_counter()

    plans = [(kvlab.llama_30m(), 256, 64, list(MODES))]
    if device.type == "cuda" or args.big:
        plans.append((big_config(), 1536, 32, [m for m in MODES if m != "none"]))
    if args.quick:
        plans = [(cfg, 64, 8, modes) for cfg, _, _, modes in plans]
    repeats = 2 if device.type == "cuda" else 1

    report: dict = {"env": _environment(device), "settings": dict(device=str(device), quick=args.quick,
                                                                  repeats=repeats, dtype="float32", greedy=True)}
    report["benchmarks"] = []
    for cfg, prompt_len, new_tokens, modes in plans:
        bench = bench_model(cfg, prompt_len, new_tokens, modes, device, repeats)
        report["benchmarks"].append(bench)
        print_table(bench)
    report["link"] = bw = link_bandwidth(device)
    print(f"\ntier link, timed alone: read {bw['read_GBps']:.1f} GB/s, write {bw['write_GBps']:.1f} GB/s")
    dyn_ms = {b["model"]["name"]: next(r for r in b["rows"] if r["mode"] == "dynamic")["ms_per_token"]
              for b in report["benchmarks"]}
    for bench in report["benchmarks"]:
        for r in bench["rows"]:
            if r["strategy"] == "offloaded":  # what the copies should cost at the link's rate, vs what was added
                r["copy_ms_at_link_rate"] = 1e3 * r["bytes_moved_last_step"] / (1e9 * bw["read_GBps"])
                r["added_ms_vs_dynamic"] = r["ms_per_token"] - dyn_ms[bench["model"]["name"]]
                print(f"  {bench['model']['name']} {r['mode']}: {r['bytes_moved_last_step'] / 1e6:.1f} MB/step "
                      f"-> {r['copy_ms_at_link_rate']:.2f} ms at link rate; added {r['added_ms_vs_dynamic']:+.2f} ms "
                      f"per token vs dynamic")
    report["quantized_memory"] = quantized_memory_ratios(device)
    print("\nquantized / dynamic bytes, llama_30m shape, 1024 tokens (ideal = bits/32 + fp32 scale+zero per group)")
    for r in report["quantized_memory"]:
        print(f"  bits {r['bits']} group {r['group_size']:3d} residual {r['residual']:3d}: "
              f"{r['ratio']:.4f}  ideal {r['ideal_ratio']:.4f}  bits/32 {r['bits_over_32']:.4f}")

    checks = []
    for bench in report["benchmarks"]:
        for r in bench["rows"]:
            if r["strategy"] in ("static", "offloaded"):
                checks.append((f"{bench['model']['name']} {r['mode']} tokens == dynamic", r["tokens_equal_dynamic"]))
    if not args.no_pytest:
        report["pytest"] = run_tests(device)
        checks.append(("pytest cache tests", report["pytest"]["returncode"] == 0))
        print("\npytest:", report["pytest"]["tail"].strip().splitlines()[-1])
    report["checks"] = {name: ok for name, ok in checks}
    report["seconds"] = time.perf_counter() - t0
    for name, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}")

    out = Path(args.json) if args.json else (Path(os.environ["OUT"]) if os.environ.get("OUT") else ROOT / "results")
    path = out if out.suffix == ".json" else out / "gpu_check.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    for bench in report["benchmarks"]:  # token lists are long and only needed for the comparison
        for r in bench["rows"]:
            r["tokens"] = r["tokens"][:16]
    path.write_text(json.dumps(report, indent=1, default=str))
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
