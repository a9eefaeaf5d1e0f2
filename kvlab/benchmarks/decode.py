"""Decode benchmark: one prompt through every kvlab cache and through transformers' generate on the same weights.

``python -m kvlab bench decode [--json PATH] [--prompt 256] [--new 128] [--config llama-30m|tiny] [--rounds 5]
[--threads N] [--caches ...] [--no-compile] [--compile-backend inductor]``

Every mode first runs once cold (reported apart as ``cold``; compiling happens there), then in ``--rounds`` interleaved
rounds with paired ratios (``kvlab/rounds.py`` says why). This file is the benchmark (its rounds, rows, ratios and
report); one timed call is ``decode_runs.py`` (kvlab) and ``transformers_runs.py``, the bandwidth probes
``kvlab/experiments/bandwidth.py``.

Rows:

- kvlab: every cache strategy (``--caches``), and, where ``--compile`` (the default), ``static`` with its fixed-shape
  decode step compiled by ``torch.compile`` (``kvlab/compiled.py``);
- transformers' ``generate`` on the same weights with its caches, and, next to kvlab's compiled row, its own documented
  fast path compiled the same way (``generation_config.cache_implementation = "static"`` and ``model.forward =
  torch.compile(model.forward, ...)``, same backend, mode and ``dynamic=False``). The table's ``compiled`` column says
  which rows are compiled.

Both implementations are timed the same way:

- ``tokens_per_s``: new tokens / wall time of the whole generate call (set-up and prefill included);
  ``decode_tokens_per_s``: decode steps only.
- ``prefill_ms``: from the first forward pass to the first token; ``ms_per_token[i]``: the step that produced token i
  (its forward pass, sampling and bookkeeping). kvlab's come from its timeline; transformers' from a LogitsProcessor
  that stamps the time as each step's logits arrive, and a forward pre-hook that stamps the start of the prefill.
- Roofline: ``achieved_GBps`` = bytes one decode step must read (the weights it streams + the K/V it attends over) / the
  run's median decode step; ``roofline_fraction`` = that / the machine's matrix-vector bandwidth measured *in the same
  round* (the faster of a plain and a K-split product of a (1, 8192) row with a 256 MB [in, out] matrix, several times
  the last-level cache, as the weights are: ``MatvecProbe``). K/V read per step: the formula at the mean position for
  caches that attend over what is stored; every slot (prompt + new) for fixed-shape static caches (they attend over all
  slots, masked); the packed bytes for quantized; none for "none".
- Where the step goes: in every round ``StepProductsProbe`` also times the step's weight products alone (the same
  matrices, one row each, back to back). ``outside_products_ms`` = a mode's decode step - that: attention, the cache's
  update (a dynamic cache copies its history every step), the small operations between products and sampling.
  ``summary.step_products.share_of_matvec`` is what products of these shapes reach of the matvec bandwidth: a ceiling no
  step of this model passes with this product.

``compile_s`` is the cold run's compiling time. inductor keeps what it built on disk (``TORCHINDUCTOR_CACHE_DIR``, by
default under the temp folder), so a second run on the same machine mostly reloads it: pass ``--fresh-compile-cache``
for the figure a first use sees. The JSON says which.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from kvlab.cache import CACHE_NAMES
from kvlab.device import pick_device
from kvlab.env import environment
from kvlab.experiments.bandwidth import MatvecProbe, StepProductsProbe, machine_bandwidth, weight_bytes_per_step
from kvlab.rounds import format_load, format_spread, load_average, paired_ratio, rotated, spread
from kvlab.model.config import PRESETS, ModelConfig
from kvlab.model.decoder import build_model
from kvlab.model.loading import to_transformers
from kvlab.results_io import write_json
from kvlab.threads import set_torch_threads
from kvlab.benchmarks.decode_runs import Mode, Run, kvlab_modes, run_kvlab
from kvlab.benchmarks.transformers_runs import compiled_transformers, run_transformers, transformers_modes

POSITIONS = (1, 32, 64, 127)  # tokens whose step time is reported (0 is the prefill)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results and environment as JSON here")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (default 256)")
    parser.add_argument("--new", type=int, default=128, help="tokens to generate (default 128)")
    parser.add_argument("--config", choices=sorted(PRESETS), default="llama-30m",
                        help="model config (default llama-30m)")
    parser.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=5,
                        help="interleaved rounds after the cold one; every mode runs once per round (default 5)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--caches", default=",".join(CACHE_NAMES),
                        help=f"cache modes to run, comma-separated (default all: {','.join(CACHE_NAMES)})")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the static cache with a torch.compile'd decode step, kvlab's and "
                             "transformers' (default on)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the compiled rows (default inductor; 'eager' traces only)")
    parser.add_argument("--fresh-compile-cache", action="store_true",
                        help="compile into a new, empty inductor cache, so compile_s is a first use's figure "
                             "(by default inductor reuses programs an earlier run left on disk)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt (default 0)")
    parser.add_argument("--bandwidth-mb", type=int, default=512, help="tensor size for the machine's bandwidth (MB)")


def summarise(mode: Mode, cold: Run | None, runs: list[Run], positions: list[int], weights: int,
              matvec_per_round: list[float], reference: list[int] | None,
              products_ms_per_round: list[float]) -> dict:
    """One JSON row: medians over the rounds with their spread, the cold run apart."""
    row = {"impl": mode.impl, "cache": mode.cache, "compiled": mode.compiled, "options": mode.options,
           "status": "ok" if runs else "unavailable", "reason": mode.reason}
    if not runs:
        return row
    med = statistics.median
    tps = [len(r.tokens) / r.wall_s for r in runs]
    decode_tps = [(len(r.tokens) - 1) / sum(r.step_s[1:]) for r in runs]
    achieved = [(weights + r.kv_read_bytes) / r.decode_s / 1e9 for r in runs]
    fraction = [a / m for a, m in zip(achieved, matvec_per_round)]
    # the step minus its weight products alone, measured in the same round: attention, cache, small ops
    outside = [r.decode_s * 1e3 - p for r, p in zip(runs, products_ms_per_round)]
    row.update(
        tokens_per_s=med(tps), decode_tokens_per_s=med(decode_tps),
        prefill_ms=med(r.step_s[0] for r in runs) * 1e3, decode_ms_median=med(r.decode_s for r in runs) * 1e3,
        ms_per_token={str(p): med(r.step_s[p] for r in runs) * 1e3 for p in positions},
        cache_bytes=runs[-1].cache_bytes, bytes_per_step=weights + runs[-1].kv_read_bytes,
        kv_bytes_per_step=runs[-1].kv_read_bytes,
        achieved_GBps=med(achieved), roofline_fraction=med(fraction), outside_products_ms=med(outside),
        spread={"tokens_per_s": spread(tps), "decode_tokens_per_s": spread(decode_tps),
                "achieved_GBps": spread(achieved), "roofline_fraction": spread(fraction),
                "outside_products_ms": spread(outside)},
        runs_tokens_per_s=tps,
        cold={"tokens_per_s": len(cold.tokens) / cold.wall_s, "prefill_ms": cold.step_s[0] * 1e3,
              "wall_s": cold.wall_s} if cold else None,
        compile_s=None,
        same_tokens_as_kvlab_dynamic=None if reference is None else all(r.tokens == reference for r in runs),
        timing="kvlab timeline" if mode.impl == "kvlab" else
               "forward pre-hook (prefill start) + LogitsProcessor stamp per step",
    )
    if mode.compiled and cold is not None:
        if cold.compile_s is not None:  # kvlab measures its compiling call itself
            row["compile_s"], row["compile_how"] = cold.compile_s, "the first decode step's call (kvlab/compiled.py)"
        else:  # transformers compiles inside generate: the cold call's extra time
            row["compile_s"] = max(0.0, cold.wall_s - med(r.wall_s for r in runs))
            row["compile_how"] = "cold generate call - median warm call (prefill and decode graphs)"
    return row


def ratio_pairs(modes: list[Mode]) -> list[tuple[str, str]]:
    """(A, B) labels compared round by round: every kvlab row against transformers' dynamic cache, and like
    for like (same cache, same compilation) where transformers has the row."""
    labels, pairs = {m.label for m in modes}, []
    for m in (m for m in modes if m.impl == "kvlab"):
        twin = Mode("transformers", m.cache, compiled=m.compiled).label
        pairs += [(m.label, b) for b in dict.fromkeys(["transformers/dynamic", twin]) if b in labels]
    return pairs


def print_table(results: list[dict], positions: list[int], rounds: int) -> None:
    print(f"\nmedians over {rounds} interleaved rounds; [min-max] over rounds; % of matvec: this run's matvec "
          "bandwidth measured in the same round")
    head = f"{'impl':<13}{'cache':<10}{'compiled':<10}{'tok/s [min-max]':>22}{'prefill ms':>11}"
    head += "".join(f"{'ms@' + str(p):>8}" for p in positions)
    print(head + f"{'cache MB':>9}{'GB/s':>7}  {'% of matvec [IQR]':<18} note")
    for r in results:
        name = f"{r['impl']:<13}{r['cache']:<10}{'yes' if r.get('compiled') else 'no':<10}"
        if r["status"] != "ok":
            print(f"{name}{'-':>22}  {r['status']}: {r['reason']}")
            continue
        t, f = r["spread"]["tokens_per_s"], r["spread"]["roofline_fraction"]
        tps = f"{t['median']:.1f} [{t['min']:.1f}-{t['max']:.1f}]"
        cells = "".join(f"{r['ms_per_token'][str(p)]:>8.2f}" for p in positions)
        frac = f"{f['median']:.0%} [{f['q1']:.0%}-{f['q3']:.0%}]"
        notes = []
        if r["same_tokens_as_kvlab_dynamic"] is False:
            notes.append("tokens differ from kvlab/dynamic")
        if r.get("compile_s") is not None:
            notes.append(f"compile {r['compile_s']:.1f} s (cold run)")
        if r["cache"] == "none":
            notes.append("recomputes the sequence: compute-bound")
        print(f"{name}{tps:>22}{r['prefill_ms']:>11.1f}{cells}{r['cache_bytes'] / 2**20:>9.2f}"
              f"{r['achieved_GBps']:>7.1f}  {frac:<18} {'; '.join(notes)}")


def print_ratios(ratios: list[dict]) -> None:
    if not ratios:
        return
    n = ratios[0]["tokens_per_s"]["n"]
    print(f"\npaired ratios: A / B within each round, median over {n} rounds [IQR, min-max]")
    for r in ratios:
        print(f"  {r['a']:<22} / {r['b']:<29} tokens/s {format_spread(r['tokens_per_s'], unit='x')}; "
              f"decode steps only {format_spread(r['decode_tokens_per_s'], unit='x')}")


def checked_config(args: argparse.Namespace) -> ModelConfig:
    """The model config of ``--config``, once ``--prompt``, ``--new`` and ``--rounds`` are known to fit it."""
    if args.prompt < 1 or args.new < 2 or args.rounds < 1:
        raise SystemExit(f"need --prompt >= 1, --new >= 2 and --rounds >= 1; got {args.prompt}, {args.new}, "
                         f"{args.rounds}")
    config = PRESETS[args.config]()
    if args.prompt + args.new > config.max_position_embeddings:
        raise SystemExit(f"--prompt {args.prompt} + --new {args.new} exceeds the {config.name} context of "
                         f"{config.max_position_embeddings}; lower them")
    return config


def main(args: argparse.Namespace) -> int:
    import transformers

    transformers.logging.set_verbosity_error()
    set_torch_threads(args.threads or None)
    config = checked_config(args)
    names = [c.strip() for c in args.caches.split(",") if c.strip()]
    unknown = sorted(set(names) - set(CACHE_NAMES))
    if unknown:
        raise SystemExit(f"unknown cache(s) {unknown} in --caches; choose from {','.join(CACHE_NAMES)}")
    load_before = load_average()
    if args.compile and args.fresh_compile_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvlab-inductor-")  # read lazily by inductor
    inductor_cache = (("fresh: " if args.fresh_compile_cache else "shared, may hold earlier runs' programs: ")
                      + os.environ.get("TORCHINDUCTOR_CACHE_DIR", "inductor's default under the temp folder"))
    device = pick_device()
    model = build_model(config, seed=args.seed, device=device)
    hf = to_transformers(model).to(device)  # the same weights in transformers' own model
    seeded = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, config.vocab_size, (args.prompt,), generator=seeded).tolist()
    positions = sorted({p for p in POSITIONS if p < args.new} | {args.new - 1})
    print(f"kvlab bench decode: {config.name} ({model.num_parameters() / 1e6:.1f}M parameters), prompt {args.prompt}, "
          f"{args.new} new tokens, greedy, batch 1, {device}, {torch.get_num_threads()} threads, {args.rounds} rounds; "
          f"{format_load(load_before, load_before)}", file=sys.stderr)
    if args.rounds < 5:
        print(f"  note: {args.rounds} round(s): spreads over fewer than 5 rounds say little", file=sys.stderr)
    bandwidth = machine_bandwidth(device, args.bandwidth_mb)
    probe = MatvecProbe(device)
    products = StepProductsProbe(model)
    kv_per_token = config.kv_bytes_per_token(torch.empty(0, dtype=model.dtype).element_size())
    weights = weight_bytes_per_step(model)

    modes = kvlab_modes(names, args.compile) + transformers_modes(device, names, args.compile)
    runnable = [m for m in modes if m.reason is None]
    hf_compiled = compiled_transformers(model, args.compile_backend) if any(
        m.impl == "transformers" and m.compiled for m in runnable) else None

    def once(mode: Mode) -> Run:
        if mode.impl == "kvlab":
            return run_kvlab(model, prompt, mode, args.new, kv_per_token, args.compile_backend)
        with torch.inference_mode():
            return run_transformers(hf_compiled if mode.compiled else hf, prompt, mode, args.new, device, kv_per_token)

    cold: dict[str, Run] = {}
    runs: dict[str, list[Run]] = {m.label: [] for m in modes}
    rounds_log = []
    for rnd in range(args.rounds + 1):  # round 0: cold (compiles, warms up), not counted
        order = list(runnable) if rnd == 0 else rotated(runnable, rnd - 1)
        info = {"round": rnd, "order": [m.label for m in order], "load_1m_before": load_average()["1m"]}
        if rnd > 0:
            info.update(probe.measure() | products.measure())
        for mode in order:
            which = "cold" if rnd == 0 else f"round {rnd}/{args.rounds}"
            print(f"  {mode.label:<28} {which}", file=sys.stderr, flush=True)
            try:
                run = once(mode)
            except Exception as e:  # a mode that fails is reported, not hidden
                mode.reason = f"failed: {type(e).__name__}: {e}"
                runnable.remove(mode)
                runs[mode.label] = []
                continue
            if rnd == 0:
                cold[mode.label] = run
            else:
                runs[mode.label].append(run)
        if rnd > 0:
            rounds_log.append(info)
    # a mode that failed mid-way has fewer runs than rounds: keep only the rounds every runnable mode completed
    matvec_per_round = [r["matvec_GBps"] for r in rounds_log]
    products_ms_per_round = [r["products_ms"] for r in rounds_log]

    reference = cold["kvlab/dynamic"].tokens if "kvlab/dynamic" in cold else None  # greedy tokens to agree with
    results = []
    for mode in modes:
        row = summarise(mode, cold.get(mode.label), runs[mode.label], positions, weights,
                        matvec_per_round, reference, products_ms_per_round)
        if mode.reason and mode.reason.startswith("failed"):
            row["status"] = "error"
        results.append(row)

    ok = {m.label for m in modes if runs[m.label] and len(runs[m.label]) == len(rounds_log)}
    ratios: list[dict[str, Any]] = [
        {"a": a, "b": b, "tokens_per_s": paired_ratio([len(r.tokens) / r.wall_s for r in runs[a]],
                                                      [len(r.tokens) / r.wall_s for r in runs[b]]),
         "decode_tokens_per_s": paired_ratio([1 / r.decode_s for r in runs[a]], [1 / r.decode_s for r in runs[b]])}
        for a, b in ratio_pairs([m for m in modes if m.label in ok])]
    load_after = load_average()
    summary = {"weight_bytes_per_step": weights, "kv_bytes_per_token": kv_per_token,
               "mean_position": args.prompt + args.new / 2, "ratios": ratios,
               "ratio_method": "per round: A's tokens/s / B's tokens/s from the same round; median over rounds, "
                               "with IQR and min-max",
               "matvec_GBps": spread(matvec_per_round),
               "step_products": {"ms": spread(products_ms_per_round),
                                 "GBps": spread([r["products_GBps"] for r in rounds_log]),
                                 "share_of_matvec": spread([r["products_GBps"] / r["matvec_GBps"]
                                                            for r in rounds_log]),
                                 "what": "the decode step's weight products alone (same matrices, one row "
                                         "each, forward order, kvlab's matvec), best of 5, in every round"},
               "load_average": {"before": load_before, "after": load_after}}
    headline = next((r for r in ratios if (r["a"], r["b"]) == ("kvlab/dynamic", "transformers/dynamic")), None)
    if headline:
        summary["ratio_dynamic_tokens_per_s"] = headline["tokens_per_s"]["median"]
        summary["ratio_dynamic_decode_tokens_per_s"] = headline["decode_tokens_per_s"]["median"]

    print_table(results, positions, len(rounds_log))
    print_ratios(ratios)
    by = {(r["impl"], r["cache"], r["compiled"]): r for r in results if r["status"] == "ok"}
    print(f"\nroofline: one decode step streams {weights / 1e6:.1f} MB of weights + the K/V it attends over "
          f"({kv_per_token * (args.prompt + args.new / 2) / 1e6:.1f} MB at the mean position); at this run's matvec "
          f"bandwidth, {format_spread(summary['matvec_GBps'], '{:.1f}', ' GB/s')}, that is "
          f"{(weights + kv_per_token * (args.prompt + args.new / 2)) / summary['matvec_GBps']['median'] / 1e6:.2f} ms "
          "per step")
    for key in (k for k in (("kvlab", "dynamic", False), ("kvlab", "static", True)) if k in by):
        r = by[key]
        print(f"  {key[0]}/{key[1]}{' compiled' if key[2] else ''}: {r['achieved_GBps']:.1f} GB/s = "
              f"{r['bytes_per_step'] / 1e6:.1f} MB / {r['decode_ms_median']:.2f} ms per step, "
              f"{format_spread(r['spread']['roofline_fraction'], '{:.0%}')} of matvec; "
              f"{format_spread(r['spread']['outside_products_ms'], '{:.2f}', ' ms')} of each step outside "
              "the weight products")
    sp = summary["step_products"]
    print(f"  the step's weight products alone: {format_spread(sp['ms'], '{:.2f}', ' ms')} = "
          f"{format_spread(sp['GBps'], '{:.1f}', ' GB/s')}, {format_spread(sp['share_of_matvec'], '{:.0%}')} of "
          "matvec: the least a step of these shapes takes with this product, before attention, cache and "
          "the operations between products")
    print(f"machine: sum {bandwidth['sum_read_GBps']:.1f} GB/s, copy {bandwidth['copy_GBps']:.1f} GB/s, "
          f"matvec {bandwidth['matvec_GBps']:.1f} GB/s (plain {bandwidth['matvec_plain_GBps']:.1f}, "
          f"K-split {bandwidth['matvec_split_GBps']:.1f}) before the rounds")
    if args.compile:
        print(f"compiled rows: torch.compile(backend={args.compile_backend!r}, dynamic=False); compile times are the "
              f"cold run's; inductor cache {inductor_cache}")
    print(format_load(load_before, load_after))

    report = {"benchmark": "decode",
              "settings": {"config": args.config, "prompt_tokens": args.prompt, "new_tokens": args.new,
                           "rounds": args.rounds, "seed": args.seed, "batch": 1, "sampling": "greedy",
                           "dtype": str(model.dtype), "positions": positions, "caches": names,
                           "compile": args.compile, "compile_backend": args.compile_backend,
                           "compile_settings": "torch.compile(..., backend, dynamic=False) for kvlab's decode step "
                                               "and transformers' model.forward alike",
                           "inductor_cache": inductor_cache,
                           "load_average_1m": [load_before["1m"], load_after["1m"]]},
              "env": environment() | {"device_used": str(device), "threads": torch.get_num_threads(),
                                      "model_config": config.to_dict()},
              "machine_bandwidth": bandwidth, "summary": summary, "rounds": rounds_log, "results": results, "created_unix_s": time.time()}
    if args.json:
        print(f"wrote {write_json(args.json, report)}", file=sys.stderr)
    return 1 if any(r["status"] == "error" for r in results) else 0
