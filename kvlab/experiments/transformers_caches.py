"""kvlab's caches beside transformers' own, on the same weights: time per token, cache bytes, greedy tokens.

``run_transformers_caches()`` converts the recall model to transformers (``kvlab.model.loading.to_transformers``: the
same weights) and generates greedily after the same recall prompts with each pair of counterparts:

| kvlab | transformers |
|---|---|
| ``dynamic`` | ``DynamicCache`` |
| ``static`` (``max_len``) | ``StaticCache`` (``max_cache_len``, the same length) |
| ``quantized`` (``bits``, ``group_size``, ``residual``) | ``QuantizedCache("quanto", nbits, q_group_size, residual_length)`` |
| ``offloaded`` (``max_len``) | ``DynamicCache(offloading=True)`` (``cache_implementation="offloaded"``) |

Both sides are timed per token the same way (kvlab's timeline; ``kvlab.experiments.transformers_steps`` for
transformers' generate) and their cache bytes read after every step: kvlab's ``cache.memory().allocated_bytes``,
transformers' ``transformers_cache_bytes`` (the storage behind every tensor a layer holds). ``formula_bytes`` is the
oracle for both: what each library's layout must hold after a step. A transformers cache that cannot run here (the
offloaded one needs CUDA; the quantized one needs the optimum-quanto package) keeps its row, with the reason in
``status``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import pandas as pd
import torch

from kvlab.cache import make_cache
from kvlab.cache.base import kv_cache_bytes
from kvlab.cache.quantized import QuantizedCache
from kvlab.generate import generate
from kvlab.experiments.transformers_steps import installed, timed_generate
from kvlab.model.decoder import Decoder
from kvlab.threads import LESSON_THREADS, torch_threads
from kvlab.progress import Progress, no_progress

STRATEGIES = ("dynamic", "static", "quantized", "offloaded")
LIBRARIES = ("kvlab", "transformers")
QUANTO_BITS = (2, 4)  # what transformers' quanto backend stores (its QuantoQuantizedLayer refuses others)
RAN = "ran"


def check_settings(strategies: Sequence[str], bits: int, group_size: int, residual: int, head_dim: int) -> None:
    """A clear ValueError for a setting either library cannot run, before any work."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"choose strategies among {', '.join(STRATEGIES)}; got {list(strategies)!r}")
    if "quantized" in strategies:
        if bits not in QUANTO_BITS:
            raise ValueError(f"transformers' quanto backend stores {' or '.join(map(str, QUANTO_BITS))} bits, "
                             f"not {bits!r}; choose bits=4 or bits=2")
        QuantizedCache.check_options(head_dim, bits, group_size, residual)  # kvlab's own rules (group divides head_dim)


def quantized_backend() -> str:
    """One line: whether transformers' QuantizedCache can run here, with which backend, or what to install."""
    import importlib.metadata

    if installed("optimum.quanto"):
        return (f"transformers' QuantizedCache runs here with its quanto backend (optimum-quanto "
                f"{importlib.metadata.version('optimum-quanto')}, from the package index: pip install optimum-quanto)")
    return ("transformers' QuantizedCache (quanto backend) cannot run here: optimum-quanto is not installed. "
            "`pip install optimum-quanto`, restart the kernel and Run again; kvlab's quantized cache runs without it")


def transformers_cache(strategy: str, hf_config, max_len: int, bits: int = 4, group_size: int = 32,
                       residual: int = 16):
    """transformers' counterpart of a kvlab strategy, built empty for ``hf_config``."""
    import transformers

    if strategy == "dynamic":
        return transformers.DynamicCache(config=hf_config)
    if strategy == "static":
        return transformers.StaticCache(config=hf_config, max_cache_len=max_len)
    if strategy == "offloaded":
        return transformers.DynamicCache(config=hf_config, offloading=True)
    if strategy == "quantized":
        return transformers.QuantizedCache("quanto", hf_config, nbits=bits, q_group_size=group_size,
                                           residual_length=residual)
    raise ValueError(f"unknown strategy {strategy!r}; choose among {', '.join(STRATEGIES)}")


def kvlab_options(strategy: str, max_len: int, bits: int = 4, group_size: int = 32, residual: int = 16) -> dict:
    """The options of kvlab's cache that match ``transformers_cache``'s."""
    if strategy in ("static", "offloaded"):
        return {"max_len": max_len}
    if strategy == "quantized":
        return {"bits": bits, "group_size": group_size, "residual": residual}
    return {}


