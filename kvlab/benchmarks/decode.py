"""Decode benchmark: one prompt through every kvlab cache and through transformers' generate on the same weights.

``python -m kvlab bench decode [--json PATH] [--prompt 256] [--new 128] [--config llama-30m|tiny]
[--rounds 5] [--threads N] [--caches ...] [--no-compile] [--compile-backend inductor]``

Every mode first runs once cold (reported apart as ``cold``; compiling happens there), then in
``--rounds`` interleaved rounds: each round runs every mode once, in an order rotated from round to
round (``kvlab/benchmarks/rounds.py``). A comparison is the median over rounds of the ratio *within*
each round, with its spread (IQR and min-max): on a shared machine a busy spell slows both runs of
a round alike, while a ratio of two medians taken minutes apart would compare two moments. The load
average is recorded before and after.

Rows:

- kvlab: every cache strategy (``--caches``), and, where ``--compile`` (the default), ``static``
  with its fixed-shape decode step compiled by ``torch.compile`` (``kvlab/compiled.py``);
- transformers' ``generate`` on the same weights with its caches, and, next to kvlab's compiled
  row, its own documented fast path compiled the same way (``generation_config.cache_implementation
  = "static"`` and ``model.forward = torch.compile(model.forward, ...)``, same backend, mode and
  ``dynamic=False``). The table's ``compiled`` column says which rows are compiled.

Both implementations are timed the same way:

- ``tokens_per_s``: new tokens / wall time of the whole generate call (set-up and prefill included);
  ``decode_tokens_per_s``: decode steps only.
- ``prefill_ms``: from the first forward pass to the first token; ``ms_per_token[i]``: the step that
  produced token i (its forward pass, sampling and bookkeeping). kvlab's come from its timeline;
  transformers' from a LogitsProcessor that stamps the time as each step's logits arrive, and a
  forward pre-hook that stamps the start of the prefill.
- Roofline: ``achieved_GBps`` = bytes one decode step must read (the weights it streams + the K/V
  it attends over) / the run's median decode step; ``roofline_fraction`` = that / the machine's
  matrix-vector bandwidth measured *in the same round* (the faster of a plain and a K-split product
  of a (1, 8192) row with a 256 MB [in, out] matrix, several times the last-level cache, as the
  weights are: ``MatvecProbe``). K/V read per step: the formula at the mean
  position for caches that attend over what is stored; every slot (prompt + new) for fixed-shape
  static caches (they attend over all slots, masked); the packed bytes for quantized; none for "none".
- Where the step goes: in every round ``StepProductsProbe`` also times the step's weight products
  alone (the same matrices, one row each, back to back). ``outside_products_ms`` = a mode's decode
  step - that: attention, the cache's update (a dynamic cache copies its history every step), the
  small operations between products and sampling. ``summary.step_products.share_of_matvec`` is
  what products of these shapes reach of the matvec bandwidth: a ceiling no step of this model
  passes with this product.

``compile_s`` is the cold run's compiling time. inductor keeps what it built on disk
(``TORCHINDUCTOR_CACHE_DIR``, by default under the temp folder), so a second run on the same machine
mostly reloads it: pass ``--fresh-compile-cache`` for the figure a first use sees. The JSON says which.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..cache import CACHE_NAMES, cache_class
from ..device import now, pick_device
from ..generate import generate
from ..model.config import ModelConfig, llama_30m, tiny_llama
from ..model.decoder import Decoder, build_model
from ..model.matvec import matvec
from ..model.loading import to_transformers
from ..results_io import write_json
from ..threads import set_torch_threads
from .rounds import format_load, format_spread, load_average, paired_ratio, rotated, spread

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


@dataclass
class Mode:
    """One thing to time: an implementation, a cache strategy, compiled or not, its options, why it cannot run."""

    impl: str  # "kvlab" | "transformers"
    cache: str
    options: dict = field(default_factory=dict)
    reason: str | None = None  # None: runnable
    compiled: bool = False

    @property
    def label(self) -> str:
        return f"{self.impl}/{self.cache}" + (" compiled" if self.compiled else "")


@dataclass
class Run:
    """One timed generate call."""

    wall_s: float
    step_s: list[float]  # step 0 is the prefill
    tokens: list[int]
    cache_bytes: int
    kv_read_bytes: float  # K/V bytes one decode step reads, at the mean position
    compile_s: float | None = None

    @property
    def decode_s(self) -> float:
        return statistics.median(self.step_s[1:])  # the median decode step (runs have >= 2 tokens)


def kvlab_modes(names: list[str], compile_: bool) -> list[Mode]:
    modes = []
    for name in names:
        try:
            cache_class(name)
            reason = None
        except ImportError as e:  # the strategy's module has not landed
            reason = f"kvlab/cache/{name}.py cannot be imported ({type(e).__name__}: {e})"
        modes.append(Mode("kvlab", name, dict(KVLAB_OPTIONS.get(name, {})), reason))
    if compile_ and "static" in names:
        modes.append(Mode("kvlab", "static", {}, None, compiled=True))
    return modes


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


def transformers_modes(device: torch.device, names: list[str], compile_: bool) -> list[Mode]:
    modes = []
    for name in TRANSFORMERS_CACHES:
        if name not in names:
            continue
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
    if compile_ and "static" in names:
        modes.append(Mode("transformers", "static", {}, None, compiled=True))
    return modes


def kv_tokens_read(mode: Mode, prompt: int, new: int) -> float:
    """Tokens of K/V one decode step reads, on average over the run (see the module docstring)."""
    if mode.cache == "none":
        return 0.0  # recomputes K/V from the tokens: reads no cache
    if mode.cache == "static" and (mode.compiled or mode.impl == "transformers"):
        return float(prompt + new)  # fixed shapes: attends over every slot, the empty ones masked
    return prompt + new / 2  # what is stored, at the mean position


def run_kvlab(model: Decoder, prompt: list[int], mode: Mode, new: int, kv_per_token: int, backend: str) -> Run:
    extra = {"compile": True, "compile_backend": backend} if mode.compiled else {}
    t0 = now(model.device)
    result = generate(model, prompt, cache=mode.cache, max_new_tokens=new, **mode.options, **extra)
    wall = now(model.device) - t0
    bytes_ = result.cache.memory().allocated_bytes
    if mode.cache == "quantized":  # what it stores (packed + full-precision residual), mid-run
        kv_read = float(result.timeline.cache_bytes[len(result.timeline.cache_bytes) // 2])
    else:
        kv_read = kv_per_token * kv_tokens_read(mode, len(prompt), new)
    if hasattr(result.cache, "close"):
        result.cache.close()  # the offloaded cache's file
    return Run(wall, list(result.timeline.step_s), result.tokens, bytes_, kv_read, result.settings.get("compile_s"))


def compiled_transformers(model: Decoder, backend: str):
    """transformers' documented fast path on the same weights: a static cache and a compiled forward."""
    hf = to_transformers(model).to(model.device).eval()
    hf.generation_config.cache_implementation = "static"
    hf.forward = torch.compile(hf.forward, backend=backend, dynamic=False)  # as kvlab's step: fixed shapes
    return hf


