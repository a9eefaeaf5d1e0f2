"""Where a decode step's time goes: the same step timed whole, and with one part left out at a time.

``python -m kvlab bench step [--config llama-30m|tiny] [--prompt 256] [--new 128] [--rounds 5] [--threads N] [--json
PATH]``

An ablation on kvlab's dynamic cache. Every round generates ``--new`` tokens once per version below (greedy, the same
prompt), in an order rotated from round to round (``kvlab/rounds.py``), and keeps each generation's median decode step:

- ``whole``: the decoder as it is;
- ``no weight products``: every one-row weight product returns what its first call computed, without reading the matrix
  (the prompt's products still run);
- ``no cache or attention``: a decode step's queries leave attention as they came and nothing is stored, so the cache
  neither copies its history nor is read;
- ``no rope``: queries and keys are not rotated by their positions.

A part's cost is ``whole - without it``, paired within each round (median, IQR and min-max over rounds). Leaving a part
out changes what the rest computes (the tokens are no longer the model's) and what the rest finds in the CPU's caches
(the part no longer evicts it), so the costs do not add up to the whole exactly: they are each part's weight in the
step, not a profile. What no version removes (norms, residual additions, activations, reshapes, sampling) is the rest.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import torch

from kvlab.cache.dynamic import DynamicCache
from kvlab.device import pick_device
from kvlab.generate import generate
from kvlab.model import decoder as decoder_module
from kvlab.model.decoder import Decoder, build_model
from kvlab.model.config import PRESETS
from kvlab.model.matvec import SPLIT_MAX_ROWS
from kvlab.results_io import write_json
from kvlab.threads import set_torch_threads
from kvlab.benchmarks.decode import checked_config
from kvlab.rounds import format_load, format_spread, load_average, paired_ratio, rotated, spread

PARTS = ("weight products", "cache and attention", "rope")  # what can be left out, in the table's order


class LeftOut:
    """A part of the decode step replaced for the duration of a ``with``; ``calls`` counts the replaced calls."""

    def __init__(self, part: str) -> None:
        if part not in PARTS:
            raise ValueError(f"unknown part {part!r}; choose from {', '.join(PARTS)}")
        self.part, self.calls = part, 0

    @contextlib.contextmanager
    def applied(self) -> Iterator["LeftOut"]:
        owner: object  # the decoder module, or the cache class
        if self.part == "weight products":
            owner, name, replacement = decoder_module, "matvec", self._products(decoder_module.matvec)
        elif self.part == "cache and attention":
            owner, name, replacement = DynamicCache, "attend", self._attention(DynamicCache.attend)
        else:
            owner, name, replacement = decoder_module, "apply_rope", self._rope(decoder_module.apply_rope)
        original = getattr(owner, name)
        setattr(owner, name, replacement)
        try:
            yield self
        finally:
            setattr(owner, name, original)

    def _products(self, matvec: Callable) -> Callable:
        kept: dict[tuple, torch.Tensor] = {}

        def product(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            if x.numel() // w.shape[0] > SPLIT_MAX_ROWS:
                return matvec(x, w)  # a prompt: computed
            key = (w.data_ptr(), tuple(x.shape))
            if key not in kept:
                kept[key] = matvec(x, w)
            else:
                self.calls += 1
            return kept[key]  # the first call's result: the matrix is not read again
        return product

    def _attention(self, attend: Callable) -> Callable:
        def no_attention(cache: DynamicCache, layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                         v: torch.Tensor) -> torch.Tensor:
            if q.size(2) > 1:
                return attend(cache, layer_idx, q, k, v)  # the prompt fills the cache as usual
            self.calls += 1
            return q  # (B, nh, 1, hs): nothing stored, nothing read
        return no_attention

    def _rope(self, apply_rope: Callable) -> Callable:
        def no_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            if x.size(2) > 1:
                return apply_rope(x, cos, sin)
            self.calls += 1
            return x
        return no_rope


def median_step_s(model: Decoder, prompt: list[int], new: int) -> float:
    """The median decode step (the prefill left out) of one greedy generation on a dynamic cache."""
    return statistics.median(generate(model, prompt, cache="dynamic", max_new_tokens=new).timeline.step_s[1:])


def step_budget(model: Decoder, prompt: list[int], new: int, rounds: int,
                progress: Callable[[str], None] | None = None) -> dict:
    """Every version once per round, rotated; per version its median steps, per part its paired cost."""
    versions = ["whole", *PARTS]
    steps: dict[str, list[float]] = {v: [] for v in versions}
    calls: dict[str, int] = {}
    median_step_s(model, prompt, new)  # warm-up, not counted
    for rnd in range(rounds):
        for version in rotated(versions, rnd):
            if progress:
                progress(f"  round {rnd + 1}/{rounds}: {'whole' if version == 'whole' else 'no ' + version}")
            if version == "whole":
                steps[version].append(median_step_s(model, prompt, new))
                continue
            with LeftOut(version).applied() as left_out:
                steps[version].append(median_step_s(model, prompt, new))
            calls[version] = left_out.calls
    whole = steps["whole"]
    parts = {}
    for part in PARTS:
        cost = [(w - s) * 1e3 for w, s in zip(whole, steps[part])]
        parts[part] = {"cost_ms": spread(cost), "share_of_step": paired_ratio(cost, [w * 1e3 for w in whole]),
                       "step_without_ms": spread([s * 1e3 for s in steps[part]]), "calls_replaced": calls[part]}
    return {"whole_ms": spread([w * 1e3 for w in whole]), "parts": parts}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", choices=sorted(PRESETS), default="llama-30m",
                        help="model config (default llama-30m)")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (default 256)")
    parser.add_argument("--new", type=int, default=128, help="tokens to generate per run (default 128)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each runs every version once (default 5)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's own choice)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the prompt (default 0)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the results, settings and machine here")


def main(args: argparse.Namespace) -> int:
    config = checked_config(args)
    set_torch_threads(args.threads or None)
    load_before = load_average()
    model = build_model(config, seed=args.seed, device=pick_device())
    prompt = torch.randint(0, config.vocab_size, (args.prompt,),
                           generator=torch.Generator().manual_seed(args.seed)).tolist()
    print(f"kvlab bench step: {config.name}, dynamic cache, {model.device}, prompt {args.prompt}, {args.new} new tokens, "
          f"{torch.get_num_threads()} threads, {args.rounds} rounds", file=sys.stderr)
    t0 = time.perf_counter()
    budget = step_budget(model, prompt, args.new, args.rounds, progress=lambda s: print(s, file=sys.stderr))
    load_after = load_average()

    whole = budget["whole_ms"]
    print(f"\nmedian decode step, whole: {format_spread(whole, '{:.2f}', ' ms')} (median over {args.rounds} rounds "
          "[IQR, min-max])")
    print(f"{'left out':<22}{'step without it, ms':>22}   its cost = whole - without, paired per round")
    for part, p in budget["parts"].items():
        print(f"{part:<22}{p['step_without_ms']['median']:>22.2f}   {format_spread(p['cost_ms'], '{:.2f}', ' ms')}, "
              f"{format_spread(p['share_of_step'], '{:.0%}')} of the step")
    rest = whole["median"] - sum(p["cost_ms"]["median"] for p in budget["parts"].values())
    print(f"{'the rest':<22}{'':>22}   {rest:.2f} ms (norms, residuals, activations, reshapes, sampling; "
          "the parts' costs interact, so this is approximate)")
    print(format_load(load_before, load_after))
    if args.json:
        from kvlab.env import environment

        write_json(args.json, {
            "benchmark": "step_budget", "budget": budget, "rest_ms": rest,
            "settings": {"config": args.config, "cache": "dynamic", "prompt_tokens": args.prompt,
                         "new_tokens": args.new, "rounds": args.rounds, "seed": args.seed, "batch": 1,
                         "sampling": "greedy", "threads": torch.get_num_threads(),
                         "method": "median decode step of a whole generation per version; versions rotated "
                                   "per round; a part's cost = whole - without it, paired per round"},
            "load_average": {"before": load_before, "after": load_after},
            "seconds": time.perf_counter() - t0, "env": environment(), "created_unix_s": time.time()})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


__all__ = ["PARTS", "LeftOut", "median_step_s", "step_budget"]
