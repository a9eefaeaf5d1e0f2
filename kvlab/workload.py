"""Workloads: which requests arrive, how long they are, and when.

A workload is a list of `Request`s, each with a prompt length, an output budget (`max_new_tokens`) and an arrival time
in seconds from the start. Lengths come from named *profiles*; arrival times from an *arrival process* (vLLM
`bench serve`'s set: all at once, constant, Poisson, Gamma with a burstiness factor); a replayed trace gives both
(``kvlab/traces.py``: the Azure and Mooncake formats). Everything is seeded: the same arguments give the same workload.

Default lengths are sized for a tiny CPU model with a 512-1024 token
context; `scale` multiplies them, `max_context` clips them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd


@dataclass
class Request:
    """One request to send: lengths in tokens, arrival in seconds from the start.

    `prompt` holds token ids when the workload was made with a vocabulary;
    `prefix_id` names the shared system prompt its first tokens come from.
    """

    request_id: int | str  # a workload numbers its requests; a server names them ("cmpl-...")
    prompt_tokens: int
    max_new_tokens: int
    arrival_s: float
    profile: str
    prompt: list[int] | None = None
    prefix_id: str | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.max_new_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens ({self.prompt_tokens}) and "
                             f"max_new_tokens ({self.max_new_tokens}) must be >= 1")
        if self.prompt is not None and len(self.prompt) != self.prompt_tokens:
            raise ValueError(f"request {self.request_id}: prompt has {len(self.prompt)} ids "
                             f"but prompt_tokens={self.prompt_tokens}")


@dataclass(frozen=True)
class Profile:
    """Uniform length ranges (inclusive, in tokens) for prompts and outputs."""

    name: str
    prompt_tokens: tuple[int, int]
    max_new_tokens: tuple[int, int]
    description: str


PROFILES = {p.name: p for p in (
    Profile("short_short", (16, 64), (8, 32), "chat turn: short question, short answer"),
    Profile("long_short", (256, 512), (8, 32), "summarise / RAG: long document in, short answer out"),
    Profile("long_gen", (16, 64), (128, 256), "writing / code: short instruction, long generation"))}
# "mixture": each request draws its profile with these weights. Most traffic is chat; long contexts are common (RAG);
# long generations are rarer but hold batch slots longest.
MIXTURE_WEIGHTS = {"short_short": 0.5, "long_short": 0.3, "long_gen": 0.2}
PROFILE_NAMES = (*PROFILES, "mixture")
ARRIVALS = ("all_at_once", "constant", "poisson", "gamma")


# -- validation: bad input is refused before any work --------------------------
def _check_n(n) -> None:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n={n!r} requests: need an integer >= 1")


def _check_rate(rate) -> None:
    if rate is None:
        raise ValueError("rate is required for this arrival process: "
                         "pass rate=<requests per second>, or arrival='all_at_once'")
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.number)) or math.isnan(rate) or rate <= 0:
        raise ValueError(f"rate={rate!r} requests/s: need a number > 0 (math.inf means all at once)")


def _check_burstiness(burstiness) -> None:
    if not isinstance(burstiness, (int, float, np.number)) or math.isnan(burstiness) or burstiness <= 0:
        raise ValueError(f"burstiness={burstiness!r}: need a number > 0 "
                         "(1 = Poisson, < 1 burstier, large = nearly constant)")


def _check_positive(name: str, value) -> None:
    if not isinstance(value, (int, float, np.number)) or math.isnan(value) or value <= 0:
        raise ValueError(f"{name}={value!r}: need a number > 0")


def _check_optional_int(name: str, value, minimum: int) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum):
        raise ValueError(f"{name}={value!r}: need an integer >= {minimum} (or None)")


def _rng(rng: np.random.Generator | int | None) -> np.random.Generator:
    return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)


# -- arrival processes: n arrival times in seconds, the first at 0 -------------
def all_at_once(n: int) -> np.ndarray:
    """Every request arrives at t = 0 (vLLM's rate = inf; a throughput test)."""
    _check_n(n)
    return np.zeros(n)


def constant(n: int, rate: float) -> np.ndarray:
    """One request every 1/rate seconds."""
    _check_n(n)
    _check_rate(rate)
    return np.arange(n) / rate


def gamma(n: int, rate: float, burstiness: float = 1.0, rng: np.random.Generator | int | None = 0) -> np.ndarray:
    """Gaps drawn from Gamma(shape=b, scale=1/(rate*b)), as in vLLM.

    The mean gap is 1/rate whatever b; the coefficient of variation of the
    gaps is 1/sqrt(b): b = 1 is Poisson, b < 1 burstier, b -> inf constant.
    """
    _check_n(n)
    _check_rate(rate)
    _check_burstiness(burstiness)
    if math.isinf(rate):
        return np.zeros(n)
    gaps = _rng(rng).gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def poisson(n: int, rate: float, rng: np.random.Generator | int | None = 0) -> np.ndarray:
    """Exponential gaps with mean 1/rate: independent arrivals (Gamma with b = 1)."""
    _check_n(n)
    _check_rate(rate)
    if math.isinf(rate):
        return np.zeros(n)
    gaps = _rng(rng).exponential(1.0 / rate, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def arrival_times(arrival: str, n: int, rate: float | None = None, burstiness: float = 1.0,
                  rng: np.random.Generator | int | None = 0) -> np.ndarray:
    """Dispatch to the arrival process named `arrival` (one of ARRIVALS)."""
    _check_arrival(arrival, rate, burstiness)
    if arrival == "all_at_once":
        return all_at_once(n)
    assert rate is not None  # _check_arrival raised otherwise
    if arrival == "constant":
        return constant(n, rate)
    if arrival == "poisson":
        return poisson(n, rate, rng)
    return gamma(n, rate, burstiness, rng)


def _check_arrival(arrival: str, rate, burstiness) -> None:
    if arrival not in ARRIVALS:
        raise ValueError(f"unknown arrival {arrival!r}; choose one of {', '.join(ARRIVALS)} "
                         "(or replay_trace(path) for a trace)")
    if arrival != "all_at_once":
        _check_rate(rate)
    if arrival == "gamma":
        _check_burstiness(burstiness)


# -- lengths ---------------------------------------------------------------------
def _fit(prompt: int, out: int, max_context: int | None, min_prompt: int = 1) -> tuple[int, int]:
    """Clip so prompt + out <= max_context: keep the output, cut the prompt.

    Output lengths drive the decode clocks, so they are kept; an output that
    alone would not fit is cut to leave `min_prompt` prompt tokens.
    """
    if max_context is None:
        return prompt, out
    out = min(out, max_context - min_prompt)
    return min(prompt, max_context - out), out


def make_workload(profile: str, n: int, arrival: str = "poisson", rate: float | None = None, burstiness: float = 1.0,
                  seed: int = 0, vocab_size: int | None = None, max_context: int | None = None, scale: float = 1.0,
                  shared_prefix_tokens: int = 0) -> list[Request]:
    """`n` seeded requests of `profile` arriving by `arrival` at `rate` requests/s.

    - `profile`: one of PROFILE_NAMES. Lengths are uniform in the profile's ranges times `scale`. In "mixture" each
      request draws its profile by MIXTURE_WEIGHTS, and `Request.profile` names the one drawn.
    - `arrival`: one of ARRIVALS; `rate` is needed unless "all_at_once"; `burstiness` is used by "gamma".
    - `vocab_size`: if given, each request gets `prompt` token ids drawn uniformly from [0, vocab_size). Lengths and
      arrivals do not depend on it.
    - `shared_prefix_tokens`: if > 0, every prompt starts with the same system prompt of that many tokens
      (`prefix_id="system"`), counted in `prompt_tokens`.
    - `max_context`: if given, prompt + max_new_tokens <= max_context; the output length is kept and the prompt is cut
      (never below the prefix).
    """
    if profile not in PROFILE_NAMES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILE_NAMES)}")
    _check_n(n)
    _check_arrival(arrival, rate, burstiness)
    _check_positive("scale", scale)
    _check_optional_int("vocab_size", vocab_size, 1)
    _check_optional_int("max_context", max_context, 2)
    _check_optional_int("shared_prefix_tokens", shared_prefix_tokens, 0)
    if max_context is not None and shared_prefix_tokens >= max_context:
        raise ValueError(f"shared_prefix_tokens ({shared_prefix_tokens}) leaves no room in "
                         f"max_context ({max_context}); lower it below max_context")

    # Separate streams, so e.g. adding a vocabulary does not change the arrivals.
    arrival_rng, length_rng, token_rng = _streams(seed)
    arrivals = arrival_times(arrival, n, rate, burstiness, arrival_rng)
    names = (length_rng.choice(list(MIXTURE_WEIGHTS), size=n, p=list(MIXTURE_WEIGHTS.values())).tolist()
             if profile == "mixture" else [profile] * n)

    def ranges(attr: str) -> tuple[np.ndarray, np.ndarray]:
        lo = np.array([getattr(PROFILES[p], attr)[0] for p in names]) * scale
        hi = np.array([getattr(PROFILES[p], attr)[1] for p in names]) * scale
        return np.maximum(1, np.round(lo)).astype(int), np.maximum(1, np.round(hi)).astype(int)

    prompt_lens = length_rng.integers(*ranges("prompt_tokens"), endpoint=True) + shared_prefix_tokens
    output_lens = length_rng.integers(*ranges("max_new_tokens"), endpoint=True)
    prefix = token_rng.integers(0, vocab_size, size=shared_prefix_tokens).tolist() if vocab_size else None

    requests = []
    for i in range(n):
        p, o = _fit(int(prompt_lens[i]), int(output_lens[i]), max_context, max(1, shared_prefix_tokens))
        ids = (prefix + token_rng.integers(0, vocab_size, size=p - shared_prefix_tokens).tolist()
               if vocab_size is not None else None)
        requests.append(Request(i, p, o, float(arrivals[i]), names[i], ids,
                                "system" if shared_prefix_tokens else None))
    return requests


