"""Write notebooks/03_cache_strategies.ipynb (and with --execute, run it and save its outputs).

    python scripts/nb_03_cache_strategies.py              # write the notebook, no outputs
    python scripts/nb_03_cache_strategies.py --execute    # write, run top to bottom, save with outputs
"""
from __future__ import annotations

import sys
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

sys.path.insert(0, str(Path(__file__).parent))
from build_notebooks import (write_notebook, SETUP, exercise_cells, header,  # noqa: E402
                             navigation)

from kvlab.course import lesson  # noqa: E402

FILE = "03_cache_strategies.ipynb"


def cells() -> list:
    entry = lesson(FILE)
    return [
        new_markdown_cell(header(entry, "03") + """

Notebook 02 showed that a KV cache costs memory, and hinted that there are ways to pay less. Every
one of them moves the bill somewhere else: to time spent on each token, to bytes shuffled between
memories, to space reserved and never used, or to answers that quietly become wrong. This notebook
puts five ways of keeping the cache side by side on one small model and measures all four bills."""),
        new_code_cell(SETUP),
        new_markdown_cell("""## What you will be able to do

- say what each strategy changes: **dynamic** (grow as needed), **static** (reserve the maximum up
  front), **quantized** (store 8, 4 or 2 bits per number), **offloaded** (keep the cache in a slower
  memory and bring it back every step);
- read, for each one, the memory it saves, the time per token it adds, the bytes it moves and the
  answers it keeps, at several context lengths;
- check a lower-precision cache on a task whose answers are right or wrong, broken down by how far
  back the needed fact sits;
- explain what fixed shapes make possible (a compiled decode step) and what they cost (reserved bytes);
- pick the constraint that dominates for a given workload before picking a strategy."""),
        new_markdown_cell("""## A model whose answers can be checked

A model with random weights is fine for timing, but its outputs mean nothing, so nothing could
visibly get worse. kvlab ships a tiny trained model instead (`data/recall-tiny`, 657k parameters,
trained by `scripts/train_recall.py` in about 11 CPU-minutes). Its only skill is **associative
recall**: the prompt lists key→value pairs, then asks for one key; the answer is that key's value.
To answer, the model has to look back through its KV cache at exactly one earlier pair, so a cache
that blurs stored keys or values shows up as wrong answers, and the distance between the fact and
the question tells us how far back it had to look."""),
        new_code_cell('''%matplotlib inline
from kvlab.generate import generate
from kvlab.tasks.recall import load_recall_model, make_examples, score

model = load_recall_model()
stop = model.tokenizer.encode(".")
c = model.config
print(f"{c.name}: {model.num_parameters() / 1e3:.0f}k parameters, {c.num_layers} layers, {c.num_kv_heads} K/V "
      f"heads of {c.head_dim}, {model.dtype}")
ex = make_examples(1, 4, seed=7)[0]
out = generate(model, ex.prompt, cache="dynamic", max_new_tokens=4, stop_tokens=stop)
print(f"prompt ({len(ex.prompt_ids)} tokens): {ex.prompt}")
print(f"expected answer: {ex.answer}   model's answer: {out.text}   "
      f"(the fact sits {ex.distance} tokens before the end of the prompt)")'''),
        new_markdown_cell("""**Checked:** the exact cache answers the held-out questions the training script evaluates
on (seed 1000, 16 pairs per prompt). This cell's output is compared by the tests: the model, the
questions and greedy decoding on CPU are all deterministic."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
from kvlab.experiments.threads import torch_threads

held_out = make_examples(100, 16, seed=1000)
with torch_threads(1):
    exact = score(model, held_out, cache="dynamic")
print(f"exact (dynamic) cache: accuracy {exact.accuracy:.3f} on {len(held_out)} held-out questions "
      f"({int(exact.examples['correct'].sum())} right), {len(held_out[0].prompt_ids)} prompt tokens each")'''),
        new_markdown_cell("""**Checked:** three strategies only change *where* and *how* the exact numbers are kept:
`dynamic` grows its tensors, `static` writes into a block reserved up front, `offloaded` keeps
every layer in a slower memory and copies it back each step. They must give exactly the tokens of
the uncached computation (`none`), which recomputes everything and serves as the oracle."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
prompt = make_examples(1, 8, seed=3)[0].prompt
runs = {name: generate(model, prompt, cache=name, max_new_tokens=12).tokens
        for name in ("none", "dynamic", "static", "offloaded")}
print("none, dynamic, static and offloaded give the same tokens:", all(t == runs["none"] for t in runs.values()))
print("tokens:", runs["dynamic"])
print("text:  ", repr(model.tokenizer.decode(runs["dynamic"])))'''),
        new_markdown_cell("""## All strategies side by side

The panel runs every chosen setting at every chosen context length: a few timed generations each
(settings take turns, so a busy moment on the machine hits them all alike), then the recall
questions at the longest context through the dynamic cache and each quantized setting. Static and
offloaded caches are sized for the longest context, the way a server sizes them for the longest
request it accepts. Choose, press **Run**, and read the table and the six plots."""),
        new_code_cell('''from kvlab.widgets.strategies import strategies_panel

panel = strategies_panel(model)
panel'''),
        new_code_cell('''result = panel.run()   # the same as pressing Run
result.show()'''),
        new_markdown_cell("""**Reading the page.** Top row, left to right: bytes allocated as tokens are stored (the black
dashed line is the formula of notebook 02); the time of one decode step, median with a whisker to
the 95th percentile; and how much of each step is spent *inside the cache* (writing, quantizing,
dequantizing, copying), with a whole dynamic step in grey for scale. Bottom row: bytes the
offloaded cache moves per step; recall accuracy as bits fall; recall accuracy by how far back the
fact sits. Each strategy keeps its colour through the lab; quantized settings get darker as bits fall.
On a machine shared with other programs the p95 whiskers mostly measure those programs (a step
that waited for the CPU); compare the medians, and rerun if the whiskers are very uneven.

The rest of the notebook takes the strategies one at a time, from the same `result.frame`."""),
        new_markdown_cell("""## Static: bytes reserved, shapes fixed

A static cache allocates its maximum length up front. At the longest context it is as full as the
dynamic one; at shorter contexts the difference is memory held for tokens that never came."""),
        new_code_cell('''frame = result.frame
bpt = frame.attrs["bytes_per_token"]   # 2 x layers x kv_heads x head_dim x 4 bytes
max_len = int(frame.loc[frame["strategy"] == "static", "allocated_bytes"].max() // bpt)
print(f"static cache sized for {max_len} tokens ({bpt:,} bytes per token)\\n")
print(f"{'prompt':>6} {'stored':>6} {'dynamic KiB':>11} {'static KiB':>10} {'reserved KiB: formula':>22} {'measured':>9}")
for p, rows in frame.groupby("pairs"):
    dyn, st = rows.set_index("strategy").loc["dynamic"], rows.set_index("strategy").loc["static"]
    expected = (max_len - st["stored_tokens"]) * bpt
    print(f"{st['context_tokens']:>6} {st['stored_tokens']:>6} {dyn['allocated_bytes'] / 1024:>11.1f} "
          f"{st['allocated_bytes'] / 1024:>10.1f} {expected / 1024:>22.1f} {st['reserved_bytes'] / 1024:>9.1f}")'''),
        new_markdown_cell("""What do the fixed shapes buy? A dynamic cache hands attention a key tensor one token longer
at every step. A compiler that builds a program for one set of shapes must then rebuild or fall
back to general code. `kvlab.experiments.static_compile.FixedShapeStaticCache` writes each new
token into its slot at a position held in a tensor and attends over *all* reserved slots, masking
the empty ones, so every decode step has the same shapes and `torch.compile` can build one program
and replay it for every token (CUDA graphs rely on the same property).

Compiling takes time: on CPU, torch's inductor writes and builds C++ code, which can take a minute
on a small busy machine the first time (later runs reuse its on-disk cache). The cell below gives
it a budget; if the compiler is missing, fails or runs out of time, it says so and moves on."""),
        new_code_cell('''from kvlab.experiments.static_compile import try_compiled_decode

compiled = try_compiled_decode(budget_s=20)
print(compiled["message"])
if compiled["status"] == "compiled":
    print(f"same tokens as the dynamic cache (eager and compiled): {compiled['same_tokens']}; "
          f"dynamic cache: {compiled['dynamic_ms']:.2f} ms per step")'''),
        new_markdown_cell("""## Quantized: memory saved, time spent, answers lost

A quantized cache stores each group of `group_size` numbers as small integer codes plus a scale
and a zero-point to turn them back into numbers. The newest `residual` tokens can stay in full
precision. Memory should follow the format exactly: bits / 32 for the codes, plus two fp32
numbers per group. Every step pays for it: the new token is quantized, and the whole stored history
is dequantized again before attention can read it. The transformers documentation warns that this
can make a quantized cache slower than the plain one when contexts are short; here is that, measured."""),
        new_code_cell('''q = frame[frame["strategy"] == "quantized"]
for ctx, rows in q.groupby("context_tokens"):
    print(f"--- {ctx} prompt tokens")
    for r in rows.itertuples():
        acc = f"   recall {r.accuracy:.0%} (exact {r.exact_accuracy:.0%})" if r.accuracy == r.accuracy else ""
        print(f"{r.setting:45s} memory {r.memory_ratio:.3f} x dynamic (ideal {r.ideal_memory_ratio:.3f})   "
              f"time/token {r.latency_ratio:.2f} x dynamic   {r.cache_ms_per_step:.2f} ms/step inside the cache{acc}")'''),
        new_markdown_cell("""Accuracy by distance, from the same run (the questions are the same for every setting, so
the exact cache's row is the reference for each bucket):"""),
        new_code_cell('''from kvlab.experiments.cache_accuracy import accuracy_summary
from kvlab.plots.strategies import plot_accuracy_by_distance

accuracy = frame.attrs["accuracy"]
display(accuracy_summary(accuracy)[["setting", "examples", "accuracy", "exact_accuracy", "nearest_accuracy",
                                   "farthest_accuracy", "kl_mean", "top1_agreement"]].round(4))
plot_accuracy_by_distance(accuracy)'''),
        new_markdown_cell("""The memory column follows the format to the byte. The time column is the price: at short
contexts the fixed cost of quantizing and dequantizing is large next to a tiny model's step. The
accuracy columns are the other price: 8 bits keeps the exact cache's answers here, fewer bits lose some, and
at 2 bits most of the lookups fail. KL divergence (how far the next-token distributions moved)
and top-1 agreement tell the same story before any answer changes. With `residual` above 0 the
newest tokens stay exact; the *Try it* section below has you measure what that buys."""),
        new_markdown_cell("""## Offloaded: bytes moved every step

An offloaded cache keeps the keys and values of every layer in a slower, larger memory and keeps
only one layer's worth on the compute device. Each decode step copies every layer's history back
in, computes, and writes the new token out. The bytes moved therefore grow with the context, on
every single step.

What "slower memory" means depends on the machine, and it changes what you measure:

- **on this CPU-only machine** the slow tier is a **memory-mapped file**. Its pages live in the
  operating system's page cache, that is, in RAM, unless the OS evicts them. The cost you see is
  the copy in and out of the mapping each step, not a disk read;
- **on CUDA** the tier is **pinned host memory** (RAM the GPU can copy from directly), and the next
  layer's history is prefetched on a side CUDA stream while the current layer computes, which hides
  part of the copy time. The same code runs both ways (`kvlab/cache/offloaded.py`)."""),
        new_code_cell('''from kvlab.plots.strategies import expected_bytes_moved, plot_bytes_moved

off = frame[frame["strategy"] == "offloaded"].set_index("context_tokens")
dyn = frame[frame["strategy"] == "dynamic"].set_index("context_tokens")
print(f"{'prompt':>6} {'KiB moved/step: expected':>25} {'measured':>9} {'ms/token offloaded':>19} {'dynamic':>8}")
for ctx, r in off.iterrows():
    expected = expected_bytes_moved(ctx, r["stored_tokens"], bpt)
    print(f"{ctx:>6} {expected / 1024:>25.1f} {r['bytes_moved_per_step'] / 1024:>9.1f} "
          f"{r['token_ms_p50']:>19.2f} {dyn.loc[ctx, 'token_ms_p50']:>8.2f}")
plot_bytes_moved(frame)'''),
        new_markdown_cell("""On a tiny model the copies are a few hundred KiB and take a fraction of a millisecond. On a
real model at long context the same arithmetic gives gigabytes per step: with an 8B model holding
32,000 tokens in fp16 (4 GiB of cache, notebook 02), every token would move 4 GiB over the link
between host and GPU. That is why offloading suits work where memory is scarce and latency is not.

## Which constraint dominates? A reading guide

None of these strategies wins everywhere. Start from the workload (prompt lengths, answer
lengths, how many sequences at once, what counts as a correct answer) and find the constraint that
binds first; then read the plot that measures it.

| if your workload… | the constraint that binds | read | try first |
|---|---|---|---|
| short prompts and answers, memory to spare | time per token | latency vs context | `dynamic`; a quantized cache would only add time |
| fixed maximum length, steady traffic, steps dominated by overhead | per-step overhead | the compiled step's speed-up | `static` + `torch.compile` (or CUDA graphs), accepting the reserved bytes |
| long contexts or many sequences, memory full | bytes per token | memory vs context, then accuracy | 8-bit, then 4-bit with a residual window, measured on *your* task and length |
| memory full, latency budget loose (batch jobs, offline) | device memory | bytes moved per step | `offloaded` (on a GPU, with prefetch) |
| answers must reproduce facts from the context exactly | quality | accuracy vs bits and by distance | the exact strategies; any quantization only after measuring the outputs |

Whatever you choose, write down the engine version and its settings next to the result: the
trade-offs move when either changes."""),
        *exercise_cells(
            "the price of a 4-bit cache",
            """A quantized cache stores 4-bit codes in groups of 32 numbers, each group with an fp32 scale and
an fp32 zero-point, and no full-precision window (`residual=0`). What fraction of the plain fp32
cache's bytes does it take? Answer with a fraction (0.5 means half), then compare it with the
"× dynamic" column of the panel's table.""",
            "check_quantized_memory_ratio", "a fraction, e.g. 0.5",
            """```python
answer = 4 / 32 + 2 / 32   # codes: 4 of 32 bits; scale + zero-point: 2 x 32 bits shared by 32 numbers
```
0.1875, not 0.125: with groups of 32 the scales and zero-points cost half as much as the codes.
Smaller groups follow the data more closely and cost more; `ideal_memory_ratio` in
`kvlab.experiments.strategies` computes it for any setting."""),
        *exercise_cells(
            "bytes on the move",
            """The recall model has 4 layers, 2 K/V heads of 32 numbers, in fp32. An offloaded cache holds
133 tokens when a decode step starts. How many bytes cross between the slow tier and the compute
device during that step?""",
            "check_offloaded_bytes", "a number of bytes",
            """```python
per_token = 2 * 4 * 2 * 32 * 4          # K and V, 4 layers, 2 heads, 32 numbers, 4 bytes: 2,048
answer = (133 + 1) * per_token          # 133 tokens read in, the new one written out: 274,432
```
The panel's offloaded bars are this count averaged over the steps of a run."""),
        *exercise_cells(
            "which constraint dominates",
            """An assistant answers questions about long contracts: prompts of 30,000 tokens, short answers
that must quote clause numbers exactly, streamed at reading speed. The GPU's memory is full at 6
conversations while its compute is mostly idle. What do you try first?

- **a** a 2-bit quantized cache with no residual window: it saves the most memory;
- **b** an 8-bit (or 4-bit) quantized cache with a residual window, measuring task accuracy against the exact cache at 30,000 tokens before adopting it;
- **c** a static cache of 30,000 tokens per conversation, so every step has the same shapes;
- **d** offloading the cache to host memory.""",
            "check_dominant_constraint", 'a letter: "a", "b", "c" or "d"',
            """```python
answer = "b"
```
Memory binds, so fewer bytes per token is the lever; quality is a requirement, so the saving is
adopted only after measuring the outputs. A static cache adds reserved bytes; offloading moves the
whole 30,000-token history every step, which breaks steady streaming; 2 bits lost most answers here."""),
        new_markdown_cell("""### Try it

- Set **residual window** to 32 and Run. Which distance bucket recovers at 2 bits, and why that one?
  What happens to the memory ratio at the shortest context?
- At 2 bits, change **group size** to 8. How much memory does it add (predict it first), and how
  much accuracy does it buy back?
- Choose only the shortest context (37 tokens) and then only the longest. Is the quantized cache's
  time per token, relative to dynamic, better or worse as the context grows? Look at the time spent
  inside the cache to explain it.
- Raise **recall questions** to 200. Which accuracy differences survive, and which were noise?
- Give the compiler more time: `try_compiled_decode(budget_s=120)`. Is the compiled step faster
  than the eager one? Is the speed-up worth the compile time for a 16-token answer? For 1,000 answers?

## Summary

- `dynamic`, `static` and `offloaded` keep exact numbers and give the same tokens as recomputing
  everything (checked above); they differ in where the bytes live and when they are allocated.
- `static` reserves its maximum up front: memory held but empty at shorter contexts, in exchange
  for shapes that never change, which is what a compiled decode step needs.
- `quantized` takes bits/32 of the memory plus a scale and zero-point per group, exactly; it pays
  with time spent quantizing and dequantizing every step (slower than dynamic at short contexts
  here) and with answers: fine at 8 bits, falling as bits fall, collapsing at 2 bits without a window.
- `offloaded` keeps little on the device and moves the whole history every step: bytes that grow
  with the context. On CPU the slow tier is a memory-mapped file in the page cache; on CUDA, pinned
  host memory with the next layer prefetched on a side stream.
- Name the constraint that binds for your workload, then measure that one, outputs included.
- Behind this notebook: `kvlab.experiments.strategies.run_strategies`,
  `kvlab.experiments.cache_accuracy.accuracy_by_distance`, `kvlab.quality`,
  `kvlab.experiments.static_compile`, `kvlab.plots.strategies`, `kvlab.widgets.strategies`;
  tests in `tests/test_experiments_strategies.py`, `tests/test_quality.py` and `tests/test_plots_strategies.py`."""),
        new_markdown_cell(navigation(entry)),
    ]


def main() -> None:
    write_notebook(FILE, cells, __doc__)


if __name__ == "__main__":
    main()
