"""Claims of notebook 02 (the KV cache): what a cache holds, that it changes no token, and its bytes.

Every claim here is deterministic: token counts, greedy tokens and byte counts are the same on
every machine for the same model and settings (the notebook builds its tiny model on the CPU).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from kvlab.cache.base import kv_cache_bytes
from kvlab.generate import GenerationResult
from kvlab.lessons.common.claims import claim, frame_of

NOTEBOOK = "02_kv_cache.ipynb"


def _formula(cache: Any, tokens: int) -> int:
    """The memory formula for ``tokens`` tokens of this cache's shape, at its element size."""
    elem = cache.keys[0].element_size()
    return kv_cache_bytes(cache.num_layers, cache.num_kv_heads, cache.head_dim, tokens, cache.batch, elem)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           the cache holds {stored} tokens: the {prompt} of the prompt and {fed} of the {generated} generated, all
           but the last, which is fed back only by the next step; every layer's K and V have shape (1, {kv_heads},
           {stored}, {head_dim})""",
       otherwise="""
           the cache does not hold prompt + generated − 1 tokens in every layer. Did the generation stop early (a
           stop token), or was the cache reused from another run?""")
def cache_holds_every_token_but_the_last(result: GenerationResult) -> dict:
    cache: Any = result.cache  # a DynamicCache: per-layer keys and values, all filled
    prompt, generated = len(result.prompt_ids), len(result.tokens)
    shapes = {tuple(t.shape) for t in (*cache.keys, *cache.values)}
    want = (1, cache.num_kv_heads, prompt + generated - 1, cache.head_dim)
    return dict(stored=cache.seq_len, prompt=prompt, fed=generated - 1, generated=generated,
                kv_heads=cache.num_kv_heads, head_dim=cache.head_dim,
                holds=cache.seq_len == prompt + generated - 1 and shapes == {want}
                and len(cache.keys) == cache.num_layers)


@claim(NOTEBOOK, clock="deterministic",
       says="without a cache and with one, greedy decoding wrote the same {n} tokens ({same} of {n} equal)",
       otherwise="""
           the tokens differ. In fp32 on a CPU, as this cell runs, they should not: the cache stores the keys and
           values the uncached path recomputes. Did both runs use the same model, prompt and settings? (In fp16 or
           bf16 on a GPU the two paths round differently, and a near-tie between two tokens can flip one.)""")
def cached_and_uncached_write_the_same_tokens(runs: Mapping[str, GenerationResult]) -> dict:
    a, b = runs["none"].tokens, runs["dynamic"].tokens
    return dict(n=len(b), same=sum(x == y for x, y in zip(a, b)), holds=len(a) == len(b) > 0 and a == b)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           the formula gives {formula:,} bytes for {tokens} tokens and the dynamic cache's tensors take
           {measured:,} bytes: exactly the formula""",
       otherwise="""
           the bytes differ from the formula. The dynamic cache should hold nothing but one K and one V tensor per
           layer; look at cache.keys and cache.values for extra room or other dtypes.""")
def dynamic_cache_allocates_the_formula(result: GenerationResult) -> dict:
    cache: Any = result.cache  # a DynamicCache: per-layer keys and values, all filled
    formula = _formula(cache, cache.seq_len)
    measured = sum(t.nbytes for t in (*cache.keys, *cache.values))
    return dict(formula=formula, tokens=cache.seq_len, measured=measured,
                holds=measured == formula == cache.memory().allocated_bytes)


def _capacity(result: Any, cache: str) -> int:
    """The tokens ``cache`` was built for: its own max_len option, else the run's capacity."""
    frame = frame_of(result)
    return int(frame.attrs.get("options", {}).get(cache, {}).get("max_len", frame.attrs["capacity"]))


def _rows(result: Any, cache: str) -> pd.DataFrame:
    frame = frame_of(result)
    rows = frame[(frame["cache"] == cache) & frame["tokens"].notna()]
    if rows.empty:
        raise ValueError(f"the run has no measured {cache!r} rows")
    return rows


@claim(NOTEBOOK, clock="deterministic",
       says="""
           dynamic allocated exactly the formula after each of its {steps} steps, growing from {first:,} bytes
           ({first_tokens} tokens) to {last:,} bytes ({last_tokens} tokens)""",
       otherwise="""
           at some step dynamic's bytes differ from the formula, or did not grow: look at the rows of
           memory_result.frame where allocated_bytes != formula_bytes.""")
