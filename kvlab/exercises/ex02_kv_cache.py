"""Exercises of notebook 02 (the KV cache): checkers, their questions and folded solutions."""
from __future__ import annotations

import math
from typing import Any

from ..cache.base import kv_cache_bytes
from ..experiments.memory import GIB, max_sequences, resolve_config
from .framework import Feedback, exercise, check_number, check_choice, right, wrong, _is_number


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
`kvlab.experiments.max_sequences("Llama-3-8B (GQA)", 32768, 80)` does the same count.""")
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
             "and round down (kvlab.experiments.max_sequences does exactly this).",
        confirm=f"{expected} sequences: each holds {per_seq / GIB:g} GiB of cache. At 32K tokens the cache, "
                "not the weights, decides how many conversations one GPU can hold.")


@exercise("02_kv_cache.ipynb", solution="a", wrong="b",
          title='what the cache keeps',
          question="""Two users send exactly the same prompt, one after the other, to a server that uses a KV cache.
What does the first request's KV cache do for the second?

- **a** nothing by itself: it held the keys and values of the first generation only, and was freed when that ended;
- **b** the second user gets the stored answer back without the model running, because the cache keeps finished answers;
- **c** it guarantees the second answer is identical, because it stores the sampled tokens.""",
          code="""answer = None   # a letter: "a", "b" or "c"
check_what_the_cache_keeps(answer)""",
          explanation="""```python
answer = "a"
```
A KV cache is the working memory of one generation, not a cache of responses. Servers with
**prefix caching** (notebook 07) can keep the keys and values of a shared prompt prefix for later
requests and skip part of their prefill; every token of every answer is still generated.""")
def check_what_the_cache_keeps(answer: Any) -> Feedback:
    """Multiple choice: two users send the same prompt one after the other; what does the first one's KV cache do?"""
    return check_choice(answer, "a", {
        "b": "a KV cache is not a cache of answers: it holds the keys and values of one ongoing generation "
             "and is freed when that generation ends. Nothing returns a stored answer.",
        "c": "the cache holds keys and values, not the sampled tokens; with sampling the second answer can "
             "differ, and it is generated token by token either way.",
    }, confirm="the KV cache is the working memory of one generation. A server with prefix caching "
               "(notebook 07) can reuse the keys and values of a shared prompt prefix and skip part of the "
               "prefill, but every token of the answer is still generated.")
