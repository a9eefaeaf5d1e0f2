"""Exercises of notebook 03 (cache strategies): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from kvlab.cache.base import kv_cache_bytes
from kvlab.lessons.common.exercises import Feedback, check_number, exercise, multiple_choice


@exercise("03_cache_strategies.ipynb", solution=2 / 32 + 2 / 8, wrong=2 / 32 + 2 / 32,
          title='the price of small groups',
          question="""A quantized cache stores **2-bit** codes in groups of **8** numbers, each group with an fp32 scale
and an fp32 zero-point, and no full-precision window (`residual=0`). What fraction of the plain fp32
cache's bytes does it take? Answer with a fraction (0.5 means half), then set the panel to 2 bits and
group size 8 and compare with its "× dynamic" column.""",
          code="""answer = None   # a fraction, e.g. 0.5
check_quantized_memory_ratio(answer)""",
          explanation="""```python
answer = 2 / 32 + 2 / 8   # codes: 2 of 32 bits; scale + zero-point: 2 x 32 bits shared by 8 numbers
```
0.3125: more than the 4-bit cache with groups of 32 takes. With groups of 8 the scales and
zero-points cost four times as much as the 2-bit codes. Smaller groups follow the data more closely
and cost more; `ideal_memory_ratio` in `kvlab.experiments.strategies` computes it
for any setting.""")
def check_quantized_memory_ratio(answer: Any) -> Feedback:
    """2-bit codes, groups of 8 values, fp32 scale and zero-point, residual 0: bytes as a fraction of fp32's."""
    from kvlab.experiments.strategies import ideal_memory_ratio

    setting = {"cache": "quantized", "bits": 2, "group_size": 8, "residual": 0}
    expected = ideal_memory_ratio(setting, head_dim=32, tokens=1000, element_bytes=4)
    return check_number(
        answer, expected, what="the 2-bit, group-8 cache's size as a fraction of the fp32 cache's", rel=1e-3,
        digits=2,  # 0.3125 rounded as the table shows it, 0.31, is right; 0.1875 (no zero-point) is not
        mistakes=[(2 / 32, "that counts only the 2-bit codes. Each group of 8 values also stores a scale and a "
                           "zero-point in fp32 (4 bytes each) to turn the codes back into numbers."),
                  (2 / 32 + 1 / 8, "you counted the scale but not the zero-point: asymmetric quantization stores "
                                   "both for every group."),
                  (2 / 32 + 2 / 32, "that is the price with groups of 32. Here a scale and a zero-point are shared "
                                    "by only 8 numbers."),
                  (100 * expected, "that is a percentage; answer with a fraction (0.5 means half)."),
                  (1 / expected, "that is how many times smaller it is; the question asks for the fraction.")],
        hint="per value: bits / 32 for the code, plus (2 × 32 bits) / (group_size × 32 bits) for the scale and "
             "zero-point shared by its group.",
        confirm=f"2/32 + 2/8 = {expected:g}: the scales and zero-points cost four times as much as the codes, and "
                "the whole takes more than the 4-bit cache with groups of 32. Smaller groups buy accuracy with "
                "bytes.")


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
    stem="""An assistant summarises long reports: prompts of 30,000 tokens, summaries of a few hundred tokens
streamed at a steady reading pace. The GPU's memory is full at 6 requests at once while its compute
is mostly idle. Which of these fits this workload worst?""",
    options={
        "a": ("an 8-bit quantized cache with a residual window, because rounding the stored keys and values "
              "changes some of the tokens it writes;",
              "that is a price to check, not a reason to rule it out: memory is what binds here, and 8 bits with "
              "a full-precision window of recent tokens is the first thing to try, kept only if its summaries of "
              "real reports hold up against the exact cache's. A summary can absorb a changed word; a workload "
              "whose answers must quote the context exactly starts from the exact caches instead (the table "
              "above)."),
        "b": ("the dynamic cache, because its memory grows with the 30,000-token context;",
              "every exact cache holds the same bytes for the same tokens; the dynamic cache is the exact baseline "
              "every other strategy is compared with, and the prompt is stored in one step by the prefill."),
        "c": ("a static cache, because it reserves memory for the longest request before any token arrives;",
              "here each request reaches about its maximum anyway (the prompt is most of it), so little of the reservation stays empty. "
              "A static cache frees no byte, but it breaks no requirement either, and its fixed shapes allow a "
              "compiled step."),
        "d": ("this notebook's offloaded cache, because it streams each request's history over the host link "
              "every step.", None),
    },
    correct="d", wrong_example="a",
    confirm="streaming every running request's 30,000-token history over the host link at every step makes "
            "the gap between tokens grow with the context, and this workload must stream steadily. Host memory "
            "itself is not ruled out: engines that keep idle prefix blocks there (LMCache, SGLang's HiCache) "
            "copy a document's K/V back once per request instead of recomputing its prefill.",
    explanation="""```python
answer = "d"
```
This notebook's offloaded cache (like transformers' offloaded cache,
[docs](https://huggingface.co/docs/transformers/main/en/kv_cache#offloaded-cache)) moves each layer's whole
history across the link on every decode step: the bytes you counted in exercise 2, here for 30,000
tokens. For Llama-3-8B in fp16 that is `kv_cache_bytes(32, 8, 128, 30_000, 1, 2)` = `3.9e9` bytes
per request per step, against a host link that carries tens of GB per second, so six requests
would wait about a second per token. Memory binds, so the first lever is fewer bytes
per token: 8 bits with a residual window, kept only if its summaries of real reports at the real
length hold up against the exact cache's. Fewer bits lose more (the accuracy table above), and a
workload whose answers quote the context exactly keeps an exact cache until the count of right
answers says otherwise.

Host memory is still a standard lever for long documents, in another design: engines that
offload *idle* prefix blocks keep a document's K/V in host memory between requests and copy it
back once, when the next request about that document arrives, instead of recomputing a
30,000-token prefill ([LMCache](https://docs.lmcache.ai/), used by vLLM through its KV connector;
SGLang's [HiCache](https://docs.sglang.io/advanced_features/hicache_design.html), a host-memory
tier under its prefix cache). What fits worst is streaming the history of running sequences every
step, not host memory.""")
