"""Timed generation for one sequence: prefill, then decode steps, with a timeline of every token."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import pandas as pd
import torch

from .cache import KVCache, NoCache, check_cache_options, make_cache
from .device import now
from .model.decoder import Decoder


@dataclass
class TokenEvent:
    """One generated token, as a streaming caller sees it."""

    index: int  # 0 for the first generated token
    token_id: int
    text: str
    time_s: float  # since generation started (first token: time to first token, without queueing)
    step_s: float  # duration of the step that produced it (step 0 is the prefill)
    seq_len: int  # tokens in the sequence after this step
    cache_bytes: int  # cache bytes allocated after this step
    bytes_moved: int = 0  # bytes the cache moved between memory tiers in this step (offloaded only)


@dataclass
class Timeline:
    """Per-token timings of one generation; ``to_frame()`` gives one row per generated token."""

    prompt_tokens: int
    prefill_s: float = 0.0
    token_time_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    cache_bytes: list[int] = field(default_factory=list)
    bytes_moved: list[int] = field(default_factory=list)

    def to_frame(self) -> pd.DataFrame:
        n = len(self.step_s)
        return pd.DataFrame({
            "token": range(n),
            "position": [self.prompt_tokens + i for i in range(n)],
            "time_s": self.token_time_s,
            "step_ms": [s * 1e3 for s in self.step_s],
            "phase": ["prefill"] + ["decode"] * (n - 1),
            "cache_bytes": self.cache_bytes,
            "bytes_moved": self.bytes_moved,
        })

    @property
    def decode_ms_per_token(self) -> float:
        steps = self.step_s[1:]
        return 1e3 * sum(steps) / len(steps) if steps else float("nan")


@dataclass
class GenerationResult:
    """The tokens generated, the text, the timeline, and the settings that produced them."""

    prompt_ids: list[int]
    tokens: list[int]
    text: str
    timeline: Timeline
    cache: KVCache
    stop_reason: str  # "max_new_tokens" or "stop_token"
    settings: dict

    @property
    def tokens_per_s(self) -> float:
        total = self.timeline.token_time_s[-1] if self.timeline.token_time_s else 0.0
        return len(self.tokens) / total if total > 0 else float("nan")


def encode_prompt(model: Decoder, prompt: str | Sequence[int] | torch.Tensor) -> list[int]:
    """Prompt as a list of token ids, checked against the model's vocabulary."""
    if isinstance(prompt, str):
        if model.tokenizer is None:
            raise ValueError("this model has no tokenizer; pass token ids instead of text")
        ids = model.tokenizer.encode(prompt)
    elif isinstance(prompt, torch.Tensor):
        ids = prompt.flatten().tolist()
    else:
        ids = list(prompt)
    if not ids:
        raise ValueError("the prompt is empty: give at least one token (a non-empty string or id list)")
    not_int = [i for i in ids if isinstance(i, bool) or not isinstance(i, numbers.Integral)]
    if not_int:
        raise ValueError(f"token id {not_int[0]!r} is not an integer; pass text or a list of integer token ids")
    ids = [int(i) for i in ids]  # numpy / torch integers -> int
    V = model.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise ValueError(f"token id {bad[0]!r} is outside the vocabulary [0, {V}) ({len(bad)} bad id(s) in the "
                         "prompt); encode the prompt with this model's tokenizer")
    return ids


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token from logits (B, V): greedy when temperature is 0, else seeded sampling. -> (B,)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V)
        drop_sorted = cum - sorted_logits.softmax(dim=-1) >= top_p  # keep the smallest set reaching top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


