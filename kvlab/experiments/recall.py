"""Associative recall: key->value pairs, then a query for one key; the answer (its value) is checked exactly.

A context lists pairs, a query names one key, and the model must answer with that key's value:

    k3f:v9a;k1b:v2c;k07:v11;?k1b:   ->   v2c.

Keys are distinct within a context; which pair is queried is drawn uniformly, so the distance between the fact and the
query spans the whole context. Getting the value right means attending back, through the KV cache, to exactly one
earlier token: a cache that blurs keys or values shows up here as wrong answers. Prompts are plain text in the built-in
ByteTokenizer's format (one token per character), so they read as they are.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass

import pandas as pd
import torch

from kvlab.cache.base import KVCache
from kvlab.model.lessons import RECALL_MODEL_DIR, load_recall_model  # noqa: F401 (the task's model, loaded where the server loads it)
from kvlab.model.tokenizer import ByteTokenizer

PAIR = "k{key}:v{value};"  # one fact: 8 tokens
QUERY = "?k{key}:"  # the end of every prompt: 5 tokens
TERMINATOR = "."  # ends every answer; generation stops on it
PAIR_TOKENS, QUERY_TOKENS = 8, 5
NUM_KEYS = 256  # keys and values are two hex digits
ANSWER_TOKENS = 4  # "v", two hex digits, "."

_TOKENIZER = ByteTokenizer()


@dataclass(frozen=True)
class RecallExample:
    """One query over a context of ``num_pairs`` facts."""

    prompt: str  # the pairs, then "?k..:"
    answer: str  # "v..", then the terminator
    pair_index: int  # which pair is queried (0 = the first, farthest from the query)
    num_pairs: int
    distance: int  # tokens from the first token of the queried fact to the end of the prompt

    @property
    def prompt_ids(self) -> list[int]:
        return _TOKENIZER.encode(self.prompt)

    @property
    def answer_ids(self) -> list[int]:
        return _TOKENIZER.encode(self.answer)

    def to_dict(self) -> dict:
        return asdict(self)


def _check_pairs(num_pairs: int) -> None:
    if not isinstance(num_pairs, int) or not 1 <= num_pairs <= NUM_KEYS:
        raise ValueError(f"num_pairs must be an integer in [1, {NUM_KEYS}] (keys are distinct two-hex-digit "
                         f"names), got {num_pairs!r}")


def _context(rng: random.Random, num_pairs: int) -> tuple[list[int], list[int], str]:
    keys = rng.sample(range(NUM_KEYS), num_pairs)  # distinct keys
    values = [rng.randrange(NUM_KEYS) for _ in range(num_pairs)]  # values may repeat
    text = "".join(PAIR.format(key=f"{k:02x}", value=f"{v:02x}") for k, v in zip(keys, values))
    return keys, values, text


def make_examples(n: int, num_pairs: int, seed: int = 0) -> list[RecallExample]:
    """``n`` seeded examples, each a fresh context of ``num_pairs`` facts and one query (8 x pairs + 5 tokens)."""
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    _check_pairs(num_pairs)
    rng = random.Random(f"recall-{num_pairs}-{seed}")
    out = []
    for _ in range(n):
        keys, values, context = _context(rng, num_pairs)
        i = rng.randrange(num_pairs)  # uniform: distances cover the whole context
        prompt = context + QUERY.format(key=f"{keys[i]:02x}")
        out.append(RecallExample(prompt=prompt, answer=f"v{values[i]:02x}{TERMINATOR}", pair_index=i,
                                 num_pairs=num_pairs, distance=len(prompt) - PAIR_TOKENS * i))
    return out


def training_batch(batch: int, num_pairs: int, num_queries: int, rng: random.Random,
                   device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A batch of multi-query sequences for training: context, then ``num_queries`` answered queries.

    ``k3f:v9a;k1b:v2c;?k1b:v2c.?k3f:v9a.`` -- the first query has exactly the layout of a ``make_examples`` prompt; the
    later ones give more answers to learn from per context. Returns ids (B, T), targets (B, T) and is_answer (B, T).
    targets hold the next token where it is part of a query (its key's two digits, then the answer "v..") and -100
    elsewhere: the random context teaches nothing, while predicting a key's second digit from its first is the
    look-back-and-copy the answer needs.
    """
    _check_pairs(num_pairs)
    ids, targets, answer = [], [], []
    for _ in range(batch):
        keys, values, context = _context(rng, num_pairs)
        asked = rng.sample(range(num_pairs), min(num_queries, num_pairs))
        asked += [rng.randrange(num_pairs) for _ in range(num_queries - len(asked))]
        seq = _TOKENIZER.encode(context)
        tgt, ans = [-100] * len(seq), [False] * len(seq)
        for i in asked:
            query = _TOKENIZER.encode(QUERY.format(key=f"{keys[i]:02x}"))  # "?kxx:"
            value = _TOKENIZER.encode(f"v{values[i]:02x}{TERMINATOR}")  # "vyy."
            seq += query + value
            # position t predicts seq[t + 1]: "?" -> k, "k" -> x, x -> x, x -> ":", ":" -> v, v -> y, y -> y, y -> "."
            tgt += [-100, query[2], query[3], -100] + value + [-100]
            ans += [False] * 4 + [True] * 4 + [False]
        ids.append(seq[:-1])
        targets.append(tgt[:-1])
        answer.append(ans[:-1])
    return (torch.tensor(ids, device=device), torch.tensor(targets, device=device),  # (B, T) each
            torch.tensor(answer, device=device))


