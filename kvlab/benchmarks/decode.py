"""Decode benchmark: one prompt through every kvlab cache and through transformers' generate on the same weights.

``python -m kvlab bench decode [--json PATH] [--prompt 256] [--new 128] [--config llama-30m|tiny]
[--repeats N] [--threads N]``

Every mode first runs once cold (reported apart as ``cold``), then ``--repeats`` measured runs
taken round-robin over the modes, so a noisy neighbour on a shared machine slows all of them
alike; the table shows medians. Both implementations are timed the same way:

- ``tokens_per_s``: new tokens / wall time of the whole generate call (set-up and prefill included).
- ``prefill_ms``: from the first forward pass to the first token; ``ms_per_token[i]``: the step that
  produced token i (its forward pass, sampling and bookkeeping). kvlab's come from its timeline;
  transformers' from a LogitsProcessor that stamps the time as each step's logits arrive, and a
  forward pre-hook that stamps the start of the prefill.
- ``achieved_GBps``: bytes one decode step must read (the weights it streams + the stored K/V it
  attends over, at the mean position) / the median decode step time, beside the machine's own
  bandwidth measured in the same run (a sum over a large tensor, a large copy, a matrix-vector product).
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..cache import CACHE_NAMES, cache_class
from ..device import now, pick_device
from ..generate import generate
from ..model.config import ModelConfig, llama_30m, tiny_llama
from ..model.decoder import Decoder, build_model
from ..model.loading import to_transformers
from ..results_io import write_json
from ..threads import set_torch_threads

CONFIGS = {"llama-30m": llama_30m, "tiny": tiny_llama}
POSITIONS = (1, 32, 64, 127)  # tokens whose step time is reported (0 is the prefill)
KVLAB_OPTIONS = {"quantized": {"bits": 4}}  # options per kvlab cache; the rest run with their defaults
TRANSFORMERS_CACHES = ("dynamic", "static", "quantized", "offloaded")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results and environment as JSON here")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (default 256)")
    parser.add_argument("--new", type=int, default=128, help="tokens to generate (default 128)")
    parser.add_argument("--config", choices=sorted(CONFIGS), default="llama-30m",
                        help="model config (default llama-30m)")
    parser.add_argument("--repeats", type=int, default=3, help="measured runs per mode after the cold one (default 3)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--caches", default=",".join(CACHE_NAMES),
                        help=f"cache modes to run, comma-separated (default all: {','.join(CACHE_NAMES)})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt (default 0)")
    parser.add_argument("--bandwidth-mb", type=int, default=512, help="tensor size for the machine's bandwidth (MB)")


@dataclass
class Mode:
    """One thing to time: an implementation, a cache strategy, its options, and why it cannot run (if so)."""

    impl: str  # "kvlab" | "transformers"
    cache: str
    options: dict = field(default_factory=dict)
    reason: str | None = None  # None: runnable

    @property
    def label(self) -> str:
        return f"{self.impl}/{self.cache}"


@dataclass
class Run:
    """One timed generate call."""

    wall_s: float
    step_s: list[float]  # step 0 is the prefill
    tokens: list[int]
    cache_bytes: int


def kvlab_modes(names: list[str]) -> list[Mode]:
    modes = []
    for name in names:
        try:
            cache_class(name)
            reason = None
        except ImportError as e:  # the strategy's module has not landed
            reason = f"kvlab/cache/{name}.py cannot be imported ({type(e).__name__}: {e})"
        modes.append(Mode("kvlab", name, dict(KVLAB_OPTIONS.get(name, {})), reason))
    return modes


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def transformers_modes(device: torch.device) -> list[Mode]:
    modes = []
    for name in TRANSFORMERS_CACHES:
        options, reason = {}, None
        if name == "quantized":
            backend = "quanto" if installed("optimum.quanto") else "HQQ" if installed("hqq") else None
            if backend is None:
                reason = "transformers' quantized cache needs optimum-quanto or hqq; neither is installed"
            options = {"backend": backend, "nbits": 4}
        if name == "offloaded" and device.type != "cuda":
            reason = ("transformers' offloaded cache needs CUDA (it copies on CUDA streams); "
                      f"this run is on {device.type}")
        modes.append(Mode("transformers", name, options, reason))
    return modes


def run_kvlab(model: Decoder, prompt: list[int], mode: Mode, new: int) -> Run:
    t0 = now(model.device)
    result = generate(model, prompt, cache=mode.cache, max_new_tokens=new, **mode.options)
    wall = now(model.device) - t0
    bytes_ = result.cache.memory().allocated_bytes
    if hasattr(result.cache, "close"):
        result.cache.close()  # the offloaded cache's file
    return Run(wall, list(result.timeline.step_s), result.tokens, bytes_)


def run_transformers(hf, prompt: list[int], mode: Mode, new: int, device: torch.device) -> Run:
    import transformers

    stamps: list[float] = []
    starts: list[float] = []

    class Stamp(transformers.LogitsProcessor):
        """Records the time each step's logits arrive (after CUDA work has finished)."""

        def __call__(self, input_ids, scores):
            stamps.append(now(device))
            return scores

    hook = hf.register_forward_pre_hook(lambda *_: starts.append(now(device)) if not starts else None)
    extra = {"cache_config": dict(mode.options)} if mode.cache == "quantized" else {}  # generate edits it: fresh dict
    ids = torch.tensor([prompt], device=device)  # (1, T)
    try:
        t0 = now(device)
        out = hf.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                          cache_implementation=mode.cache, logits_processor=transformers.LogitsProcessorList([Stamp()]),
                          return_dict_in_generate=True, **extra)
        wall = now(device) - t0
    finally:
        hook.remove()
    steps = [stamps[0] - starts[0]] + [b - a for a, b in zip(stamps, stamps[1:])]
    return Run(wall, steps, out.sequences[0, len(prompt):].tolist(), transformers_cache_bytes(out.cache))


