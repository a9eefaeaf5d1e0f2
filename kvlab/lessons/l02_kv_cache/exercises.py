"""Exercises of notebook 02 (the KV cache): checkers, their questions and folded solutions."""
from __future__ import annotations

import functools
import math
import re
from typing import Any

import torch

from kvlab.cache.base import CacheMemory, KVCache, kv_cache_bytes, tensor_bytes
from kvlab.generate import generate
from kvlab.model.config import tiny_llama
from kvlab.model.decoder import Decoder
from kvlab.model.tokenizer import ByteTokenizer
from kvlab.experiments.memory import GIB, max_sequences, resolve_config
from kvlab.lessons.common.exercises import Feedback, exercise, check_number, multiple_choice, right, method_source, solution_code, wrong, _is_number


def _kv_bytes(model: str, tokens: int, batch: int = 1, bytes_per_element: float = 2, kv_heads: int | None = None) -> int:
    cfg = resolve_config(model)
    heads = cfg.num_kv_heads if kv_heads is None else kv_heads
    return int(kv_cache_bytes(cfg.num_layers, heads, cfg.head_dim, tokens, batch, bytes_per_element))


@exercise("02_kv_cache.ipynb", solution=2 * 32 * 8 * 128 * 8192 * 2, wrong=2 * 32 * 32 * 128 * 8192 * 2,
          title='the formula by hand',
          question="""How many bytes of KV cache does **Llama-3-8B (GQA)** need for one conversation of 8,192 tokens
with an fp16 cache? Use the formula above with the numbers in
`kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]` (`num_layers`, `num_kv_heads`, `head_dim`), not
`kv_cache_bytes` itself.""",
          code="""answer = None   # a number of bytes
check_kv_bytes(answer)""",
          explanation="""```python
c = kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]
answer = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 8192 * 1 * 2   # 1,073,741,824 bytes = 1 GiB
```
The 2 counts K and V; `num_kv_heads` is 8, not the 32 query heads, thanks to grouped-query attention;
fp16 takes 2 bytes per element.""")
def check_kv_bytes(answer: Any) -> Feedback:
    """Bytes of KV cache for Llama-3-8B (GQA) holding one sequence of 8,192 tokens in fp16."""
    model, tokens = "Llama-3-8B (GQA)", 8192
    expected = _kv_bytes(model, tokens)
    cfg = resolve_config(model)
    return check_number(
        answer, expected, what="the KV cache of Llama-3-8B at 8,192 tokens (fp16, batch 1)",
        mistakes=[(expected / GIB, "that looks like GiB; the question asks for bytes (1 GiB = 2**30 bytes)."),
                  (_kv_bytes(model, tokens, kv_heads=cfg.num_heads),
                   f"you used the {cfg.num_heads} query heads. With grouped-query attention only the "
                   f"{cfg.num_kv_heads} key/value heads are stored: that is the whole point of GQA."),
                  (expected / 2, "half the right value: did you count the K and the V (the factor 2)?"),
                  (_kv_bytes(model, tokens, bytes_per_element=4),
                   "that is fp32 (4 bytes per element); fp16 takes 2 bytes."),
                  (_kv_bytes(model, tokens, bytes_per_element=1),
                   "that is 1 byte per element (int8); fp16 takes 2 bytes.")],
        hint="bytes = 2 × layers × kv_heads × head_dim × tokens × batch × bytes_per_element; read the "
             "numbers from kvlab.PUBLISHED_CONFIGS['Llama-3-8B (GQA)'].",
        confirm=f"2 × {cfg.num_layers} × {cfg.num_kv_heads} × {cfg.head_dim} × {tokens:,} × 1 × 2 = "
                f"{expected:,} bytes, exactly {expected / GIB:g} GiB for one conversation.")