def check_generation_args(model: Decoder, prompt_ids: list[int], cache: str | KVCache, max_new_tokens: int,
                          temperature: float, top_k: int | None, top_p: float | None,
                          cache_options: dict) -> None:
    """Every check that can fail, done before any work."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    total = len(prompt_ids) + max_new_tokens
    if total > model.config.max_position_embeddings:
        raise ValueError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) = {total} exceeds the "
                         f"model's context of {model.config.max_position_embeddings} tokens; "
                         "shorten the prompt or lower max_new_tokens")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if isinstance(cache, str):
        check_cache_options(cache, cache_options)
        cap = cache_options.get("max_len")
        if cap is not None and total > cap:
            raise ValueError(f"{cache} cache holds {cap} tokens but prompt ({len(prompt_ids)}) + max_new_tokens "
                             f"({max_new_tokens}) = {total}; raise max_len or lower max_new_tokens")
    else:
        cfg = model.config
        built = (cache.num_layers, cache.num_kv_heads, cache.head_dim, cache.batch)
        if built != (cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 1):
            raise ValueError(f"the cache passed in has (layers, kv_heads, head_dim, batch) = {built} but this model "
                             f"needs {(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 1)}; build it with "
                             "make_cache(name, model.config, batch=1)")
        if cache.dtype != model.dtype:
            raise ValueError(f"the cache passed in stores {cache.dtype} but the model computes in {model.dtype}; "
                             "build it with make_cache(..., dtype=model.dtype)")
        if cache.seq_len:
            raise ValueError(f"the cache passed in already holds {cache.seq_len} tokens; call cache.reset() first")
        cap = getattr(cache, "max_len", None)
        if cap is not None and total > cap:
            raise ValueError(f"{cache.name} cache holds {cap} tokens but prompt ({len(prompt_ids)}) + "
                             f"max_new_tokens ({max_new_tokens}) = {total}; raise max_len or lower max_new_tokens")


def prefill(model: Decoder, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the whole prompt (1, T) through the model, filling the cache. -> last logits (1, V)."""
    return model(ids, cache, last_only=True)[:, -1]


