"""Claim examples of notebook 02 (the KV cache): generations and a memory run of a tiny model on the CPU, and the
real-model demonstration on a tiny checkpoint written offline."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pandas as pd

from kvlab.generate import GenerationResult, generate
from kvlab.experiments.memory import measure_cache_memory
from kvlab.model.config import tiny_llama
from kvlab.model.decoder import build_model

from . import counterexample, example


PROMPT = "The cache keeps"


@functools.lru_cache(maxsize=1)
def _model():
    return build_model(tiny_llama(), seed=0, device="cpu")


@example("cache_holds_every_token_but_the_last", "dynamic_cache_allocates_the_formula")
@functools.lru_cache(maxsize=1)
def _generation() -> GenerationResult:
    return generate(_model(), PROMPT, cache="dynamic", max_new_tokens=8)


@example("cached_and_uncached_write_the_same_tokens")
@functools.lru_cache(maxsize=1)
def _with_and_without() -> dict[str, GenerationResult]:
    return {cache: generate(_model(), PROMPT, cache=cache, max_new_tokens=20) for cache in ("none", "dynamic")}


@example("dynamic_memory_follows_the_formula", "static_reserves_the_whole_request", "quantized_saves_past_its_window",
         "offloaded_keeps_less_on_the_device")
@functools.lru_cache(maxsize=1)
def _memory() -> pd.DataFrame:
    # 72 tokens stored at the end: past the quantized cache's 64-token full-precision window
    return measure_cache_memory(_model(), prompt_tokens=32, max_new_tokens=41)


@example("real_model_cache_is_the_formula", "real_model_is_slower_without_a_cache")
@functools.lru_cache(maxsize=1)
def _real_demo():
    """The real-model demonstration on a tiny random checkpoint written with its tokenizer (offline)."""
    import tempfile

    from kvlab.experiments.real_model import real_model_demo, try_real_model
    from kvlab.model.tiny_checkpoint import save_tiny_checkpoint

    folder = save_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="kvlab-")) / "tiny-llama", "llama")
    model, _note = try_real_model(folder)
    return real_model_demo(model, new_tokens=24, slowdown_prompt_tokens=32, slowdown_tokens=24, threads=1)


@counterexample("real_model_is_slower_without_a_cache")
def _uncached_within_noise(demo: Any) -> Any:
    """Counter-example: the uncached median step only 1.05× the cached one (inside a busy CPU's noise)."""
    speed = demo.speed.copy()
    speed.loc[speed["cache"] == "none", "x_dynamic"] = 1.05
    demo.speed = speed
    return demo