@exercise("02_kv_cache.ipynb", solution=max_sequences("Llama-3-8B (GQA)", 32768, 80), wrong=20,
          title='conversations per GPU',
          question="""Weights and cache in fp16, one GPU with `80 GiB` of memory: how many conversations of 32,768
tokens of Llama-3-8B fit at once? The weights take `num_parameters() * 2` bytes, and a GiB is
`2**30` bytes. Ignore everything else a real server keeps in memory.""",
          code="""answer = None   # a whole number of sequences
check_sequences_that_fit(answer)""",
          explanation="""```python
c = kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]
per_sequence = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 32768 * 2
answer = (80 * 2**30 - c.num_parameters() * 2) // per_sequence
```
Each conversation holds `4 GiB` of cache, and the fp16 weights leave about `65 GiB` of the `80`.
`kvlab.experiments.memory.max_sequences("Llama-3-8B (GQA)", 32768, 80)` does the same count.""")
def check_sequences_that_fit(answer: Any) -> Feedback:
    """How many 32K-token sequences of Llama-3-8B (fp16 weights and cache) fit in an 80 GiB GPU?"""
    model, context, gpu = "Llama-3-8B (GQA)", 32768, 80
    expected = max_sequences(model, context, gpu)
    per_seq = _kv_bytes(model, context)
    cfg = resolve_config(model)
    if _is_number(answer) and not float(answer).is_integer():
        return wrong("a number of whole sequences: round down, since a sequence that does not fit "
                     "completely cannot be served.")
    return check_number(
        answer, expected, what="sequences of 32,768 tokens that fit", rel=0,
        mistakes=[(math.floor(gpu * GIB / per_seq), "that leaves no room for the weights: the fp16 weights "
                   "of an 8B model take about 15 GiB of the 80 before any cache is stored."),
                  (math.ceil((gpu * GIB - cfg.num_parameters() * 2) / per_seq),
                   "rounded up: the last sequence would not fit completely. Round down.")],
        hint="memory left for the cache = 80 GiB − parameters × 2 bytes; divide by one sequence's KV bytes "
             "and round down (kvlab.experiments.memory.max_sequences does exactly this).",
        confirm=f"{expected} sequences: each holds {per_seq / GIB:g} GiB of cache. At 32K tokens the cache, "
                "not the weights, decides how many conversations one GPU can hold.")


check_what_the_cache_keeps = multiple_choice(
    "02_kv_cache.ipynb", "check_what_the_cache_keeps",
    title='what the cache keeps',
    stem="""Two users send exactly the same prompt, one after the other, to a server whose only cache is the KV
cache of each running request (no prefix caching, notebook 08). What does the first request's KV cache
do for the second?""",
    options={
        "a": ("nothing: the first request's keys and values were freed when its own generation ended;", None),
        "b": ("its answer comes back at once: the server finds the same prompt in the cache and skips the model;",
              "a KV cache holds the keys and values of one ongoing generation, not answers, and nothing on this "
              "server looks prompts up. Every answer is generated token by token."),
        "c": ("the same answer comes back: the cache stores the sampled tokens, and the second run reads them;",
              "the cache holds keys and values, not the sampled tokens, and it was freed when the first generation "
              "ended; with sampling the second answer can differ, and it is generated token by token either way."),
        "d": ("the second one decodes faster: its attention reads keys and values the first one stored.",
              "the second request computes its own keys and values from its own prompt: the first request's were "
              "freed when it ended. Keeping them for later requests is prefix caching (notebook 08), which this "
              "server does not do."),
    },
    correct="a",
    confirm="the KV cache is the working memory of one generation. A server with prefix caching "
            "(notebook 08) can reuse the keys and values of a shared prompt prefix and skip part of the "
            "prefill, but every token of the answer is still generated.",
    explanation="""```python
answer = "a"
```
A KV cache is the working memory of one generation, not a cache of responses. Servers with
**prefix caching** (notebook 08) can keep the keys and values of a shared prompt prefix for later
requests and skip part of their prefill; every token of every answer is still generated.""")


# -- exercise: write the cache ------------------------------------------------------------------------
# The learner fills in ``update`` and ``seq_len`` of a skeleton KVCache; the checker generates with it
# and with no cache at all, token for token, and probes update/seq_len directly to name the slip.

MY_CACHE_PROMPT, MY_CACHE_TOKENS = "The cache keeps", 16


