"""Timed generation for one sequence: prefill, then decode steps, with a timeline of every token."""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Generator, Iterator, Sequence, cast

import pandas as pd
import torch

from kvlab.cache import KVCache, NoCache
from kvlab.cache.registry import FIXED_SHAPE, check_cache_options, make_cache, sized_options
from kvlab.cache.static import FixedShapeStaticCache
from kvlab.compiled import CompiledDecodeStep, compiled_step
from kvlab.device import now
from kvlab.model.decoder import Decoder
from kvlab.sampling import check_sampling, sample


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
        return pd.DataFrame({"token": range(n), "position": [self.prompt_tokens + i for i in range(n)],
                             "time_s": self.token_time_s, "step_ms": [s * 1e3 for s in self.step_s],
                             "phase": ["prefill"] + ["decode"] * (n - 1), "cache_bytes": self.cache_bytes,
                             "bytes_moved": self.bytes_moved})

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


@dataclass(frozen=True)
class GenerationConfig:
    """The settings of one generation, apart from the cache; checked once, when it is built.

    ``generate(model, prompt, max_new_tokens=64, temperature=0.8)`` builds one from its keyword
    arguments; ``generate(model, prompt, config=GenerationConfig(...))`` passes one ready-made.
    """

    max_new_tokens: int = 32
    temperature: float = 0.0  # 0: greedy (argmax); above 0: sampling (seeded by ``seed``)
    top_k: int | None = None  # sample among the k most likely tokens only
    top_p: float | None = None  # sample among the smallest set of tokens whose probability reaches top_p
    seed: int | None = None  # the sampler's seed (None: torch's global generator)
    stop_tokens: tuple[int, ...] = ()  # generation ends after any of these (the stop token is kept)
    compile: bool = False  # decode steps through one torch.compile'd program over a fixed-shape cache
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop_tokens", tuple(self.stop_tokens or ()))
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        check_sampling(self.temperature, self.top_k, self.top_p)


SETTINGS: tuple[str, ...] = tuple(f.name for f in fields(GenerationConfig))


def split_settings(config: GenerationConfig | None, kwargs: dict) -> tuple[GenerationConfig, dict]:
    """``generate``'s keyword arguments -> (the generation settings, checked; the cache's options)."""
    if config is not None and not isinstance(config, GenerationConfig):
        raise TypeError(f"config= takes a GenerationConfig, got {type(config).__name__}")
    settings = {k: v for k, v in kwargs.items() if k in SETTINGS}
    options = {k: v for k, v in kwargs.items() if k not in SETTINGS}
    return (GenerationConfig(**settings) if config is None else replace(config, **settings)), options


def check_generation(model: Decoder, prompt_ids: list[int], cache: str | KVCache, config: GenerationConfig,
                     cache_options: dict | None = None) -> None:
    """Every check that needs the model, the prompt or the cache, done before any work (the settings
    alone were checked when ``config`` was built)."""
    cache_options = cache_options or {}
    total = len(prompt_ids) + config.max_new_tokens
    if total > model.config.max_position_embeddings:
        raise ValueError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({config.max_new_tokens}) = {total} exceeds "
                         f"the model's context of {model.config.max_position_embeddings} tokens; "
                         "shorten the prompt or lower max_new_tokens")
    if isinstance(cache, str):
        check_cache_options(cache, cache_options)
        name, cap = cache, cache_options.get("max_len")
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
        name, cap = cache.name, getattr(cache, "max_len", None)
    if cap is not None and total > cap:
        raise ValueError(f"{name} cache holds {cap} tokens but prompt ({len(prompt_ids)}) + max_new_tokens "
                         f"({config.max_new_tokens}) = {total}; raise max_len or lower max_new_tokens")
    if config.compile and not (isinstance(cache, str) and cache in FIXED_SHAPE):
        names = " or ".join(FIXED_SHAPE)
        choices = " or ".join(f"cache={n!r}" for n in FIXED_SHAPE)
        raise ValueError(f"compile=True compiles the {names} cache's fixed-shape decode step; pass {choices} "
                         f"(got cache={cache if isinstance(cache, str) else cache.name!r})")


# -- the phases (gpt-fast's names): prefill, one decode step, and a decode loop per path -------------------

