"""Write notebooks 00_start_here, 01_the_slowdown and 02_kv_cache from the cells below.

The repository URL, badges and previous/next links come from kvlab.course, so they are written in one
place. With --execute each notebook is run top to bottom (as nbval will) and saved with its outputs,
so a reader on GitHub sees the figures; the script then refuses to keep any output that holds an
absolute path of this machine.

    python scripts/build_notebooks.py                 # write the three notebooks, no outputs
    python scripts/build_notebooks.py --execute       # write, run and save them with outputs
    python scripts/build_notebooks.py --execute 01    # only the notebooks whose name starts with 01
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from kvlab.course import NOTEBOOKS, Lesson, binder_url, colab_url, course_map, lesson, setup_cell

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


# --- parts every notebook shares ---------------------------------------------------------------

def header(entry: Lesson, number: str) -> str:
    return (f"# {number} · {entry.title}\n\n"
            f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]({colab_url(entry.file)}) "
            f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder_url(entry.file)})\n\n"
            f"*About {entry.minutes} minutes. {entry.shows[0].upper()}{entry.shows[1:]}.*")


SETUP = setup_cell()  # the first code cell of every notebook (kvlab.course.setup_cell)


def navigation(entry: Lesson) -> str:
    i = [n.file for n in NOTEBOOKS].index(entry.file)
    prev = f"[← {NOTEBOOKS[i - 1].title}]({NOTEBOOKS[i - 1].file})" if i > 0 else "(this is the first notebook)"
    nxt = (f"[{NOTEBOOKS[i + 1].title} →]({NOTEBOOKS[i + 1].file})" if i + 1 < len(NOTEBOOKS)
           else "the next notebooks are listed in the [course map](../README.md#course-map)")
    return f"---\n**Previous:** {prev} · **Next:** {nxt}"


def exercise_cells(title: str, question: str, checker: str, placeholder: str, solution: str) -> list:
    """One exercise: the question, a cell calling its checker from kvlab.exercises, a folded solution."""
    return [new_markdown_cell(f"### Exercise: {title}\n\n{question}"),
            new_code_cell(f"from kvlab.exercises import {checker}\n\n"
                          f"answer = None   # {placeholder}\n{checker}(answer)"),
            new_markdown_cell(f"<details><summary>Solution</summary>\n\n{solution}\n\n</details>")]


# --- 00 start here -----------------------------------------------------------------------------

def start_here() -> list:
    entry = lesson("00_start_here.ipynb")
    return [
        new_markdown_cell(header(entry, "00") + """

kvlab is a lab about one question: **why can an AI service that is fast on paper still keep a
person waiting?** Every notebook asks one part of that question, runs one real experiment on a
real (small) Transformer, and plots what happened. Nothing is simulated: the decoder, its KV
caches and the timers are the code in the `kvlab` package, which you can open and read."""),
        new_code_cell(SETUP),
        new_markdown_cell("""## What you will be able to do

- say which machine your numbers come from (device, library versions, CPU threads) and why that matters;
- find your way through the notebook sequence and the package layers behind it;
- drive a **panel**: choose settings, press **Run**, watch the progress bar, read the figure;
- run the lab locally, on Binder or on Colab."""),
        new_markdown_cell("""## 1. Your machine

Every time in this lab depends on these few lines. When you compare a result with a neighbour's,
compare these first: a laptop with 8 fast cores gives smaller numbers than a 2-core Binder
session. The **shapes** of the curves, which are what the lessons are about, stay the same."""),
        new_code_cell('''import pandas as pd
from kvlab.env import environment

env = environment()
pd.Series({"device": env["device"], "CPU cores": env["cpu_count"], "torch threads": env.get("torch_threads"),
           "GPU": env.get("cuda_device") or "none", "python": env["python"],
           **{f"{name} version": version for name, version in env["versions"].items()}}).to_frame("this machine")'''),
        new_markdown_cell("""## 2. How the lab is laid out

The notebooks are meant to be done in order; each one links to the next at the bottom.