def run_transformers(hf, prompt: list[int], mode: Mode, new: int, device: torch.device, kv_per_token: int) -> Run:
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
        # an explicit mask: without one, transformers masks every prompt token equal to pad_token_id
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0,
                          cache_implementation=mode.cache, logits_processor=transformers.LogitsProcessorList([Stamp()]),
                          return_dict_in_generate=True, **extra)
        wall = now(device) - t0
    finally:
        hook.remove()
    steps = [stamps[0] - starts[0]] + [b - a for a, b in zip(stamps, stamps[1:])]
    return Run(wall, steps, out.sequences[0, len(prompt):].tolist(), transformers_cache_bytes(out.cache),
               kv_per_token * kv_tokens_read(mode, len(prompt), new))


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


def _best(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = now(device)
        fn()
        times.append(now(device) - t0)
    return min(times)


class MatvecProbe:
    """The machine's matrix-vector bandwidth from memory, cheap enough to measure once per round (best of a few).

    The matrix is 256 MB, several times any CPU's last-level cache (and a GPU's L2), as the decoder's
    weights are: a decode step streams them all before it reads the first again. A 64 MB matrix,
    this probe's earlier size, came in part from a 32 MB L3: measured one after the other on the
    authors' 2-core machine, its best of 15 read 41-45 GB/s, a 256 MB matrix's 25-34 GB/s and a
    plain sum over 256 MB 33-34 GB/s. On a shared machine the bandwidth itself also moves from
    minute to minute (33-56 GB/s for the same sum over an afternoon), which is why it is measured
    in every round.
    """

    def __init__(self, device: torch.device, n: int = 8192) -> None:
        self.device = device
        # 256 MB stored [in, out], as the decoder stores its weights; ones fill it faster than randn, and a
        # product's speed does not depend on the values (no zeros skipped, no denormals)
        self.W = torch.ones(n, n, device=device)
        self.v = torch.randn(1, n, device=device)

    def measure(self, repeats: int = 5) -> dict:
        plain = self.W.nbytes / _best(lambda: self.v @ self.W, self.device, repeats) / 1e9
        split = self.W.nbytes / _best(lambda: matvec(self.v, self.W), self.device, repeats) / 1e9
        return {"matvec_GBps": max(plain, split), "matvec_plain_GBps": plain, "matvec_split_GBps": split}


class StepProductsProbe:
    """A decode step's weight products alone: the same matrices, one row each, in forward order, back to back.

    What a step made of nothing but its weight stream would take, with kvlab's own product
    (``kvlab.model.matvec``; a tied head through ``F.linear`` as the decoder does). Next to the
    step's time it splits the step in two: streaming the weights, and everything else (attention,
    the cache's update, the small operations between products, sampling). Next to ``MatvecProbe``
    it says how much of the machine's matvec bandwidth products of these smaller shapes reach.
    """

    def __init__(self, model: Decoder) -> None:
        tied = model.lm_head is None
        self.weights = [p for name, p in model.named_parameters()
                        if p.dim() == 2 and name not in ("embed", "pos_embed")]  # [in, out] matrices
        self.rows = [torch.randn(1, 1, w.shape[0], device=w.device, dtype=w.dtype) for w in self.weights]
        self.head = model.embed if tied else None  # (V, C), applied as F.linear like the decoder's tied head
        self.head_row = torch.randn(1, 1, model.config.hidden_size, device=model.device, dtype=model.dtype)
        self.nbytes = weight_bytes_per_step(model)
        self.device = model.device

    def _products(self) -> None:
        for x, w in zip(self.rows, self.weights):
            matvec(x, w)
        if self.head is not None:
            F.linear(self.head_row, self.head)

    def measure(self, repeats: int = 5) -> dict:
        with torch.inference_mode():
            seconds = _best(self._products, self.device, repeats)
        return {"products_ms": seconds * 1e3, "products_GBps": self.nbytes / seconds / 1e9}


def machine_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 5) -> dict:
    """The machine's own memory bandwidth in GB/s (best of ``repeats``), measured the way decode reads memory."""
    n = megabytes * 2**20 // 4
    x = torch.rand(n, device=device)  # (n,) fp32, every page touched
    y = torch.zeros_like(x)
    nbytes = x.nbytes
    out = {"tensor_MB": megabytes,
           "sum_read_GBps": nbytes / _best(lambda: x.sum(), device, repeats) / 1e9,
           "copy_GBps": 2 * nbytes / _best(lambda: y.copy_(x), device, repeats) / 1e9}  # read + write
    x = y = None  # free the 2 x 512 MB before the matvec matrix
    out.update(MatvecProbe(device).measure(repeats))
    out["note"] = ("sum: bytes read / time; copy: (read + write) / time into a preallocated tensor; "
                   "matvec: a (1, 8192) row times a 256 MB [in, out] matrix (several times the last-level "
                   "cache), bytes of the matrix / time, the faster of the plain product and the K-split one "
                   "kvlab's decoder uses (kvlab.model.matvec)")
    return out


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
        tokens_per_s=med(tps),
        decode_tokens_per_s=med(decode_tps),
        prefill_ms=med(r.step_s[0] for r in runs) * 1e3,
        decode_ms_median=med(r.decode_s for r in runs) * 1e3,
        ms_per_token={str(p): med(r.step_s[p] for r in runs) * 1e3 for p in positions},
        cache_bytes=runs[-1].cache_bytes,
        bytes_per_step=weights + runs[-1].kv_read_bytes,
        kv_bytes_per_step=runs[-1].kv_read_bytes,
        achieved_GBps=med(achieved),
        roofline_fraction=med(fraction),
        outside_products_ms=med(outside),
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
    labels = {m.label for m in modes}
    pairs = []
    for m in modes:
        if m.impl != "kvlab":
            continue
        if "transformers/dynamic" in labels:
            pairs.append((m.label, "transformers/dynamic"))
        twin = Mode("transformers", m.cache, compiled=m.compiled).label
        if twin in labels and twin != "transformers/dynamic":
            pairs.append((m.label, twin))
    return pairs


def environment(device: torch.device, config: ModelConfig) -> dict:
    from ..env import environment as machine

    env = machine()
    env.update(device_used=str(device), threads=torch.get_num_threads(), model_config=config.to_dict())
    return env


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
    config = CONFIGS[args.config]()
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
            info.update(probe.measure())
            info.update(products.measure())
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
    ratios = []
    for a, b in ratio_pairs([m for m in modes if m.label in ok]):
        ra, rb = runs[a], runs[b]
        ratios.append({"a": a, "b": b,
                       "tokens_per_s": paired_ratio([len(r.tokens) / r.wall_s for r in ra],
                                                    [len(r.tokens) / r.wall_s for r in rb]),
                       "decode_tokens_per_s": paired_ratio([1 / r.decode_s for r in ra], [1 / r.decode_s for r in rb])})
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
    for key in (("kvlab", "dynamic", False), ("kvlab", "static", True)):
        if key in by:
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
              "env": environment(device, config), "machine_bandwidth": bandwidth, "summary": summary,
              "rounds": rounds_log, "results": results, "created_unix_s": time.time()}
    if args.json:
        write_json(args.json, report)
        print(f"wrote {args.json}", file=sys.stderr)
    return 1 if any(r["status"] == "error" for r in results) else 0