def prefill(model: Decoder, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run the whole prompt (1, T) through the model, filling the cache. -> last logits (1, V)."""
    return model(ids, cache, last_only=True)[:, -1]


def decode_one_token(model: Decoder, token: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Run one new token (1, 1) against the stored history. -> logits (1, V)."""
    return model(token, cache, last_only=True)[:, -1]


class TokenLog:
    """What one generation has produced so far: its tokens, its timeline, and whether to go on.

    ``take(logits)`` ends a step: it samples the step's token, stamps the clock (a step's time
    includes its sampling) and returns the TokenEvent. The clock starts when the log is made,
    just before the prefill; the time a streaming caller spends between tokens falls in the next step.
    """

    def __init__(self, model: Decoder, prompt_tokens: int, cache: KVCache, config: GenerationConfig) -> None:
        self.device, self.tokenizer, self.cache, self.config = model.device, model.tokenizer, cache, config
        self.stops = set(config.stop_tokens)
        self.generator = torch.Generator().manual_seed(config.seed) if config.seed is not None else None
        self.timeline = Timeline(prompt_tokens=prompt_tokens)
        self.tokens: list[int] = []
        self.next_token: torch.Tensor | None = None  # (1,): the last sampled token, the next step's input
        self.stop_reason = "max_new_tokens"
        self.start = self.last = now(self.device)

    def more(self) -> bool:
        """Whether another decode step runs: fewer than max_new_tokens so far and no stop token."""
        return len(self.tokens) < self.config.max_new_tokens and self.stop_reason != "stop_token"

    def take(self, logits: torch.Tensor) -> TokenEvent:
        """Sample the token of this step's logits (1, V), time the step and record it."""
        c = self.config
        self.next_token = sample(logits, c.temperature, c.top_k, c.top_p, self.generator)  # (1,)
        token_id, t, i, tl = int(self.next_token.item()), now(self.device), len(self.tokens), self.timeline
        self.tokens.append(token_id)
        mem = self.cache.memory()
        moved = int(getattr(self.cache, "bytes_moved_last_step", 0))
        tl.token_time_s.append(t - self.start)
        tl.step_s.append(t - self.last)
        tl.cache_bytes.append(mem.allocated_bytes)
        tl.bytes_moved.append(moved)
        if i == 0:
            tl.prefill_s = t - self.start
        self.last = t
        if token_id in self.stops:
            self.stop_reason = "stop_token"
        return TokenEvent(index=i, token_id=token_id, text=self.tokenizer.decode([token_id]) if self.tokenizer else "",
                          time_s=t - self.start, step_s=tl.step_s[-1], seq_len=tl.prompt_tokens + i + 1,
                          cache_bytes=mem.allocated_bytes, bytes_moved=moved)


def decode_n_tokens_uncached(model: Decoder, ids: torch.Tensor, cache: KVCache, log: TokenLog) -> Iterator[TokenEvent]:
    """No cache: every step reprocesses the prompt (1, T) and every token generated so far."""
    while log.more():
        seq = torch.cat([ids, torch.tensor([log.tokens], device=ids.device)], dim=1)  # (1, T + tokens so far)
        yield log.take(prefill(model, seq, cache))  # (1, V)


def decode_n_tokens_compiled(step: CompiledDecodeStep, cache: FixedShapeStaticCache,
                             log: TokenLog) -> Iterator[TokenEvent]:
    """Each token through the compiled program over the fixed-shape cache: the same shapes every token."""
    while log.more():
        assert log.next_token is not None  # set by the prefill's take
        yield log.take(step(log.next_token[:, None], cache))  # (1, V)


def decode_n_tokens(model: Decoder, cache: KVCache, log: TokenLog) -> Iterator[TokenEvent]:
    """Each token (1, 1) run eagerly against the stored history."""
    while log.more():
        assert log.next_token is not None  # set by the prefill's take
        yield log.take(decode_one_token(model, log.next_token[:, None], cache))  # (1, V)


# -- the entry points -------------------------------------------------------------------------------------

def stream(model: Decoder, prompt: str | Sequence[int] | torch.Tensor, cache: str | KVCache = "dynamic",
           config: GenerationConfig | None = None, **settings_and_cache_options) -> Iterator[TokenEvent]:
    """Generate token by token, yielding a TokenEvent as each token is ready.

    ``cache`` is a strategy name ("none", "dynamic", "static", "quantized", "offloaded") with its options as keyword
    arguments (e.g. bits=4, residual=32), or a cache object built beforehand. The other keyword arguments are the
    settings (``GenerationConfig``'s fields), or pass ``config``. ``compile=True`` (static cache only) runs every
    decode step through one ``torch.compile``'d program over fixed shapes (``kvlab/compiled.py``); the first use per
    model and length compiles and says so. The generator's return value (StopIteration.value) is the
    GenerationResult. Bad arguments raise here, when ``stream`` is called, before any token is computed.
    """
    prompt_ids = encode_prompt(model, prompt)
    config, cache_options = split_settings(config, settings_and_cache_options)
    check_generation(model, prompt_ids, cache, config, cache_options)
    if isinstance(cache, str):  # the registry sizes a preallocating strategy to prompt + max_new_tokens
        cache_options = sized_options(cache, cache_options, len(prompt_ids) + config.max_new_tokens)
        cache = make_cache(cache, model.config, batch=1, dtype=model.dtype, device=model.device,
                           fixed_shape=config.compile, **cache_options)
    step = compiled_step(model, config.compile_backend) if config.compile else None
    return _generation(model, prompt_ids, cache, config, cache_options, step)


@torch.inference_mode()
def _generation(model: Decoder, prompt_ids: list[int], cache: KVCache, config: GenerationConfig, cache_options: dict,
                step: CompiledDecodeStep | None) -> Generator[TokenEvent, None, GenerationResult]:
    """Behind ``stream``, on checked arguments: the prefill, then this path's decode loop; returns the result."""
    ids = torch.tensor([prompt_ids], device=model.device)  # (1, T)
    fixed = cast(FixedShapeStaticCache, cache)  # read only with a step: stream then built the fixed-shape cache
    shape_key: tuple = () if step is None else (fixed.max_len, fixed.batch, fixed.dtype, str(fixed.device))
    compiled_before = step is not None and shape_key in step.compile_s  # this shape's program already built
    log = TokenLog(model, len(prompt_ids), cache, config)

    logits = prefill(model, ids, cache)  # (1, V): step 0, the first token
    if step is not None:
        fixed.sync()  # the fixed-shape cache's next slot follows the prompt
    yield log.take(logits)
    if isinstance(cache, NoCache):
        yield from decode_n_tokens_uncached(model, ids, cache, log)
    elif step is not None:
        yield from decode_n_tokens_compiled(step, fixed, log)
    else:
        yield from decode_n_tokens(model, cache, log)

    settings = dict(cache=cache.name, max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                    top_k=config.top_k, top_p=config.top_p, seed=config.seed, stop_tokens=sorted(log.stops),
                    device=str(model.device), dtype=str(model.dtype), model=model.config.name,
                    **{k: v for k, v in cache_options.items() if k != "storage_dir"})
    if step is not None:  # compile_s: seconds this call spent compiling (0 when it reused the program)
        settings.update(compiled=step.fallback is None, compile_backend=step.backend,
                        compile_s=0.0 if compiled_before else step.compile_s.get(shape_key),
                        compile_fallback=step.fallback)
    tok = model.tokenizer
    return GenerationResult(prompt_ids=prompt_ids, tokens=log.tokens, text=tok.decode(log.tokens) if tok else "",
                            timeline=log.timeline, cache=cache, stop_reason=log.stop_reason, settings=settings)


def generate(model: Decoder, prompt: str | Sequence[int] | torch.Tensor, cache: str | KVCache = "dynamic",
             config: GenerationConfig | None = None, **settings_and_cache_options) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens and return them with a per-token timeline.

    Keyword arguments are the settings (``GenerationConfig``'s fields) and the cache's options, as in ``stream``.

    >>> result = generate(model, "Hello", cache="dynamic", max_new_tokens=20)
    >>> result.timeline.to_frame()   # one row per token: time, step duration, cache bytes
    >>> generate(model, "Hello", cache="static", compile=True).settings["compile_s"]   # seconds, first time only
    """
    it = stream(model, prompt, cache, config, **settings_and_cache_options)
    while True:
        try:
            next(it)
        except StopIteration as done:
            return done.value


__all__ = ["GenerationConfig", "GenerationResult", "Timeline", "TokenEvent", "check_generation", "decode_one_token",
           "encode_prompt", "generate", "prefill", "stream"]