def describe(strategy: str, library: str, max_len: int, bits: int, group_size: int, residual: int) -> str:
    """What ran, as its library spells it."""
    if library == "kvlab":
        opts = kvlab_options(strategy, max_len, bits, group_size, residual)
        return f"{strategy}({', '.join(f'{k}={v}' for k, v in opts.items())})"
    return {"dynamic": "DynamicCache", "static": f"StaticCache(max_cache_len={max_len})",
            "offloaded": "DynamicCache(offloading=True)",
            "quantized": f"QuantizedCache(quanto, nbits={bits}, q_group_size={group_size}, residual_length={residual})"
            }[strategy]


def formula_bytes(strategy: str, library: str, cfg, step: int, prompt_tokens: int, max_len: int, bits: int = 4,
                  group_size: int = 32, residual: int = 16, element_bytes: int = 4, cuda: bool = False) -> int:
    """Bytes a library's cache must hold after ``step`` (0: the prefill; decode step i stores prompt + i tokens).

    dynamic (both) and transformers' offloaded: every stored token, K and V, every layer. static (both): ``max_len``
    tokens reserved. kvlab's offloaded: its tier of ``max_len`` tokens plus working buffers of one layer's ``max_len``
    each (one on CPU, two with prefetch on CUDA). Quantized, per token and layer, K and V alike: codes + a scale and a
    zero-point (shift) per group of ``group_size`` along head_dim; kvlab keeps the newest ``min(residual, stored)``
    tokens at full precision, transformers the tokens since its last flush (it quantizes the whole prompt at prefill,
    then grows a residual and re-quantizes everything when the residual reaches ``residual``: ``step % residual``
    tokens), and quanto packs its codes along its first axis (``ceil(groups / codes per byte)`` rows of ``group_size``
    bytes).
    """
    L, nkv, hs = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    stored = prompt_tokens + step
    per_token = kv_cache_bytes(L, nkv, hs, 1, 1, element_bytes)
    if strategy == "dynamic" or (strategy == "offloaded" and library == "transformers"):
        return stored * per_token
    if strategy == "static":
        return max_len * per_token
    if strategy == "offloaded":
        return max_len * per_token + (2 if cuda else 1) * max_len * per_token // L
    if strategy != "quantized":
        raise ValueError(f"unknown strategy {strategy!r}")
    groups_per_token = nkv * hs // group_size  # one layer, K (or V)
    if library == "kvlab":
        full = min(residual, stored)
        quantized = stored - full
        codes = quantized * nkv * hs * bits // 8
    else:
        full = step % residual if residual > 0 else 0
        quantized = stored - full
        codes = math.ceil(quantized * groups_per_token / (8 // bits)) * group_size
    scales = 2 * quantized * groups_per_token * element_bytes  # a scale and a zero-point per group
    return 2 * L * (codes + scales) + full * per_token


def _agreement(tokens: list[list[int]], reference: list[list[int]]) -> tuple[float, float]:
    """Fraction of identical tokens, position by position over every question, and the earliest
    index where any question's tokens differ (NaN when none does)."""
    same, total, first = 0, 0, math.inf
    for a, b in zip(tokens, reference):
        hits = [x == y for x, y in zip(a, b)]
        same, total = same + sum(hits), total + len(hits)
        if not all(hits):
            first = min(first, hits.index(False))
    return same / total if total else float("nan"), float(first) if first < math.inf else float("nan")


def run_transformers_caches(model: Decoder | None = None, strategies: Sequence[str] = STRATEGIES, pairs: int = 16,
                            questions: int = 4, new_tokens: int = 24, bits: int = 4, group_size: int = 32,
                            residual: int = 16, repeats: int = 1, seed: int = 1000, threads: int | None = LESSON_THREADS,
                            progress: Progress = no_progress) -> pd.DataFrame:
    """Each chosen strategy in kvlab and its transformers counterpart, on the same weights and recall prompts.

    ``questions`` recall prompts of ``pairs`` pairs, ``new_tokens`` greedy tokens each, ``repeats`` times (after one
    untimed warm-up run of every pair); kvlab and transformers take turns, so a busy moment on the machine hits both.
    Static and offloaded are sized for prompt + ``new_tokens``.

    Returns one row per (strategy, library): ``status`` ("ran", or why transformers' cache did not run here),
    ``bytes_match`` (every step's bytes equal ``formula_bytes``), ``agreement`` and ``first_divergence`` (the
    transformers row against kvlab's counterpart), ``exact_agreement`` (against kvlab's dynamic cache) and
    ``answers_right`` (questions whose first tokens are the recall answer). ``frame.attrs["steps"]``: one row per token;
    attrs also hold the settings.
    """
    from kvlab.model.loading import to_transformers
    from kvlab.experiments.recall import load_recall_model, make_examples

    strategies = [s for s in STRATEGIES if s in set(strategies)] or list(strategies)
    if new_tokens < 2 or questions < 1 or repeats < 1:
        raise ValueError(f"need new_tokens >= 2, questions >= 1, repeats >= 1; got {new_tokens}, {questions}, {repeats}")
    examples = make_examples(questions, pairs, seed=seed)  # a bad number of pairs raises here, before any work
    model = model if model is not None else load_recall_model()
    cfg = model.config
    check_settings(strategies, bits, group_size, residual, cfg.head_dim)
    prompt_tokens = len(examples[0].prompt_ids)
    max_len = prompt_tokens + new_tokens
    if max_len > cfg.max_position_embeddings:
        raise ValueError(f"{pairs} pairs ({prompt_tokens} tokens) + {new_tokens} new tokens exceed the model's "
                         f"context of {cfg.max_position_embeddings}; use fewer pairs or new tokens")
    element_bytes = torch.empty(0, dtype=model.dtype).element_size()
    cuda = model.device.type == "cuda"
    hf = to_transformers(model).to(device=model.device, dtype=model.dtype).eval()
    quant = dict(bits=bits, group_size=group_size, residual=residual)

    def run(strategy: str, library: str, prompt: list[int], n: int) -> dict:
        if library == "transformers":
            t = timed_generate(hf, prompt, n, model.device,
                               cache=transformers_cache(strategy, hf.config, max_len=max_len, **quant))
            return dict(tokens=t.tokens, step_s=t.step_s, cache_bytes=t.cache_bytes)
        cache = make_cache(strategy, cfg, batch=1, dtype=model.dtype, device=model.device,
                           **kvlab_options(strategy, max_len, **quant))
        try:
            r = generate(model, prompt, cache=cache, max_new_tokens=n)
        finally:
            if hasattr(cache, "close"):
                cache.close()  # the offloaded cache's file
        return dict(tokens=r.tokens, step_s=list(r.timeline.step_s), cache_bytes=list(r.timeline.cache_bytes))

    status = {(s, lib): RAN for s in strategies for lib in LIBRARIES}
    runs: dict[tuple[str, str], list[tuple[int, int, dict]]] = {}
    jobs = [(rep, q) for rep in range(repeats) for q in range(questions)]
    with torch_threads(threads) as used_threads, torch.inference_mode():
        for s in strategies:  # warm-up, untimed; a transformers cache that cannot run here says why, once
            for lib in LIBRARIES:
                try:
                    run(s, lib, examples[0].prompt_ids, min(3, new_tokens))
                except Exception as exc:  # noqa: BLE001 (e.g. ImportError: no optimum-quanto; CUDA-only offloading)
                    if lib == "kvlab":
                        raise
                    status[(s, lib)] = f"did not run here: {type(exc).__name__}: {' '.join(str(exc).split())}"
        for rep, q in progress(jobs, total=len(jobs), desc="kvlab and transformers"):
            order = LIBRARIES if (rep + q) % 2 == 0 else LIBRARIES[::-1]
            for s in strategies:
                for lib in order:
                    if status[(s, lib)] == RAN:
                        runs.setdefault((s, lib), []).append((rep, q, run(s, lib, examples[q].prompt_ids, new_tokens)))

    steps = pd.DataFrame([dict(strategy=s, library=lib, question=q, repeat=rep, token=i, step_ms=1e3 * dt,
                               cache_bytes=int(nbytes), token_id=tok,
                               formula_bytes=formula_bytes(s, lib, cfg, i, prompt_tokens, max_len,
                                                           element_bytes=element_bytes, cuda=cuda, **quant))
                          for (s, lib), rs in runs.items() for rep, q, r in rs
                          for i, (dt, nbytes, tok) in enumerate(zip(r["step_s"], r["cache_bytes"], r["tokens"]))],
                         columns=["strategy", "library", "question", "repeat", "token", "step_ms", "cache_bytes",
                                  "formula_bytes", "token_id"])

    def tokens_of(s: str, lib: str) -> list[list[int]] | None:
        rs = [r for rep, _q, r in runs.get((s, lib), []) if rep == 0]
        return [r["tokens"] for r in rs] if rs else None

    exact = tokens_of("dynamic", "kvlab")
    if exact is None and any(status[(s, "kvlab")] == RAN for s in strategies):  # the exact reference, untimed
        exact = [generate(model, e.prompt_ids, cache="dynamic", max_new_tokens=new_tokens).tokens for e in examples]
    rows = []
    for s in strategies:
        for lib in LIBRARIES:
            st = steps[(steps["strategy"] == s) & (steps["library"] == lib)]
            decode = st.loc[st["token"] > 0, "step_ms"]
            last = st[st["token"] == st["token"].max()] if len(st) else st
            toks, ref = tokens_of(s, lib), tokens_of(s, "kvlab")
            agree, first = _agreement(toks, ref) if toks and ref and lib == "transformers" else (np.nan, np.nan)
            exact_agree, _ = _agreement(toks, exact) if toks and exact else (np.nan, np.nan)
            right = sum(t[:len(e.answer_ids)] == e.answer_ids for t, e in zip(toks, examples)) if toks else pd.NA
            ran = status[(s, lib)] == RAN
            rows.append(dict(
                strategy=s, library=lib, implementation=describe(s, lib, max_len, **quant), status=status[(s, lib)],
                prompt_tokens=prompt_tokens, new_tokens=new_tokens, questions=questions,
                token_ms_p50=float(np.percentile(decode, 50)) if ran else np.nan,
                token_ms_p95=float(np.percentile(decode, 95)) if ran else np.nan,
                token_ms_mean=float(decode.mean()) if ran else np.nan,
                prefill_ms=float(st.loc[st["token"] == 0, "step_ms"].median()) if ran else np.nan,
                cache_bytes=int(last["cache_bytes"].iloc[0]) if ran else pd.NA,
                formula_bytes=formula_bytes(s, lib, cfg, new_tokens - 1, prompt_tokens, max_len,
                                            element_bytes=element_bytes, cuda=cuda, **quant),
                bytes_match=bool((st["cache_bytes"] == st["formula_bytes"]).all()) if ran else pd.NA,
                agreement=agree, first_divergence=first, exact_agreement=exact_agree, answers_right=right,
                device=str(model.device), threads=used_threads))
    frame = pd.DataFrame(rows)
    frame["cache_bytes"] = frame["cache_bytes"].astype("Int64")
    frame["bytes_match"] = frame["bytes_match"].astype("boolean")
    frame["answers_right"] = frame["answers_right"].astype("Int64")
    import transformers

    frame.attrs.update(steps=steps, model=getattr(cfg, "name", None) or "model", pairs=pairs, max_len=max_len,
                       bits=bits, group_size=group_size, residual=residual, repeats=repeats,
                       transformers_version=transformers.__version__,
                       bytes_per_token=kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 1, 1,
                                                      element_bytes))
    return frame


def pair_table(frame: pd.DataFrame) -> pd.DataFrame:
    """The comparison a learner reads: one row per strategy, kvlab's and transformers' numbers side by side."""
    out = []
    for s, rows in frame.groupby("strategy", sort=False):
        k, t = (rows[rows["library"] == lib].iloc[0] for lib in LIBRARIES)
        ran = t["status"] == RAN
        out.append({
            "strategy": s, "transformers": t["implementation"],
            "kvlab ms/token": k["token_ms_p50"], "transformers ms/token": t["token_ms_p50"] if ran else np.nan,
            "kvlab KiB": k["cache_bytes"] / 1024, "transformers KiB": t["cache_bytes"] / 1024 if ran else np.nan,
            "bytes = formula": bool(k["bytes_match"]) and (bool(t["bytes_match"]) if ran else True),
            "same tokens": f"{t['agreement']:.0%}" if ran else "",
            "answers right": f"{k['answers_right']} / {t['answers_right'] if ran else '-'} of {k['questions']}",
            "first divergence": ("none" if pd.isna(t["first_divergence"]) else f"token {int(t['first_divergence'])}")
            if ran else "",
            "note": "" if ran else t["status"],
        })
    return pd.DataFrame(out)


def not_run(frame: pd.DataFrame) -> list[str]:
    """One line per transformers cache that did not run here, with the reason the run gave."""
    rows = frame[(frame["library"] == "transformers") & (frame["status"] != RAN)]
    return [f"transformers' {r.implementation} {r.status}" for r in rows.itertuples()]


__all__ = ["LIBRARIES", "QUANTO_BITS", "RAN", "STRATEGIES", "check_settings", "describe", "formula_bytes",
           "kvlab_options", "not_run", "pair_table", "quantized_backend", "run_transformers_caches",
           "transformers_cache"]