def transformers_cache_bytes(cache) -> int:
    """Bytes of the distinct tensors held by a transformers cache's layers."""
    seen: dict[int, int] = {}
    for layer in getattr(cache, "layers", []):
        for value in vars(layer).values():
            if isinstance(value, torch.Tensor) and value.numel():
                seen[value.data_ptr()] = value.numel() * value.element_size()
    return sum(seen.values())


def weight_bytes_per_step(model: Decoder) -> int:
    """Weight bytes one decode step streams: all of them except tables it only looks a row up in."""
    looked_up = {"pos_embed"} | ({"embed"} if model.lm_head is not None else set())  # tied: embed is the lm_head
    return sum(p.nbytes for name, p in model.named_parameters() if name not in looked_up)


def machine_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 5) -> dict:
    """The machine's own memory bandwidth in GB/s (best of ``repeats``), measured the way decode reads memory."""
    n = megabytes * 2**20 // 4
    x = torch.rand(n, device=device)  # (n,) fp32, every page touched
    y = torch.zeros_like(x)

    def best(fn) -> float:
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            t0 = now(device)
            fn()
            times.append(now(device) - t0)
        return min(times)

    nbytes = x.nbytes
    out = {"tensor_MB": megabytes,
           "sum_read_GBps": nbytes / best(lambda: x.sum()) / 1e9,
           "copy_GBps": 2 * nbytes / best(lambda: y.copy_(x)) / 1e9}  # read + write
    del x, y
    W = torch.randn(4096, 4096, device=device)  # 64 MB weight stored [in, out], as the decoder stores it
    v = torch.randn(1, 4096, device=device)
    out["matvec_GBps"] = W.nbytes / best(lambda: v @ W) / 1e9
    out["note"] = ("sum: bytes read / time; copy: (read + write) / time into a preallocated tensor; "
                   "matvec: a (1, 4096) row times a 64 MB [in, out] matrix, bytes of the matrix / time")
    return out