""" + course_map(link_prefix="") + """

The same table is the [course map](../README.md#course-map) of the README.

Under the notebooks sits the `kvlab` package, in layers. Each layer uses only the ones below it,
so when a figure surprises you, you can follow it down: the panel calls an experiment, the
experiment calls `kvlab.generate`, which calls the model with a cache.

```
notebooks/          what you are reading: a few lines, one experiment behind a button, plots
kvlab.widgets       panels: controls, a Run button, a progress bar, an output area
kvlab.experiments   the experiments; each returns a pandas DataFrame
kvlab.plots         matplotlib figures drawn from those DataFrames
kvlab.generate      timed generation: a prefill, then one decode step per token
kvlab.model         the decoder (Llama and GPT-2 families)
kvlab.cache         the KV cache strategies: none, dynamic, static, quantized, offloaded
```"""),
        new_markdown_cell("""## 3. Your first panel

A panel is a few controls, a **Run** button, a progress bar and an output area. This one asks the
lesson model (about 3 million parameters, random weights: timing does not need a trained model)
to write 100 tokens **with** a KV cache, three times over, and plots how long each token took
(the fastest of the three runs). Press **Run**."""),
        new_code_cell('''from kvlab.widgets import slowdown_panel

panel = slowdown_panel(caches=("dynamic",), max_new_tokens=100, title="Time every token of one generation")
panel'''),
        new_markdown_cell("""Pressing **Run** and calling `panel.run()` do the same thing. The call hands back the result,
so the cell below also leaves a picture in the saved notebook for anyone reading it without
running it:"""),
        new_code_cell('''result = panel.run()
result.show()'''),
        new_markdown_cell("""Every figure of the lab is drawn from a plain DataFrame, one row per generated token here.
`time_s` is the clock a user feels: when each token arrived after the request started."""),
        new_code_cell("result.frame.head()"),
        new_markdown_cell("""### Try it

- Press **Run** again without changing anything. The status line says the result came from the
  cache: the same settings are never measured twice. Move a slider away and back: same.
- Call `panel.run(prompt_tokens=1000)`. The panel refuses in one line that names the bad value and
  says what to do instead. Every error in kvlab is written that way; none should ever show you a
  wall of traceback.
- Compare `step_ms` of token 0 with the tokens after it. Token 0 is the *prefill*: it read all
  32 prompt tokens in one step. Did it take 32 times as long as a one-token step? Processing
  tokens side by side costs far less per token than writing them one at a time, which is why
  the wait for the first token and the pace of the following ones are different clocks.
- Set *repeats* to 1 and run. A jagged line on the left means other programs were competing for
  the CPU during the run; taking the fastest of several runs filters most of that out."""),
        *exercise_cells(
            "prefill and decode",
            """The panel above used a 32-token prompt and a KV cache. How many tokens did the model process in
the step that wrote token 0, and in the step that wrote token 5? Reason it out, or read the
`tokens_processed` column of `result.frame`. Answer with a pair, `(token 0, token 5)`.""",
            "check_prefill_and_decode", "(tokens processed for token 0, for token 5)",
            """```python
answer = (32, 1)
result.frame.query("token in (0, 5)")[["token", "phase", "tokens_processed"]]
```
Token 0 comes out of the **prefill**, which reads the whole prompt in one step. With a cache, every
later step (**decode**) processes only the newest token and reads the stored keys and values."""),
        *exercise_cells(
            "comparing with a neighbour",
            """Your neighbour runs the same panel with the same settings, and every step takes half as long as
yours. Which is right?

- **a** their model or their prompt must be different;
- **b** times belong to a machine: compare the shapes of the curves, and quote the setup report with any number;
- **c** one of you has a bug.""",
            "check_comparing_machines", 'a letter: "a", "b" or "c"',
            """```python
answer = "b"
```
Same settings means the same model, prompt and tokens: the same work. How long that work takes
depends on the device, the cores, the threads and whatever else runs on the machine."""),
        new_markdown_cell("""## 4. Running the lab elsewhere

- **Locally**: the README's quick start is two commands; the first opens JupyterLab on this notebook.
- **Binder** (badge at the top): a CPU-only JupyterLab in your browser, nothing to install. The first
  start can take a few minutes while the image builds; a session ends after a few idle minutes,
  so download anything you change.
- **Colab** (badge at the top): the first cell installs kvlab from the project's repository. For a
  GPU choose *Runtime > Change runtime type*. Every notebook also runs on a CPU.
- To force a device, set `KVLAB_DEVICE=cpu` (or `cuda`) before starting Jupyter.

## Summary

- Your numbers belong to your machine: the device, versions and threads above go with every result.
- The lab is a sequence of short notebooks over one small package, in layers you can read.
- A panel runs one experiment: settings, **Run**, a progress bar, a figure and its DataFrame;
  results are kept per setting, and mistakes come back as one clear line."""),
        new_markdown_cell(navigation(entry)),
    ]


# --- 01 the slowdown ---------------------------------------------------------------------------

def the_slowdown() -> list:
    entry = lesson("01_the_slowdown.ipynb")
    return [
        new_markdown_cell(header(entry, "01") + """

Ask a model for a long answer and watch the tokens arrive: without the right machinery the pace
drops as the answer grows. Nothing is broken and the network is fine; the slowdown comes from
how text is generated. This notebook measures it."""),
        new_code_cell(SETUP),
        new_markdown_cell("""## What you will be able to do

- explain why, without a KV cache, each new token takes longer than the one before;
- measure the time of every token and the cumulative time, without a cache (`"none"`) and with one (`"dynamic"`);
- predict the slowdown from the work done at each step, and explain why the measurement falls short of the prediction."""),
        new_markdown_cell("""## The idea

A language model writes one token at a time, and every new token depends on all the text before
it. If the model remembers nothing between steps, the only way to take that text into account is
to push **all of it** through every layer again: the prompt, plus every token written so far.
With a prompt of *T* tokens, the step that writes token *i* processes *T + i* tokens. Each step
does a little more work than the last, so each step takes a little longer.

A **KV cache** keeps what earlier steps already computed for each position (their keys and values,
the subject of notebook 02). Then each step only has to process the one new token and read the
stored history.

| cache | tokens processed by the step that writes token *i* | grows with *i*? |
|---|---|---|
| `"none"` | *T + i* | yes, by one token per step |
| `"dynamic"` | 1 (and it reads *T + i* stored keys and values) | hardly |

Both start with the same step 0, the **prefill**, which processes the whole prompt once."""),
        new_markdown_cell("""## The model

A Llama-style decoder of about 3 million parameters with random weights. Its text is gibberish,
but the arithmetic, and therefore the time, is exactly that of a trained model of this shape.
It is small so that the experiment takes seconds on two CPU cores."""),
        new_code_cell('''from kvlab.experiments import slowdown_model

model = slowdown_model()
cfg = model.config
print(f"{cfg.name}: {model.num_parameters() / 1e6:.1f}M parameters, {cfg.num_layers} layers, "
      f"hidden size {cfg.hidden_size}, {cfg.num_heads} query heads sharing {cfg.num_kv_heads} key/value heads")'''),
        new_markdown_cell("""## The experiment

The same prompt is generated with each cache, three times over, and every step is timed. Each
step counts its fastest run: other programs on the machine can only add time to a step, never
remove it. Runs use one CPU thread: for a model this small more threads barely help, and one
thread is not held up by other programs on a busy machine. Press **Run**, then try other settings."""),
        new_code_cell('''from kvlab.widgets import slowdown_panel

panel = slowdown_panel(model)
panel'''),
        new_code_cell('''result = panel.run()   # the same as pressing Run with the settings above
result.show()'''),
        new_markdown_cell("""**Reading the figure.** Left: the time of each step. The red line (`none`) climbs, since each
step recomputes one token more than the one before; the blue line (`dynamic`) stays flat. Right:
when each token arrived. With a cache the tokens come at a steady pace (a straight line); without
one the line bends upward, because every token waits longer than the one before, and the gap
between the two keeps widening."""),
        new_markdown_cell("""## Expected against measured

If time were proportional to the tokens processed, a late step would take
(*T* + late) / (*T* + early) times as long as an early one without a cache, and just as long
with one. The table compares that **work ratio** with the **measured ratio** (the median step
time of the 11 tokens around each)."""),
        new_code_cell('''from kvlab.experiments import slowdown_fit, slowdown_summary

slowdown_summary(result.frame)[["cache", "early_token", "late_token", "early_step_ms", "late_step_ms",
                                "measured_ratio", "work_ratio"]]'''),
        new_markdown_cell("""The measured ratio without a cache is usually a little below the work ratio. Every step also
pays costs that do not grow with the text: starting each operation, the final layer that scores
all 320 possible next tokens, Python itself. A straight line through the step times separates the
two parts: `fixed_ms` is the part that does not grow, and `us_per_context_token` is what each
extra token of text adds to **every** step."""),
        new_code_cell('''slowdown_fit(result.frame)'''),
        new_markdown_cell("""Without a cache, each token of context adds the cost of recomputing it to every later step.
With a cache, it adds only the cost of reading its stored keys and values, which is far less.
The larger the model and the longer the text, the more the growing part dominates; the curve you
measured here is the mild version.

### Try it

- **Double the prompt** (64, then 128 tokens). Where does the red line start? Early tokens are
  already slow, because the whole prompt is recomputed at every step.
- **Generate 400 tokens.** How many seconds apart are the two curves at the end, and how does that
  compare with 200 tokens? (The uncached total grows roughly with the square of the length.)
- **Repeats:** set *repeats* to 1 and run again. How much noisier is the left panel? Everything
  else on this computer competes for the same cores.

## Exercises"""),
        *exercise_cells(
            "predict the work ratio",
            """Before measuring: with a 256-token prompt and **no** cache, how many times more tokens does the
step that writes token 194 process than the step that writes token 20? (You can then check your
prediction against the `work_ratio` column of `slowdown_summary(panel.run(prompt_tokens=256).frame)`,
about a minute of measuring.)""",
            "check_work_ratio", "a number: late step's tokens / early step's tokens",
            """```python
answer = (256 + 194) / (256 + 20)   # about 1.63
```
The step that writes token *i* processes the prompt plus the *i* tokens before it. The measured ratio
comes out a little lower, because part of every step's time does not grow with the text."""),
        *exercise_cells(
            "count the whole generation",
            """Write a function `total_processed(cache, prompt_tokens, new_tokens)` that returns how many tokens
the model processes, over all steps, to generate `new_tokens` tokens after a prompt of
`prompt_tokens`, for `cache="none"` and `cache="dynamic"`. Pass the function itself as the answer.""",
            "check_total_processed", "your function total_processed, not a call of it",
            """```python
def total_processed(cache, prompt_tokens, new_tokens):
    if cache == "none":   # the step of token i processes the prompt and the i tokens before it
        return sum(prompt_tokens + i for i in range(new_tokens))
    return prompt_tokens + (new_tokens - 1)   # the prefill, then one token per step

answer = total_processed
```
Without a cache the total is *n·T + n(n−1)/2*: it grows with the square of the answer's length.
With a cache it is *T + n − 1*: linear."""),
        new_markdown_cell("""## Summary

- Without a cache, the step that writes token *i* reprocesses *T + i* tokens: step time grows with
  position and the total grows with the square of the length of the answer.
- With a KV cache each step processes one token; step time stays nearly flat.
- The measured slowdown is the work ratio diluted by fixed per-step costs; a line through the step
  times separates the two.
- Behind this notebook: `kvlab.experiments.run_slowdown`, `slowdown_summary`, `slowdown_fit`,
  `kvlab.plots.plot_slowdown`; tests in `tests/test_experiments_slowdown.py`."""),
        new_markdown_cell(navigation(entry)),
    ]