def dynamic_memory_follows_the_formula(result: Any) -> dict:
    d = _rows(result, "dynamic")
    alloc = [int(x) for x in d["allocated_bytes"]]
    return dict(steps=len(d), first=alloc[0], last=alloc[-1], first_tokens=int(d["tokens"].iloc[0]),
                last_tokens=int(d["tokens"].iloc[-1]),
                holds=(d["allocated_bytes"] == d["formula_bytes"]).all()
                and all(b > a for a, b in zip(alloc, alloc[1:])))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           static allocated {allocated:,} bytes at every step, the formula for the whole request of {capacity}
           tokens, while the tokens it held grew from {first_tokens} to {last_tokens}; {reserved:,} bytes were
           still reserved and empty at the end""",
       otherwise="""
           static's allocation changed during the run or is not the formula for prompt + tokens to generate: look
           at allocated_bytes and reserved_bytes of its rows.""")
def static_reserves_the_whole_request(result: Any) -> dict:
    s = _rows(result, "static")
    capacity = _capacity(result, "static")
    per_token = int(s["formula_bytes"].iloc[-1]) // int(s["tokens"].iloc[-1])
    allocated = set(int(x) for x in s["allocated_bytes"])
    return dict(allocated=min(allocated), capacity=capacity, first_tokens=int(s["tokens"].iloc[0]),
                last_tokens=int(s["tokens"].iloc[-1]), reserved=int(s["reserved_bytes"].iloc[-1]),
                holds=allocated == {per_token * capacity} and (s["used_bytes"] == s["formula_bytes"]).all())


@claim(NOTEBOOK, clock="deterministic",
       says="""
           quantized allocated exactly the formula while it held at most {residual} tokens, then less:
           {allocated:,} of the formula's {formula:,} bytes ({share:.2f}) at {tokens} tokens""",
       otherwise="""
           quantized did not save memory past its full-precision window, or spent more inside it: look at its
           rows, and at memory_result.frame.attrs['options'] for its window (residual).""")
def quantized_saves_past_its_window(result: Any) -> dict:
    q = _rows(result, "quantized")
    residual = int(frame_of(result).attrs["options"]["quantized"]["residual"])
    inside, last = q[q["tokens"] <= residual], q.iloc[-1]
    if int(last["tokens"]) <= residual:  # never past the window: nothing to check yet
        return dict(residual=residual, allocated=int(last["allocated_bytes"]), formula=int(last["formula_bytes"]),
                    share=1.0, tokens=int(last["tokens"]), holds=None)
    return dict(residual=residual, allocated=int(last["allocated_bytes"]), formula=int(last["formula_bytes"]),
                share=int(last["allocated_bytes"]) / int(last["formula_bytes"]), tokens=int(last["tokens"]),
                holds=(inside["allocated_bytes"] == inside["formula_bytes"]).all()
                and int(last["allocated_bytes"]) < int(last["formula_bytes"]))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           offloaded kept {device:,} bytes on the compute device at {tokens} tokens, less than the {formula:,} its
           tokens take; its slower tier held {offloaded:,} bytes, room for {capacity} tokens""",
       otherwise="""
           offloaded kept as much on the device as the tokens take: with few layers its working buffer (one
           layer's history, two with prefetch on a GPU) is a large share of the whole.""")
def offloaded_keeps_less_on_the_device(result: Any) -> dict:
    last = _rows(result, "offloaded").iloc[-1]
    return dict(device=int(last["device_bytes"]), tokens=int(last["tokens"]), formula=int(last["formula_bytes"]),
                offloaded=int(last["offloaded_bytes"]), capacity=_capacity(result, "offloaded"),
                holds=int(last["device_bytes"]) < int(last["formula_bytes"]))


# --- a real model (only where the machine is online) ----------------------------------------------

def _model_name(demo: Any) -> str:
    """The model's short name (a hub name's last part, or a local folder's name)."""
    return Path(str(demo.text["model"].iloc[0])).name


@claim(NOTEBOOK, clock="deterministic",
       says="""
           {model}: the dynamic cache holds {used:,} bytes for {tokens} tokens, the formula's {formula:,}
           ({kib:.1f} KiB per token)""",
       otherwise="""
           the real model's cache does not take the formula's bytes: check its config (kv heads, head dimension,
           dtype) in demo.memory.attrs.""")
def real_model_cache_is_the_formula(demo: Any) -> dict:
    m = demo.memory.set_index("cache").loc["dynamic"]
    return dict(model=_model_name(demo), used=int(m["used_bytes"]), tokens=int(m["tokens"]),
                formula=int(m["formula_bytes"]), kib=float(m["kib_per_token"]),
                holds=int(m["used_bytes"]) == int(m["formula_bytes"]))


@claim(NOTEBOOK, clock="wall",
       says="{model}: a median decode step took {ratio:.1f}× as long without a cache as with one",
       otherwise="""
           the uncached steps were not clearly slower (by a fifth). On a short run the recomputed text is small; a
           busy machine can also hide it. Run the cell again.""")
def real_model_is_slower_without_a_cache(demo: Any) -> dict:
    ratio = float(demo.speed.set_index("cache").loc["none", "x_dynamic"])
    # a fixed margin: the demo records no repeat spread, and a fifth is what a busy CPU moves a median step
    return dict(model=_model_name(demo), ratio=ratio, holds=ratio > 1.2)