def decode_one_token(model: Decoder, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run one new token (1, 1) against the stored history. -> logits (1, V)."""
    return model(token, cache, last_only=True)[:, -1]


def stream(model: Decoder, prompt: str | Sequence[int] | torch.Tensor, cache: str | KVCache = "dynamic",
           max_new_tokens: int = 32, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, seed: int | None = None, stop_tokens: Sequence[int] | None = None,
           compile: bool = False, compile_backend: str = "inductor", **cache_options) -> Iterator[TokenEvent]:
    """Generate token by token, yielding a TokenEvent as each token is ready.

    ``cache`` is a strategy name ("none", "dynamic", "static", "quantized", "offloaded") with its
    options as keyword arguments (e.g. bits=4, residual=32), or a cache object built beforehand.
    ``compile=True`` (static cache only) runs every decode step through one ``torch.compile``'d
    program over fixed shapes (``kvlab/compiled.py``); the first use per model and length compiles
    and says so. The generator's return value (StopIteration.value) is the GenerationResult. Bad
    arguments raise here, when ``stream`` is called, before any token is computed.
    """
    prompt_ids = encode_prompt(model, prompt)
    check_generation_args(model, prompt_ids, cache, max_new_tokens, temperature, top_k, top_p, cache_options)
    step = None
    if compile:
        if cache != "static":
            raise ValueError(f"compile=True compiles the static cache's fixed-shape decode step; pass "
                             f"cache='static' (got cache={cache if isinstance(cache, str) else cache.name!r})")
        from .cache.static import FixedShapeStaticCache
        from .compiled import compiled_step

        cfg = model.config
        cache = FixedShapeStaticCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, batch=1, dtype=model.dtype,
                                      device=model.device,
                                      max_len=cache_options.get("max_len", len(prompt_ids) + max_new_tokens))
        step = compiled_step(model, compile_backend)
    elif isinstance(cache, str):
        if cache in ("static", "offloaded"):
            cache_options.setdefault("max_len", len(prompt_ids) + max_new_tokens)
        cache = make_cache(cache, model.config, batch=1, dtype=model.dtype, device=model.device, **cache_options)
    return _steps(model, prompt_ids, cache, max_new_tokens, temperature, top_k, top_p, seed, stop_tokens,
                  cache_options, step)


@torch.inference_mode()
def _steps(model: Decoder, prompt_ids: list[int], cache: KVCache, max_new_tokens: int, temperature: float,
           top_k: int | None, top_p: float | None, seed: int | None, stop_tokens: Sequence[int] | None,
           cache_options: dict, step=None) -> Iterator[TokenEvent]:
    """The generation loop behind ``stream``, on checked arguments: prefill, then one decode step per token.

    ``step``: a compiled decode step (``kvlab.compiled.CompiledDecodeStep``) over a fixed-shape cache, or None.
    """
    device = model.device
    stops = set(stop_tokens or ())
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    tok = model.tokenizer
    ids = torch.tensor([prompt_ids], device=device)  # (1, T)
    timeline = Timeline(prompt_tokens=len(prompt_ids))
    tokens: list[int] = []
    uncached = isinstance(cache, NoCache)
    stop_reason = "max_new_tokens"
    shape_key = None if step is None else (cache.max_len, cache.batch, cache.dtype, str(cache.device))
    compiled_before = step is not None and shape_key in step.compile_s  # this shape's program already built

    start = last = now(device)
    for i in range(max_new_tokens):
        if i == 0 or uncached:
            # No cache: every step reprocesses the prompt and every token generated so far.
            seq = ids if i == 0 else torch.cat([ids, torch.tensor([tokens], device=device)], dim=1)
            logits = prefill(model, seq, cache)  # (1, V)
            if step is not None:
                cache.sync()  # the fixed-shape cache's next slot follows the prompt
        elif step is not None:
            logits = step(next_tok[:, None], cache)  # (1, V): the compiled program, same shapes every token
        else:
            logits = decode_one_token(model, next_tok[:, None], cache)  # (1, V)
        next_tok = sample(logits, temperature, top_k, top_p, gen)  # (1,)
        token_id = int(next_tok.item())
        t = now(device)
        tokens.append(token_id)
        mem = cache.memory()
        moved = int(getattr(cache, "bytes_moved_last_step", 0))
        timeline.token_time_s.append(t - start)
        timeline.step_s.append(t - last)
        timeline.cache_bytes.append(mem.allocated_bytes)
        timeline.bytes_moved.append(moved)
        if i == 0:
            timeline.prefill_s = t - start
        last = t
        yield TokenEvent(index=i, token_id=token_id, text=tok.decode([token_id]) if tok else "",
                         time_s=t - start, step_s=timeline.step_s[-1], seq_len=len(prompt_ids) + i + 1,
                         cache_bytes=mem.allocated_bytes, bytes_moved=moved)
        if token_id in stops:
            stop_reason = "stop_token"
            break
    settings = dict(cache=cache.name, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                    top_p=top_p, seed=seed, stop_tokens=sorted(stops), device=str(device), dtype=str(model.dtype),
                    model=model.config.name, **{k: v for k, v in cache_options.items() if k != "storage_dir"})
    if step is not None:  # compile_s: seconds this call spent compiling (0 when it reused the program)
        settings.update(compiled=step.fallback is None, compile_backend=step.backend,
                        compile_s=0.0 if compiled_before else step.compile_s.get(shape_key),
                        compile_fallback=step.fallback)
    return GenerationResult(prompt_ids=prompt_ids, tokens=tokens, text=tok.decode(tokens) if tok else "",
                            timeline=timeline, cache=cache, stop_reason=stop_reason, settings=settings)


def generate(model: Decoder, prompt: str | Sequence[int] | torch.Tensor, cache: str | KVCache = "dynamic",
             max_new_tokens: int = 32, temperature: float = 0.0, top_k: int | None = None,
             top_p: float | None = None, seed: int | None = None, stop_tokens: Sequence[int] | None = None,
             compile: bool = False, compile_backend: str = "inductor", **cache_options) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens and return them with a per-token timeline.

    >>> result = generate(model, "Hello", cache="dynamic", max_new_tokens=20)
    >>> result.timeline.to_frame()   # one row per token: time, step duration, cache bytes
    >>> generate(model, "Hello", cache="static", compile=True).settings["compile_s"]   # seconds, first time only
    """
    it = stream(model, prompt, cache, max_new_tokens, temperature, top_k, top_p, seed, stop_tokens, compile,
                compile_backend, **cache_options)
    while True:
        try:
            next(it)
        except StopIteration as done:
            return done.value