def distance_buckets(distances: pd.Series, num_pairs: int, buckets: int = 4) -> pd.Series:
    """Equal-width distance bins from the nearest to the farthest fact of a ``num_pairs`` context."""
    lo, hi = PAIR_TOKENS + QUERY_TOKENS, PAIR_TOKENS * num_pairs + QUERY_TOKENS
    edges = [lo - 1 + round((hi - lo + 1) * b / buckets) for b in range(buckets + 1)]
    return pd.cut(distances, bins=sorted(set(edges)), include_lowest=False)


@dataclass
class RecallScore:
    """Exact-match accuracy, overall and per distance bucket, with one row per example."""

    accuracy: float
    by_distance: pd.DataFrame  # distance_bucket, examples, correct, accuracy
    examples: pd.DataFrame  # one row per example: distance, pair_index, answer, output, correct
    settings: dict


def score(model, examples: list[RecallExample], cache: str | KVCache = "dynamic", buckets: int = 4,
          **cache_options) -> RecallScore:
    """Greedy exact-match accuracy of ``model`` on ``examples`` with the given cache setting.

    Each prompt goes through ``kvlab.generate`` (greedy, up to 4 new tokens, stopping at the terminator) with ``cache``
    and its options; an answer counts only if every token matches.
    """
    from kvlab.generate import generate

    if not examples:
        raise ValueError("score needs at least one example; make some with make_examples(n, num_pairs, seed)")
    if model.config.vocab_size < 256:  # every byte must be a token
        raise ValueError(f"the model's vocabulary ({model.config.vocab_size}) cannot hold byte tokens; "
                         "use a model trained on ByteTokenizer text, e.g. load_recall_model()")
    stop = _TOKENIZER.encode(TERMINATOR)
    rows = []
    for ex in examples:
        if not isinstance(cache, str):
            cache.reset()  # a cache object is reused: empty it for each question
        out = generate(model, ex.prompt_ids, cache=cache, max_new_tokens=ANSWER_TOKENS, stop_tokens=stop,
                       **cache_options)
        rows.append(dict(pair_index=ex.pair_index, num_pairs=ex.num_pairs, distance=ex.distance,
                         answer=ex.answer, output=_TOKENIZER.decode(out.tokens),
                         correct=out.tokens == ex.answer_ids))
    frame = pd.DataFrame(rows)
    num_pairs = int(frame["num_pairs"].max())
    frame["distance_bucket"] = distance_buckets(frame["distance"], num_pairs, buckets)
    by = (frame.groupby("distance_bucket", observed=False)["correct"]
          .agg(examples="size", correct="sum").reset_index())
    by["accuracy"] = by["correct"] / by["examples"].where(by["examples"] > 0)
    name = cache if isinstance(cache, str) else cache.name
    return RecallScore(accuracy=float(frame["correct"].mean()), by_distance=by, examples=frame,
                       settings=dict(cache=name, **cache_options, examples=len(examples)))