class SolutionCache(KVCache):
    """The reference answer of 'write the cache': per layer, K and V tensors that grow along the token axis."""

    name = "mine"

    def __init__(self, num_layers, num_kv_heads, head_dim, batch=1, dtype=torch.float32, device="cpu"):
        super().__init__(num_layers, num_kv_heads, head_dim, batch, dtype, device)
        self.keys = [None] * num_layers  # keys[layer]: (batch, kv_heads, tokens, head_dim), None while empty
        self.values = [None] * num_layers

    def update(self, layer_idx, k, v):
        if self.keys[layer_idx] is None:                  # this layer's first tokens: the prompt
            self.keys[layer_idx], self.values[layer_idx] = k, v
        else:                                             # dim 2 is the tokens
            self.keys[layer_idx] = torch.cat([self.keys[layer_idx], k], dim=2)
            self.values[layer_idx] = torch.cat([self.values[layer_idx], v], dim=2)
        return self.keys[layer_idx], self.values[layer_idx]

    @property
    def seq_len(self):
        return 0 if self.keys[-1] is None else self.keys[-1].size(2)

    def reset(self):
        self.keys, self.values = [None] * self.num_layers, [None] * self.num_layers

    def memory(self):
        n = tensor_bytes(*self.keys, *self.values)
        return CacheMemory(allocated_bytes=n, used_bytes=n, reserved_bytes=0, device_bytes=n)


class OnlyNewKeysCache(SolutionCache):
    """A slip: stores the new keys and values but hands back only them (the registered wrong answer)."""

    def update(self, layer_idx, k, v):
        super().update(layer_idx, k, v)
        return k, v


@functools.lru_cache(maxsize=1)
def _cache_model():
    """The tiny Llama with random weights drawn ten times larger than build_model's (std 0.2, not 0.02).

    With std 0.02 attention is nearly uniform and the positions hardly matter, so a cache that loses the position offset
    still writes the same tokens; at 0.2 every slip the checker names changes them (tests/test_exercises_build.py).
    """
    model = Decoder(tiny_llama()).init_weights(seed=0, std=0.2).eval()
    model.tokenizer = ByteTokenizer()
    return model


@functools.lru_cache(maxsize=1)
def _uncached_tokens() -> tuple[int, ...]:
    return tuple(generate(_cache_model(), MY_CACHE_PROMPT, cache="none", max_new_tokens=MY_CACHE_TOKENS).tokens)


_SHAPE = "(batch, kv_heads, tokens, head_dim)"
_WRONG_DIM = re.compile(r"must match except in dimension (-?\d+)")


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b)


def _explain(got: torch.Tensor, expected: torch.Tensor, new: torch.Tensor, what: str, layer: int,
             stored: int) -> str | None:
    """Why ``got`` (the K or V that update returned) is not ``expected``, in the words of the slip; None if it is."""
    if _same(got, expected):
        return None
    if _same(got, new) and stored:
        return (f"update returns only the new {what}: after {stored} stored tokens, layer {layer} handed back "
                f"{new.size(2)} token(s), so attention sees only the newest token and nothing before it. Return "
                f"everything the layer holds (the stored {what} with the new ones after them).")
    if got.dim() == 4 and got.shape[:2] == expected.shape[:2] and got.shape[3] == expected.shape[3]:
        if got.size(2) > expected.size(2):
            return (f"layer {layer} got back {got.size(2)} tokens of {what} where it stored {expected.size(2)}: "
                    "the layers share one store, so each layer attends over the other layers' keys and values "
                    "too. Keep one K and one V per layer: index them with layer_idx.")
        if got.size(2) == expected.size(2) and torch.equal(torch.sort(got, dim=2).values,
                                                           torch.sort(expected, dim=2).values):
            return (f"layer {layer}'s {what} are all there but in the wrong order: the new token goes after the "
                    "stored ones (torch.cat([stored, new], dim=2)), so that position i holds token i. One new token "
                    "attends to all of them in any order, but several at once (a prompt added to a cache that "
                    "already holds tokens) are masked by position, and the mask would be wrong.")
        if got.size(2) < expected.size(2):
            return (f"layer {layer} handed back {got.size(2)} tokens of {what} where {expected.size(2)} are stored: "
                    "did you keep only part of them?")
    if got.shape != expected.shape:
        grew = [d for d in range(min(got.dim(), expected.dim())) if got.shape[d] != expected.shape[d]]
        where = f" (dimension {grew[0]} grew)" if grew and got.dim() == expected.dim() else ""
        return (f"layer {layer}'s {what} came back with shape {tuple(got.shape)} where {tuple(expected.shape)} "
                f"{_SHAPE} was expected{where}: concatenate along dimension 2, the tokens.")
    return f"layer {layer}'s {what} have the right shape but not the values that were stored; store k and v as given."


