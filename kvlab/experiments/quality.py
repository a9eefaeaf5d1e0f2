"""Cache precision vs exact: token agreement, KL divergence, recall accuracy and perplexity.

Every measure compares a cache setting with the exact (dynamic) cache on the same model and the same inputs.
Distributions are compared teacher-forced: both caches see the prompt, then the exact cache's own greedy continuation
fed one token at a time, so step i of one run and step i of the other predict the same position from the same tokens;
only what the cache stored differs.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence, cast

import pandas as pd
import torch

from kvlab.cache import KVCache, NoCache, check_cache_options, make_cache
from kvlab.generate import decode_one_token, encode_prompt, generate, prefill
from kvlab.model.decoder import Decoder

EXACT = "dynamic"


def describe_cache(cache: str | KVCache, options: dict) -> str:
    """A short label: ``quantized(bits=4, residual=32)``."""
    name = cache if isinstance(cache, str) else cache.name
    opts = ", ".join(f"{k}={v}" for k, v in options.items() if k != "storage_dir")
    return f"{name}({opts})" if opts else name


def _fresh_cache(model: Decoder, cache: str | KVCache, tokens: int, options: dict) -> KVCache:
    """An empty cache for ``tokens`` tokens: built from a name and options, or the object passed, reset."""
    if isinstance(cache, KVCache):
        cache.reset()
        return cache
    opts = dict(options)
    if cache in ("static", "offloaded"):
        opts.setdefault("max_len", tokens)
    return make_cache(cache, model.config, batch=1, dtype=model.dtype, device=model.device, **opts)


def _check(model: Decoder, cache: str | KVCache, tokens: int, options: dict) -> None:
    if isinstance(cache, str):
        check_cache_options(cache, options)
    elif options:
        raise ValueError(f"cache options {sorted(options)} were given with a cache object ({cache.name}); "
                         "pass a strategy name with its options, or a configured cache object alone")
    limit = model.config.max_position_embeddings
    if tokens > limit:
        raise ValueError(f"{tokens} tokens exceed the model's context of {limit}; use a shorter text or prompt")


@torch.inference_mode()
def teacher_forced_logits(model: Decoder, prompt: str | Sequence[int], continuation: Sequence[int],
                          cache: str | KVCache = EXACT, **cache_options) -> torch.Tensor:
    """Next-token logits (N, V) for each of the N continuation tokens, fed one at a time through ``cache``.

    Row 0 comes from the prefill of ``prompt`` (it predicts continuation[0]); row i from the decode step that fed
    continuation[i-1]. With ``cache="none"`` the whole sequence goes through one uncached forward: the oracle the cached
    runs must reproduce.
    """
    prompt_ids, cont = encode_prompt(model, prompt), list(continuation)
    if not cont:
        raise ValueError("continuation is empty: give at least one token to predict")
    _check(model, cache, len(prompt_ids) + len(cont), cache_options)
    device = model.device
    store = _fresh_cache(model, cache, len(prompt_ids) + len(cont), cache_options)
    if isinstance(store, NoCache):
        seq = torch.tensor([prompt_ids + cont[:-1]], device=device)  # (1, T + N - 1)
        return model(seq, store)[0, len(prompt_ids) - 1:].float()  # (N, V)
    rows = [prefill(model, torch.tensor([prompt_ids], device=device), store)]  # (1, V)
    rows += [decode_one_token(model, torch.tensor([[tok]], device=device), store) for tok in cont[:-1]]  # (1, V)
    return torch.cat(rows).float()  # (N, V)


def compare_distributions(exact_logits: torch.Tensor, approx_logits: torch.Tensor) -> pd.DataFrame:
    """Per position: KL(exact || approx) in nats and whether the top-1 tokens agree. Logits (N, V) each."""
    if exact_logits.shape != approx_logits.shape:
        raise ValueError(f"logits shapes differ: exact {tuple(exact_logits.shape)} vs approx "
                         f"{tuple(approx_logits.shape)}; compare runs over the same positions")
    log_p = exact_logits.double().log_softmax(-1)  # (N, V)
    log_q = approx_logits.double().log_softmax(-1)  # (N, V)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)  # (N,)
    return pd.DataFrame({
        "position": range(exact_logits.size(0)),
        "kl": kl.clamp_min(0.0).tolist(),  # exact math is >= 0; clamp rounding below it
        "exact_top1": exact_logits.argmax(-1).tolist(),
        "approx_top1": approx_logits.argmax(-1).tolist(),
    }).assign(top1_agree=lambda f: f.exact_top1 == f.approx_top1)


@dataclass
class QualityReport:
    """How far one cache setting's outputs are from the exact cache's, on one prompt (or several)."""

    setting: str
    positions: int  # teacher-forced positions compared
    kl_mean: float  # mean over positions of KL(exact || approx), nats
    kl_max: float
    top1_agreement: float  # fraction of positions whose argmax tokens agree (teacher-forced)
    greedy_prefix_agreement: float  # free-running: fraction of tokens generated before the first divergence
    greedy_agreement: float  # free-running: fraction of positions with equal tokens
    first_divergence: int | None  # index of the first differing token (None: none differ)
    per_position: pd.DataFrame | None = field(repr=False, default=None)  # one row per compared position

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "per_position"}


def _greedy(model: Decoder, prompt_ids: list[int], cache, n: int, stop_tokens, options: dict) -> list[int]:
    if isinstance(cache, KVCache):
        cache.reset()
    return generate(model, prompt_ids, cache=cache, max_new_tokens=n, stop_tokens=stop_tokens, **options).tokens


def compare_to_exact(model: Decoder, prompts: str | Sequence[int] | Sequence[str | Sequence[int]],
                     cache: str | KVCache, max_new_tokens: int = 32, stop_tokens: Sequence[int] | None = None,
                     **cache_options) -> QualityReport:
    """Greedy agreement, KL and top-1 agreement of ``cache`` against the exact cache on the same prompts.

    For each prompt: both caches generate greedily and freely (agreement counts positions of the exact run's tokens, a
    missing token counting as a disagreement); then both are teacher-forced on the prompt plus the exact run's tokens,
    and their next-token distributions are compared. Several prompts pool their positions.
    """
    single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], int))
    prompt_list = cast("list[str | Sequence[int]]", [prompts] if single else list(prompts))  # one prompt each
    if not prompt_list:
        raise ValueError("no prompts given; pass a prompt or a list of prompts")
    if isinstance(cache, str):
        check_cache_options(cache, cache_options)
    frames: list[pd.DataFrame] = []
    equal_all: list[list[bool]] = []
    prefix_all: list[int] = []
    first: int | None = None
    for p_idx, prompt in enumerate(prompt_list):
        ids = encode_prompt(model, prompt)
        _check(model, cache, len(ids) + max_new_tokens, cache_options)
        exact = _greedy(model, ids, EXACT, max_new_tokens, stop_tokens, {})
        approx = _greedy(model, ids, cache, max_new_tokens, stop_tokens, cache_options)
        equal = [i < len(approx) and approx[i] == t for i, t in enumerate(exact)]
        diverge = equal.index(False) if False in equal else None
        if diverge is not None and first is None:
            first = sum(len(e) for e in equal_all) + diverge  # counted over the pooled positions
        equal_all.append(equal)
        prefix_all.append(len(equal) if diverge is None else diverge)
        f = compare_distributions(teacher_forced_logits(model, ids, exact, EXACT),
                                  teacher_forced_logits(model, ids, exact, cache, **cache_options))
        frames.append(f.assign(prompt=p_idx, token=exact))
    per = pd.concat(frames, ignore_index=True)
    n = sum(len(e) for e in equal_all)
    return QualityReport(
        setting=describe_cache(cache, cache_options), positions=len(per),
        kl_mean=float(per["kl"].mean()), kl_max=float(per["kl"].max()),
        top1_agreement=float(per["top1_agree"].mean()),
        greedy_prefix_agreement=sum(prefix_all) / n, greedy_agreement=sum(map(sum, equal_all)) / n,
        first_divergence=first, per_position=per)


def recall_accuracy(model: Decoder, examples, cache: str | KVCache = EXACT, buckets: int = 4,
                    **cache_options) -> pd.DataFrame:
    """Recall accuracy by distance bucket for ``cache`` beside the exact cache's, one row per bucket.

    Columns: distance_bucket, examples, accuracy, exact_accuracy, setting. ``examples`` come from
    ``kvlab.experiments.recall.make_examples``; use the shipped model (``load_recall_model()``).
    """
    from kvlab.experiments.recall import score

    got = score(model, examples, cache, buckets, **cache_options).by_distance
    ref = score(model, examples, EXACT, buckets).by_distance
    return got.assign(exact_accuracy=ref["accuracy"].values,
                      setting=describe_cache(cache, cache_options))[
        ["setting", "distance_bucket", "examples", "accuracy", "exact_accuracy"]]


@dataclass
class Perplexity:
    """Perplexity of a text under one cache setting: exp(mean negative log-likelihood per token)."""

    setting: str
    tokens: int  # tokens scored (the text minus its context tokens)
    nll: float  # mean negative log-likelihood, nats per token
    perplexity: float

    def to_dict(self) -> dict:
        return asdict(self)


def perplexity(model: Decoder, text: str | Sequence[int], cache: str | KVCache = EXACT, context_tokens: int = 1,
               max_tokens: int | None = None, **cache_options) -> Perplexity:
    """Perplexity of ``text`` through ``cache``: the first ``context_tokens`` are prefilled, every later
    token is predicted and then fed one at a time, so each prediction reads the cache's stored history.

    Works for any kvlab model; ``max_tokens`` truncates the text.
    """
    ids = encode_prompt(model, text)
    if max_tokens is not None:
        ids = ids[:max_tokens]
    if not 1 <= context_tokens < len(ids):
        raise ValueError(f"context_tokens must be in [1, {len(ids) - 1}] for a text of {len(ids)} tokens, "
                         f"got {context_tokens}; use a longer text or fewer context tokens")
    logits = teacher_forced_logits(model, ids[:context_tokens], ids[context_tokens:], cache, **cache_options)
    target = torch.tensor(ids[context_tokens:], device=logits.device)  # (N,)
    nll = torch.nn.functional.cross_entropy(logits.double(), target).item()
    return Perplexity(setting=describe_cache(cache, cache_options), tokens=len(target), nll=nll,
                      perplexity=math.exp(nll))


__all__ = ["Perplexity", "QualityReport", "compare_distributions", "compare_to_exact", "describe_cache",
           "perplexity", "recall_accuracy", "teacher_forced_logits"]
