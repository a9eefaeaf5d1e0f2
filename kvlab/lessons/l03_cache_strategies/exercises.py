"""Exercises of notebook 03 (cache strategies): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from ...cache.base import kv_cache_bytes
from ..common.exercises import Feedback, check_number, exercise, multiple_choice


@exercise("03_cache_strategies.ipynb", solution=4 / 32 + 2 / 32, wrong=4 / 32,
          title='the price of a 4-bit cache',
          question="""A quantized cache stores 4-bit codes in groups of 32 numbers, each group with an fp32 scale and
an fp32 zero-point, and no full-precision window (`residual=0`). What fraction of the plain fp32
cache's bytes does it take? Answer with a fraction (0.5 means half), then compare it with the
"× dynamic" column of the panel's table.""",
          code="""answer = None   # a fraction, e.g. 0.5
check_quantized_memory_ratio(answer)""",
          explanation="""```python
answer = 4 / 32 + 2 / 32   # codes: 4 of 32 bits; scale + zero-point: 2 x 32 bits shared by 32 numbers
```
0.1875, not 0.125: with groups of 32 the scales and zero-points cost half as much as the codes.
Smaller groups follow the data more closely and cost more; `ideal_memory_ratio` in
`kvlab.lessons.l03_cache_strategies.strategies` computes it for any setting.""")
def check_quantized_memory_ratio(answer: Any) -> Feedback:
    """4-bit codes, groups of 32 values, fp32 scale and zero-point, residual 0: bytes as a fraction of fp32's."""
    from .strategies import ideal_memory_ratio

    setting = {"cache": "quantized", "bits": 4, "group_size": 32, "residual": 0}
    expected = ideal_memory_ratio(setting, head_dim=32, tokens=1000, element_bytes=4)
    return check_number(
        answer, expected, what="the 4-bit cache's size as a fraction of the fp32 cache's", rel=1e-3,
        digits=2,  # 0.1875 rounded as the panel's table shows it, 0.19, is right; 0.156 (no zero-point) is not
        mistakes=[(4 / 32, "that counts only the 4-bit codes. Each group of 32 values also stores a scale and a "
                           "zero-point in fp32 (4 bytes each) to turn the codes back into numbers."),
                  (4 / 32 + 1 / 32, "you counted the scale but not the zero-point: asymmetric quantization stores "
                                    "both for every group."),
                  (100 * expected, "that is a percentage; answer with a fraction (0.5 means half)."),
                  (1 / expected, "that is how many times smaller it is; the question asks for the fraction.")],
        hint="per value: bits / 32 for the code, plus (2 × 32 bits) / (group_size × 32 bits) for the scale and "
             "zero-point shared by its group.",
        confirm=f"4/32 + 2/32 = {expected:g}: the scales and zero-points cost half as much as the codes "
                "themselves. Compare with the ideal and measured ratios in the panel's table.")


@exercise("03_cache_strategies.ipynb", solution=(133 + 1) * 2 * 4 * 2 * 32 * 4, wrong=133 * 2 * 4 * 2 * 32 * 4,
          title='bytes on the move',
          question="""The recall model has 4 layers, 2 K/V heads of 32 numbers, in fp32. An offloaded cache holds
133 tokens when a decode step starts. How many bytes cross between the slow tier and the compute
device during that step?""",
          code="""answer = None   # a number of bytes
check_offloaded_bytes(answer)""",
          explanation="""```python
per_token = 2 * 4 * 2 * 32 * 4          # K and V, 4 layers, 2 heads, 32 numbers, 4 bytes: 2,048
answer = (133 + 1) * per_token          # 133 tokens read in, the new one written out: 274,432
```
The panel's offloaded bars are this count averaged over the steps of a run.""")
def check_offloaded_bytes(answer: Any) -> Feedback:
    """Recall model (4 layers, 2 kv heads, head_dim 32, fp32): bytes an offloaded cache moves in a decode step with 133 tokens stored."""
    per_token = kv_cache_bytes(4, 2, 32, 1, 1, 4)
    stored = 133
    expected = (stored + 1) * per_token
    return check_number(
        answer, expected, what="bytes moved in one decode step", rel=0,
        mistakes=[(stored * per_token, "that counts only the history read back in. The step also writes the new "
                                       "token's K and V out to the slower tier."),
                  (per_token, "that is one token (both directions would be more): every step reads the whole "
                              "stored history of every layer back in."),
                  (expected / 4, "that is one layer; the cache moves every layer's history each step."),
                  (expected / 2, "half: did you count the keys and the values (the factor 2)?")],
        hint="Every decode step reads each layer's stored tokens in and writes the new token out; one token "
             "of all layers, K and V, is 2 × 4 × 2 × 32 × 4 bytes.",
        confirm=f"(133 read + 1 written) × {per_token:,} bytes = {expected:,} bytes, and the count grows with "
                "every token: offloading turns context length into traffic on every step.")


check_dominant_constraint = multiple_choice(
    "03_cache_strategies.ipynb", "check_dominant_constraint",
    title='which constraint dominates',
    stem="""An assistant answers questions about long contracts: prompts of 30,000 tokens, short answers
that must quote clause numbers exactly, streamed at a steady reading pace. The GPU's memory is full
at 6 conversations while its compute is mostly idle. By the reading guide above, which strategy does
this workload rule out, whatever memory it would save?""",
    options={
        "a": ("an 8-bit quantized cache with a residual window, because exact quotes forbid any quantization of "
              "the keys and values;",
              "the guide puts quantization last for exact answers, not out: memory is what binds here, and 8 bits "
              "with a full-precision window of recent tokens is the first thing to try, adopted only if the "
              "answers at 30,000 tokens match the exact cache's (measure them, as the accuracy plots do)."),
        "b": ("the dynamic cache, because a cache that grows token by token cannot hold a 30,000-token prompt;",
              "a dynamic cache holds any length the memory allows; it is the exact baseline every other "
              "strategy is compared with, and the prompt is stored in one step by the prefill."),
        "c": ("a static cache, because fixed shapes only work for short contexts;",
              "a static cache works at any length: it reserves the maximum for each conversation (here about "
              "what each one uses anyway) and buys fixed shapes for a compiled step. It does not relieve the "
              "memory, since it frees no byte, but it breaks no requirement either."),
        "d": ("offloading the caches to host memory, because each decode step would move the whole history over "
              "the link;", None),
    },
    correct="d", wrong_example="a",
    confirm="offloaded, every decode step reads each conversation's whole stored history back over the host "
            "link, so the time between tokens grows with the 30,000-token context: the guide keeps offloading "
            "for work whose latency budget is loose, and this one must stream steadily.",
    explanation="""```python
answer = "d"
```
An offloaded cache moves each layer's whole history across the link on every decode step (the
bytes you counted in exercise 2, here for 30,000 tokens), so the gap between tokens grows with the
context. Prefetching hides the copy behind compute only while the link carries a step's bytes in
one step's time: for Llama-3-8B in fp16 a 30,000-token history is
`kv_cache_bytes(32, 8, 128, 30_000, 1, 2)` = `3.9e9` bytes per conversation per step, against a
host link that carries tens of GB per second. Steady streaming is a requirement, so offloading
is out. Memory is what binds, so the lever is fewer bytes per token: 8 bits, then 4, with a
residual window, kept only if the answers at the real length match the exact cache's, since exact
quotes are the recall your run measured. The dynamic cache is the exact baseline, and a static
cache frees nothing but breaks nothing.""")