def _tokens_held(cache: Any) -> int | None:
    """How many tokens the learner's cache holds in its first layer, read from its own ``keys`` (the skeleton's
    list of per-layer tensors, None while empty); None when it keeps them some other way."""
    keys = getattr(cache, "keys", None)
    if not isinstance(keys, (list, tuple)) or not keys:
        return None
    first = keys[0]
    return 0 if first is None else first.size(2) if isinstance(first, torch.Tensor) and first.dim() == 4 else None


def _probe(cache_class: type) -> str | None:
    """Feed update() a 3-token prompt and one more token, layer by layer, and name the first slip (None if none)."""
    cfg = _cache_model().config
    L, nkv, hs = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim
    cache = cache_class(L, nkv, hs, batch=1, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(0)

    def new(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(1, nkv, tokens, hs, generator=gen), torch.randn(1, nkv, tokens, hs, generator=gen)

    held: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(L)]
    for tokens in (3, 1):  # the prompt, then one decode step
        for layer in range(L):
            k, v = new(tokens)
            try:
                got = cache.update(layer, k, v)
            except Exception as exc:
                dim = _WRONG_DIM.search(str(exc))
                if dim:
                    return (f"update concatenates along dimension {dim.group(1)}: one new token cannot be added "
                            f"to a 3-token prompt that way, the two do not line up. The tokens are dimension 2 of "
                            f"{_SHAPE}: torch.cat([stored, new], dim=2).")
                return f"update raised {type(exc).__name__}: {exc} (layer {layer}, {tokens} new token(s))."
            if not (isinstance(got, (tuple, list)) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
                return (f"update returned {type(got).__name__} {str(got)[:60]!r}; it must return two tensors, "
                        "(keys, values): everything this layer holds, to attend over.")
            stored = sum(t[0].size(2) for t in held[layer])
            held[layer].append((k, v))
            for i, what in ((0, "keys"), (1, "values")):
                expected = torch.cat([t[i] for t in held[layer]], dim=2)
                why = _explain(got[i], expected, (k, v)[i], what, layer, stored)
                if why:
                    return why
        total = sum(t[0].size(2) for t in held[0])
        try:
            seq_len = cache.seq_len
        except Exception as exc:
            return f"reading seq_len raised {type(exc).__name__}: {exc}."
        holds = _tokens_held(cache)
        if holds is not None and holds < total:  # what the learner's cache holds, not this probe's record
            todo = "Fill in both TODOs." if seq_len != total else "seq_len already counts them; fill in update."
            return (f"update was handed {total} tokens per layer, but your cache holds "
                    f"{'none of them' if holds == 0 else holds}, and its seq_len says {seq_len}: update must keep "
                    f"this layer's k and v after what it already holds, and seq_len must count the tokens kept, "
                    f"the position the next token gets. {todo}")
        if seq_len != total:
            if seq_len == 0:
                return (f"seq_len is still 0 with {total} tokens stored: you forgot the position offset. The model "
                        "asks cache.seq_len where the new tokens stand (decoder.forward: positions = seq_len, "
                        "seq_len + 1, ...), so RoPE rotates every new key as if it were the first token. Return the "
                        "number of tokens stored (a layer's K has them in dimension 2).")
            steps = 1 if tokens == 3 else 2
            if seq_len == steps:
                return (f"seq_len is {seq_len} with {total} tokens stored: it counts steps, not tokens. A prompt "
                        "adds all its tokens in one step, and the model reads seq_len as the next token's position.")
            if seq_len == total * L:
                return (f"seq_len is {seq_len} with {total} tokens stored: it counts every layer's tokens. All "
                        "layers hold the same tokens; seq_len is the number of tokens, the next one's position.")
            return (f"seq_len is {seq_len} with {total} tokens stored; it must be the number of tokens stored "
                    "(the position the next token gets).")
    return None


@exercise("02_kv_cache.ipynb", kind="build", solution=SolutionCache, wrong=OnlyNewKeysCache,
          title="write the cache",
          question="""Time to write one. The cache below has the interface of every kvlab cache: each layer calls
`update(layer_idx, k, v)` with the new tokens' keys and values, shaped `(batch, kv_heads, new_tokens, head_dim)`,
and gets back **all** the keys and values that layer holds; `seq_len` is the number of tokens stored, which
the model reads as the next token's position. Fill in the two `TODO`s. The checker generates with your
cache and without any, token for token, on a tiny model like the one above, and names what went wrong.""",
          code='''import torch
from kvlab.cache import CacheMemory, KVCache, tensor_bytes


class MyCache(KVCache):
    """A KV cache you write: per layer, one K and one V tensor that grow with every token."""

    name = "mine"

''' + method_source(SolutionCache, "__init__") + '''

    def update(self, layer_idx, k, v):
        """Store this layer's new k, v (batch, kv_heads, new_tokens, head_dim); return all its K and V."""
        # TODO: keep k and v after what this layer already holds, then return everything it holds
        return k, v

    @property
    def seq_len(self):
        """Tokens stored so far: the position the next token gets."""
        # TODO
        return 0

''' + method_source(SolutionCache, "reset", "memory") + '''


check_my_cache(MyCache)''',
          explanation=solution_code(SolutionCache, "update", "seq_len") + """
This is kvlab's `DynamicCache` (`kvlab/cache/dynamic.py`), which also copies the first k and v so that
they do not keep alive the larger tensor they are views of. The slips the checker names:
concatenating along another dimension than the tokens; returning only the new keys and values
(attention then sees one token); one store shared by all layers (index by `layer_idx`); and a
`seq_len` that stays 0, so the model places every new token at position 0 and its rotary encoding
is wrong.""")
def check_my_cache(cache_class: Any) -> Feedback:
    """Generate with the learner's cache class and with no cache, token for token; name the slip when they differ."""
    if not isinstance(cache_class, type):
        return wrong(f"pass the class itself, check_my_cache(MyCache), not {type(cache_class).__name__} "
                     f"{str(cache_class)[:40]!r}.")
    if not issubclass(cache_class, KVCache):
        return wrong(f"{cache_class.__name__} should subclass kvlab.cache.KVCache, as the skeleton does.")
    model = _cache_model()
    cfg = model.config
    try:
        cache = cache_class(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, batch=1, dtype=model.dtype, device="cpu")
    except Exception as exc:
        return wrong(f"building {cache_class.__name__}(num_layers, num_kv_heads, head_dim, batch=1, dtype, device) "
                     f"raised {type(exc).__name__}: {exc}. Keep the skeleton's __init__.")
    expected = _uncached_tokens()
    try:
        got = tuple(generate(model, MY_CACHE_PROMPT, cache=cache, max_new_tokens=MY_CACHE_TOKENS).tokens)
        ran = None
    except Exception as exc:
        got, ran = (), f"generation with your cache stopped with {type(exc).__name__}"
    try:
        slip = _probe(cache_class)
    except Exception as exc:
        slip = f"probing your cache raised {type(exc).__name__}: {exc}."
    if got == expected and slip is None:
        return right(f"with your cache the model wrote the same {len(expected)} tokens as without any cache, "
                     f"and it holds {cache.seq_len} tokens ({len(expected) - 1} generated + "
                     f"{len(model.tokenizer.encode(MY_CACHE_PROMPT))} of the prompt; the last one is never fed "
                     "back). Same tokens, less work: that is a KV cache.")
    if ran:
        headline = f"{ran}: "
    elif got != expected:
        i = next((j for j, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        headline = (f"with your cache, generated token {i} is {got[i]} where the uncached run wrote {expected[i]}: "
                    if i < len(got) else "your cache generated fewer tokens than the uncached run: ")
    else:
        headline = "your cache wrote the same tokens as the uncached run on this prompt, but it is not right yet: "
    return wrong(headline + (slip or "compare your update with the question: store this layer's new k and v after "
                                      "what it holds, return everything it holds, and let seq_len count the tokens."))