def _streams(seed: int) -> tuple[np.random.Generator, ...]:
    """The arrival, length and token streams of a seed: one changes without moving the others."""
    return tuple(np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3))


def trace_rate(requests: list[Request]) -> float:
    """A workload's mean rate in requests/s: (n - 1) / (last arrival - first arrival); inf if all at once."""
    if not requests:
        raise ValueError("trace_rate needs at least one request")
    arrivals = [r.arrival_s for r in requests]
    window = max(arrivals) - min(arrivals)
    return (len(requests) - 1) / window if window > 0 else math.inf


def at_rate(requests: list[Request], rate: float) -> list[Request]:
    """The same requests with every arrival gap stretched or squeezed so they come at ``rate`` requests/s.

    This is ``time_scale`` = trace_rate / rate: the order, the bursts and the shares stay the trace's.
    """
    _check_positive("rate", rate)
    native = trace_rate(requests)
    if math.isinf(native):
        return list(requests)
    k = native / rate
    t0 = min(r.arrival_s for r in requests)
    return [dataclasses.replace(r, arrival_s=t0 + (r.arrival_s - t0) * k) for r in requests]


@dataclass(frozen=True)
class Workload:
    """Requests built once, timed at any offered rate: what a sweep sends at every level (only arrivals change).

    ``arrival`` "replay" stretches the requests' own gaps (``at_rate``: a trace keeps its order and bursts); one of
    ARRIVALS draws that process from ``seed``'s arrival stream, as ``make_workload`` would at that rate."""

    requests: tuple[Request, ...]
    name: str
    arrival: str = "poisson"
    burstiness: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arrival != "replay":
            _check_arrival(self.arrival, 1.0, self.burstiness)
        _check_n(len(self.requests))

    def at_rate(self, rate: float) -> list[Request]:
        """The requests arriving at ``rate`` requests/s."""
        if self.arrival == "replay":
            return at_rate(list(self.requests), rate)
        times = arrival_times(self.arrival, len(self.requests), rate, self.burstiness, _streams(self.seed)[0])
        return [dataclasses.replace(r, arrival_s=float(t)) for r, t in zip(self.requests, times)]