def summarise(mode: Mode, cold: Run | None, runs: list[Run], positions: list[int], bytes_per_step: float,
              reference: list[int] | None) -> dict:
    """One JSON row: medians over the measured runs, the cold run apart."""
    row = {"impl": mode.impl, "cache": mode.cache, "options": mode.options,
           "status": "ok" if runs else "unavailable", "reason": mode.reason}
    if not runs:
        return row
    med = statistics.median
    decode_s = med(med(r.step_s[1:]) for r in runs)  # the median decode step (runs have >= 2 tokens)
    row.update(
        tokens_per_s=med(len(r.tokens) / r.wall_s for r in runs),
        decode_tokens_per_s=med((len(r.tokens) - 1) / sum(r.step_s[1:]) for r in runs),
        prefill_ms=med(r.step_s[0] for r in runs) * 1e3,
        decode_ms_median=decode_s * 1e3,
        ms_per_token={str(p): med(r.step_s[p] for r in runs) * 1e3 for p in positions},
        cache_bytes=runs[-1].cache_bytes,
        achieved_GBps=bytes_per_step / decode_s / 1e9,
        runs_tokens_per_s=[len(r.tokens) / r.wall_s for r in runs],
        cold={"tokens_per_s": len(cold.tokens) / cold.wall_s, "prefill_ms": cold.step_s[0] * 1e3} if cold else None,
        same_tokens_as_kvlab_dynamic=None if reference is None else runs[-1].tokens == reference,
        timing="kvlab timeline" if mode.impl == "kvlab" else
               "forward pre-hook (prefill start) + LogitsProcessor stamp per step",
    )
    return row


def environment(device: torch.device, config: ModelConfig) -> dict:
    from ..env import environment as machine

    env = machine()
    env.update(device_used=str(device), threads=torch.get_num_threads(), model_config=config.to_dict())
    return env


def print_table(results: list[dict], positions: list[int]) -> None:
    head = f"{'impl':<13}{'cache':<11}{'tok/s':>8}{'prefill ms':>11}"
    head += "".join(f"{'ms@' + str(p):>9}" for p in positions)
    print(head + f"{'cache MB':>10}{'GB/s':>7}  note")
    for r in results:
        if r["status"] != "ok":
            print(f"{r['impl']:<13}{r['cache']:<11}{'-':>8}  {r['status']}: {r['reason']}")
            continue
        cells = "".join(f"{r['ms_per_token'][str(p)]:>9.2f}" for p in positions)
        note = "" if r["same_tokens_as_kvlab_dynamic"] in (None, True) else "tokens differ from kvlab/dynamic"
        print(f"{r['impl']:<13}{r['cache']:<11}{r['tokens_per_s']:>8.1f}{r['prefill_ms']:>11.1f}{cells}"
              f"{r['cache_bytes'] / 2**20:>10.2f}{r['achieved_GBps']:>7.1f}  {note}")