# --- 02 the KV cache ---------------------------------------------------------------------------

def kv_cache() -> list:
    entry = lesson("02_kv_cache.ipynb")
    return [
        new_markdown_cell(header(entry, "02") + """

Notebook 01 showed what a KV cache saves: time. This one opens it up: what it stores, why what it
stores can be reused, and what it costs in memory, first on a tiny model you can inspect, then on
the shapes of models people actually serve."""),
        new_code_cell(SETUP),
        new_markdown_cell("""## What you will be able to do

- say what keys and values are, and why the ones of past tokens can be kept;
- see a cache as K and V tensors per layer and read their shapes;
- check that a cache changes the speed of generation, not its output;
- compute cache memory with the formula and check it against the bytes a cache really allocates;
- estimate the memory of a real model at a given context and batch, and how many sequences fit on a GPU."""),
        new_markdown_cell("""## Keys and values

Inside every attention layer, each position of the text is turned into three vectors:

- a **query**, the question this position puts to the earlier text;
- a **key**, a label every position carries, against which questions are scored;
- a **value**, the content a position contributes in proportion to its score.

To write the next token, the model scores the newest position's query against the keys of all
earlier positions (a dot product each), turns the scores into weights that sum to one, and
takes the weighted mix of their values. In a
decoder a position only looks backwards, so the key and value of a token, once computed, never
change. Recomputing them at every step (notebook 01, cache `"none"`) is wasted work. A **KV
cache** keeps them, for every layer, and each step adds only the new token's key and value.

This cache is not a cache of answers: it holds the internal state of **one** ongoing generation
and is thrown away when that generation ends."""),
        new_markdown_cell("""## Look inside a cache

A tiny Llama-style model (2 layers, 4 query heads sharing 2 key/value heads), on the CPU so that
the printed numbers are the same on every machine. We generate 8 tokens and look at what the
cache holds."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cpu")
cfg = model.config
prompt = "The cache keeps"                    # 15 bytes = 15 tokens with the built-in byte tokenizer
out = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=8)
cache = out.cache
print(cache)
for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
    print(f"layer {layer}: K {tuple(k.shape)}  V {tuple(v.shape)}   (batch, kv_heads, tokens, head_dim)")'''),
        new_markdown_cell("""Each layer stores one K and one V tensor of shape (batch, kv_heads, tokens, head_dim). The cache
holds 22 tokens, not 15 + 8 = 23: the last generated token has not been fed back yet; it would be
on the next step. There are 2 key/value heads for 4 query heads: with **grouped-query attention**
two query heads share one K/V head, which halves the cache."""),
        new_markdown_cell("""## Same tokens, with and without the cache

The cache is a saving, not an approximation: with greedy decoding, cached and uncached generation
must write exactly the same tokens. (This cell is checked by the test suite.)"""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
uncached = kvlab.generate(model, prompt, cache="none", max_new_tokens=20)
cached = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=20)
print("same tokens:", uncached.tokens == cached.tokens)
print(cached.tokens)'''),
        new_markdown_cell("""## The memory formula, next to the measurement

Every layer keeps a key **and** a value (the 2) for every key/value head, every head dimension,
every token and every sequence of the batch, each element taking some bytes:

**bytes = 2 × layers × kv_heads × head_dim × tokens × batch × bytes_per_element**"""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
tokens = cache.seq_len
bytes_per_element = cache.keys[0].element_size()   # float32: 4 bytes
formula = kvlab.kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, tokens, batch=1,
                               bytes_per_element=bytes_per_element)
measured = cache.memory().allocated_bytes
print(f"formula : 2 x {cfg.num_layers} layers x {cfg.num_kv_heads} kv_heads x {cfg.head_dim} head_dim x {tokens} tokens"
      f" x 1 sequence x {bytes_per_element} bytes = {formula:,} bytes")
print(f"measured: {measured:,} bytes allocated by the DynamicCache")
print("equal:", formula == measured)'''),
        new_markdown_cell("""## As the tokens grow, for every cache strategy

The panel generates with each strategy kvlab has and reads the cache's own accounting after every
step. Press **Run** (or read the saved figure below)."""),
        new_code_cell('''from kvlab.widgets import cache_memory_panel

memory_panel = cache_memory_panel(model)
memory_panel'''),
        new_code_cell('''memory_result = memory_panel.run()
memory_result.show()'''),
        new_markdown_cell("""**Reading the figure.** `dynamic` follows the formula exactly: it grows with every token.
`static` reserves room for the whole request (prompt + tokens to generate) at the start: a flat
line, part of it reserved but still empty. `quantized` keeps its newest 64 tokens at full
precision and packs older ones into 4 bits with a scale per group, so its line bends down past 64
tokens. `offloaded` keeps every layer in a slower memory tier (on a CPU machine, a file) and only
a small working buffer on the compute device: less device memory, but bytes moved at every step.

## A calculator for real models

The same formula, for the shapes of published models (no weights needed to count bytes).
First, what one token costs in each, at 2 bytes per element (fp16):"""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
for name, c in kvlab.PUBLISHED_CONFIGS.items():
    per_token = c.kv_bytes_per_token(2)
    print(f"{name:20s} {c.num_layers:3d} layers x {c.num_kv_heads:2d} kv_heads x {c.head_dim:3d} head_dim"
          f" -> {per_token / 1024:7,.0f} KiB per token, {per_token * 4096 / 2**30:6.2f} GiB for 4,096 tokens")'''),
        new_markdown_cell("""Now pick a model, a context length, a batch and a GPU. The calculator recomputes as you move the
controls; the dashed line is the memory left for the cache once fp16 weights are loaded."""),
        new_code_cell('''from kvlab.widgets import kv_calculator_panel

calculator = kv_calculator_panel("Llama-3-8B (GQA)", context=8192, batch=8, gpu_gib=80)
calculator'''),
        new_code_cell('''calculator.run().show()'''),
        new_markdown_cell("""### Try it

- Switch between **Llama-2-7B (MHA)** and **Llama-3-8B (GQA)** at the same context. Why is the
  second cache 4 times smaller, although the models are about the same size? (Count the kv_heads.)
- After exercise 2 below: how many conversations of 32K tokens fit at int4 instead of fp16?
- Try **Llama-3-70B** on a 24 GiB GPU. What does "at most 0 sequences" mean for a service?
- In the memory panel, generate fewer than 64 tokens in total: does `quantized` save anything yet?"""),
        *exercise_cells(
            "the formula by hand",
            """How many bytes of KV cache does **Llama-3-8B (GQA)** need for one conversation of 8,192 tokens
with an fp16 cache? Use the formula above with the numbers in
`kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]` (`num_layers`, `num_kv_heads`, `head_dim`), not
`kv_cache_bytes` itself.""",
            "check_kv_bytes", "a number of bytes",
            """```python
c = kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]
answer = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 8192 * 1 * 2   # 1,073,741,824 bytes = 1 GiB
```
The 2 counts K and V; `num_kv_heads` is 8, not the 32 query heads, thanks to grouped-query attention;
fp16 takes 2 bytes per element."""),
        *exercise_cells(
            "conversations per GPU",
            """Weights and cache in fp16, one 80 GiB GPU: how many conversations of 32,768 tokens of
Llama-3-8B fit at once? The weights take `num_parameters() * 2` bytes, and 1 GiB is 2**30 bytes.
Ignore everything else a real server keeps in memory.""",
            "check_sequences_that_fit", "a whole number of sequences",
            """```python
c = kvlab.PUBLISHED_CONFIGS["Llama-3-8B (GQA)"]
per_sequence = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 32768 * 2
answer = (80 * 2**30 - c.num_parameters() * 2) // per_sequence
```
Each conversation holds 4 GiB of cache, and the fp16 weights leave about 65 GiB of the 80.
`kvlab.experiments.max_sequences("Llama-3-8B (GQA)", 32768, 80)` does the same count."""),
        *exercise_cells(
            "what the cache keeps",
            """Two users send exactly the same prompt, one after the other, to a server that uses a KV cache.
What does the first request's KV cache do for the second?

- **a** the second user gets the stored answer back without the model running;
- **b** nothing by itself: it held the keys and values of the first generation only, and was freed when that ended;
- **c** it guarantees the second answer is identical, because it stores the sampled tokens.""",
            "check_what_the_cache_keeps", 'a letter: "a", "b" or "c"',
            """```python
answer = "b"
```
A KV cache is the working memory of one generation, not a cache of responses. Servers with
**prefix caching** (notebook 07) can keep the keys and values of a shared prompt prefix for later
requests and skip part of their prefill; every token of every answer is still generated."""),
        new_markdown_cell("""## Summary

- Keys and values of past tokens never change, so they can be stored: that store, per layer, is
  the KV cache. It makes generation faster and leaves its output unchanged.
- Its size is 2 × layers × kv_heads × head_dim × tokens × batch × bytes per element, and kvlab's
  caches allocate exactly that (`dynamic`), reserve more up front (`static`), or trade precision
  or location for memory (`quantized`, `offloaded`).
- For served models the cache, not the weights, often decides how many requests fit at once:
  context length and batch multiply it, and grouped-query attention and lower precision divide it.
- Behind this notebook: `kvlab.cache`, `kvlab.experiments.measure_cache_memory`,
  `kv_memory_table`, `max_sequences`; tests in `tests/test_experiments_memory.py`."""),
        new_markdown_cell(navigation(entry)),
    ]


BUILDERS = {"00_start_here.ipynb": start_here, "01_the_slowdown.ipynb": the_slowdown,
            "02_kv_cache.ipynb": kv_cache}


def assemble(file: str, cells: list) -> nbformat.NotebookNode:
    """A notebook from its cells, with stable ids ("NN-ii") so that regenerating gives a clean diff."""
    nb = new_notebook(cells=cells, metadata={"kernelspec": KERNELSPEC, "language_info": {"name": "python"}})
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{file[:2]}-{i:02d}"
    return nb


def build(file: str) -> nbformat.NotebookNode:
    return assemble(file, BUILDERS[file]())


def write_notebook(file: str, cells, description: str | None = None) -> None:
    """The command line of one notebook's generator (scripts/nb_*.py): build, optionally --execute, write."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execute", action="store_true", help="run the notebook and store its outputs")
    args = parser.parse_args()
    NOTEBOOK_DIR.mkdir(exist_ok=True)
    nb = assemble(file, cells())
    note = f" (executed in {execute(nb):.1f} s)" if args.execute else ""
    nbformat.validate(nb)
    nbformat.write(nb, NOTEBOOK_DIR / file)
    print(f"wrote notebooks/{file}{note}")


def machine_paths() -> list[str]:
    """Absolute paths of this machine that must never end up in a committed notebook."""
    paths = {str(ROOT), str(Path.home()), sys.prefix, sys.base_prefix, os.getcwd()}
    return sorted((p for p in paths if p and p != "/"), key=len, reverse=True)


def execute(nb: nbformat.NotebookNode) -> float:
    from nbclient import NotebookClient

    start = time.perf_counter()
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()
    seconds = time.perf_counter() - start
    text = nbformat.writes(nb)
    leaked = [p for p in machine_paths() if p in text]
    if leaked:
        raise SystemExit(f"an output holds this machine's path(s) {leaked}; fix the cell that prints it")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--execute", action="store_true", help="run each notebook and store its outputs")
    parser.add_argument("only", nargs="*", help="notebook name prefixes to build (default: all)")
    args = parser.parse_args()
    NOTEBOOK_DIR.mkdir(exist_ok=True)
    for file in BUILDERS:
        if args.only and not any(file.startswith(p) for p in args.only):
            continue
        nb = build(file)
        note = ""
        if args.execute:
            note = f" (executed in {execute(nb):.1f} s)"
        nbformat.validate(nb)
        nbformat.write(nb, NOTEBOOK_DIR / file)
        print(f"wrote notebooks/{file}{note}")


if __name__ == "__main__":
    main()