def profile_workload(profile: str, n: int, seed: int = 0, max_context: int | None = None, arrival: str = "poisson",
                     burstiness: float = 1.0) -> Workload:
    """``n`` requests of ``profile`` (``make_workload``'s lengths for ``seed``), to be timed at each rate."""
    requests = make_workload(profile, n, "all_at_once", seed=seed, max_context=max_context)
    return Workload(tuple(requests), profile, arrival, burstiness, seed)


# -- equal or mixed lengths with the same means: what batching policies are compared on ------------------
LENGTHS = ("equal", "mixed")
OUTPUT_SHAPES = ("even", "long_tail")
MIN_TAIL_OUTPUT = 4  # the shortest answer of a long-tailed mix


def long_tail(mean: int, n: int) -> np.ndarray:
    """``n`` output lengths shaped like chat answers: many short, a few long (the evenly spaced quantiles of an
    exponential distribution), scaled to total ``n`` x ``mean`` (up to rounding), at least ``MIN_TAIL_OUTPUT``."""
    q = (np.arange(n) + 0.5) / n
    x = -np.log(1 - q)  # (n,) quantiles of the exponential with mean 1, rising
    return np.maximum(MIN_TAIL_OUTPUT, np.round(x * mean * n / x.sum())).astype(int)


def policy_workload(vocab_size: int, lengths: str = "mixed", n: int = 12, prompt_tokens: int = 64,
                    max_new_tokens: int = 48, spread: float = 0.8,
                    arrivals: Sequence[float] | np.ndarray | None = None, seed: int = 0,
                    outputs: str = "even") -> list[Request]:
    """``n`` requests with equal lengths, or mixed lengths with the same means.

    "mixed": prompt lengths evenly spread over mean x (1 ± ``spread``); output lengths the same way
    (``outputs="even"``) or long-tailed like chat answers (``"long_tail"``: ``long_tail``); each shuffled
    (seeded), so both workloads ask for the same number of tokens (up to rounding). ``arrivals``: one arrival
    time per request (default: all at 0).
    """
    if lengths not in LENGTHS:
        raise ValueError(f"lengths={lengths!r}: choose one of {', '.join(LENGTHS)}")
    if outputs not in OUTPUT_SHAPES:
        raise ValueError(f"outputs={outputs!r}: choose one of {', '.join(OUTPUT_SHAPES)}")
    for name, value in (("n", n), ("prompt_tokens", prompt_tokens), ("max_new_tokens", max_new_tokens)):
        _check_optional_int(name, value, 1)
    if not 0 <= spread < 1:
        raise ValueError(f"spread must be in [0, 1): lengths range over mean x (1 ± spread); got {spread!r}")
    arrivals = [0.0] * n if arrivals is None else [float(a) for a in arrivals]
    if len(arrivals) != n:
        raise ValueError(f"arrivals has {len(arrivals)} times for n={n} requests; give one per request")
    rng = np.random.default_rng(seed)

    def spread_lengths(mean: int) -> np.ndarray:
        if lengths == "equal" or n == 1:
            return np.full(n, mean)
        return rng.permutation(np.maximum(1, np.round(np.linspace(mean * (1 - spread), mean * (1 + spread), n))))

    prompts = spread_lengths(prompt_tokens).astype(int)
    answers = (rng.permutation(long_tail(max_new_tokens, n)) if lengths == "mixed" and outputs == "long_tail" and n > 1
               else spread_lengths(max_new_tokens).astype(int))
    return [Request(i, int(p), int(o), arrivals[i], lengths, prompt=seeded_prompt(vocab_size, int(p), (seed, i)))
            for i, (p, o) in enumerate(zip(prompts, answers))]


def seeded_prompt(vocab_size: int, tokens: int, seed) -> list[int]:
    """``tokens`` random token ids from a seed (an int or a tuple of ints)."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=tokens).tolist()


def workload_frame(requests: list[Request]) -> pd.DataFrame:
    """One row per request (token ids left out), for tables and plots."""
    return pd.DataFrame([{"request_id": r.request_id, "profile": r.profile, "arrival_s": r.arrival_s,
                          "prompt_tokens": r.prompt_tokens, "max_new_tokens": r.max_new_tokens,
                          "prefix_id": r.prefix_id} for r in requests])