def main(args: argparse.Namespace) -> int:
    import transformers

    transformers.logging.set_verbosity_error()
    set_torch_threads(args.threads or None)
    if args.prompt < 1 or args.new < 2 or args.repeats < 1:
        raise SystemExit(f"need --prompt >= 1, --new >= 2 and --repeats >= 1; got {args.prompt}, {args.new}, "
                         f"{args.repeats}")
    names = [c.strip() for c in args.caches.split(",") if c.strip()]
    unknown = sorted(set(names) - set(CACHE_NAMES))
    if unknown:
        raise SystemExit(f"unknown cache(s) {unknown} in --caches; choose from {','.join(CACHE_NAMES)}")
    config = CONFIGS[args.config]()
    if args.prompt + args.new > config.max_position_embeddings:
        raise SystemExit(f"--prompt {args.prompt} + --new {args.new} exceeds the {config.name} context of "
                         f"{config.max_position_embeddings}; lower them")
    device = pick_device()
    model = build_model(config, seed=args.seed, device=device)
    hf = to_transformers(model).to(device)  # the same weights in transformers' own model
    seeded = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, config.vocab_size, (args.prompt,), generator=seeded).tolist()
    positions = sorted({p for p in POSITIONS if p < args.new} | {args.new - 1})
    print(f"kvlab bench decode: {config.name} ({model.num_parameters() / 1e6:.1f}M parameters), prompt {args.prompt}, "
          f"{args.new} new tokens, greedy, batch 1, {device}, {torch.get_num_threads()} threads", file=sys.stderr)
    bandwidth = machine_bandwidth(device, args.bandwidth_mb)

    modes = kvlab_modes(names) + [m for m in transformers_modes(device) if m.cache in names]
    runnable = [m for m in modes if m.reason is None]

    def once(mode: Mode) -> Run:
        if mode.impl == "kvlab":
            return run_kvlab(model, prompt, mode, args.new)
        with torch.inference_mode():
            return run_transformers(hf, prompt, mode, args.new, device)

    cold: dict[str, Run] = {}
    runs: dict[str, list[Run]] = {m.label: [] for m in modes}
    for rep in range(args.repeats + 1):  # round-robin: a slow moment on a shared machine hits every mode
        for mode in list(runnable):
            which = "cold" if rep == 0 else f"run {rep}/{args.repeats}"
            print(f"  {mode.label:<24} {which}", file=sys.stderr, flush=True)
            try:
                run = once(mode)
            except Exception as e:  # a mode that fails is reported, not hidden
                mode.reason = f"failed: {type(e).__name__}: {e}"
                runnable.remove(mode)
                runs[mode.label] = []
                continue
            if rep == 0:
                cold[mode.label] = run
            else:
                runs[mode.label].append(run)

    reference = runs["kvlab/dynamic"][-1].tokens if runs.get("kvlab/dynamic") else None  # greedy tokens to agree with
    weights = weight_bytes_per_step(model)
    kv_per_token = config.kv_bytes_per_token(torch.empty(0, dtype=model.dtype).element_size())
    mean_position = args.prompt + args.new / 2  # tokens attended over, averaged across decode steps
    results = []
    for mode in modes:
        kv_read = 0 if mode.cache == "none" else kv_per_token * mean_position  # "none" recomputes K/V, reads none
        row = summarise(mode, cold.get(mode.label), runs[mode.label], positions, weights + kv_read, reference)
        if mode.reason and mode.reason.startswith("failed"):
            row["status"] = "error"
        results.append(row)

    by = {(r["impl"], r["cache"]): r for r in results if r["status"] == "ok"}
    summary = {"weight_bytes_per_step": weights, "kv_bytes_per_token": kv_per_token, "mean_position": mean_position}
    if ("kvlab", "dynamic") in by and ("transformers", "dynamic") in by:
        k, t = by[("kvlab", "dynamic")], by[("transformers", "dynamic")]
        summary["ratio_dynamic_tokens_per_s"] = k["tokens_per_s"] / t["tokens_per_s"]
        summary["ratio_dynamic_decode_tokens_per_s"] = k["decode_tokens_per_s"] / t["decode_tokens_per_s"]

    print_table(results, positions)
    if "ratio_dynamic_tokens_per_s" in summary:
        print(f"\nkvlab dynamic / transformers dynamic: {summary['ratio_dynamic_tokens_per_s']:.2f}x tokens/s "
              f"(decode steps only: {summary['ratio_dynamic_decode_tokens_per_s']:.2f}x)")
    if ("kvlab", "dynamic") in by:
        print(f"achieved bandwidth, kvlab dynamic: {by[('kvlab', 'dynamic')]['achieved_GBps']:.1f} GB/s "
              f"= ({weights / 1e6:.1f} MB weights + {kv_per_token * mean_position / 1e6:.1f} MB K/V) / "
              f"{by[('kvlab', 'dynamic')]['decode_ms_median']:.2f} ms per step")
    print(f"machine: sum {bandwidth['sum_read_GBps']:.1f} GB/s, copy {bandwidth['copy_GBps']:.1f} GB/s, "
          f"matvec {bandwidth['matvec_GBps']:.1f} GB/s")

    report = {"benchmark": "decode",
              "settings": {"config": args.config, "prompt_tokens": args.prompt, "new_tokens": args.new,
                           "repeats": args.repeats, "seed": args.seed, "batch": 1, "sampling": "greedy",
                           "dtype": str(model.dtype), "positions": positions, "caches": names},
              "env": environment(device, config), "machine_bandwidth": bandwidth, "summary": summary,
              "results": results, "created_unix_s": time.time()}
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if any(r["status"] == "error" for r in results) else 0
