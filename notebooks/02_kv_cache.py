# %% [markdown]
# <!-- kvlab:header -->
# Notebook 01 showed what a KV cache saves: time. This one opens it up: what it stores, why what it
# stores can be reused, and what it costs in memory, first on a tiny model you can inspect, then on
# the shapes of models people actually serve.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - say what keys and values are, and why the ones of past tokens can be kept;
# - see a cache as K and V tensors per layer and read their shapes;
# - check that a cache changes the speed of generation, not its output;
# - write a cache yourself and check it writes the same tokens as no cache at all;
# - compute cache memory with the formula and check it against the bytes a cache really allocates;
# - estimate the memory of a real model at a given context and batch, and how many sequences fit on a GPU.

# %% [markdown]
# ## Keys and values
#
# Inside every attention layer, each position of the text is turned into three vectors:
#
# - a **query**, the question this position puts to the earlier text;
# - a **key**, a label every position carries, against which questions are scored;
# - a **value**, the content a position contributes in proportion to its score.
#
# To write the next token, the model scores the newest position's query against the keys of all
# earlier positions (a dot product each), turns the scores into weights that sum to one, and
# takes the weighted mix of their values. In a
# decoder a position only looks backwards, so the key and value of a token, once computed, never
# change. Recomputing them at every step (notebook 01, cache `"none"`) is wasted work. A **KV
# cache** keeps them, for every layer, and each step adds only the new token's key and value.
#
# This cache is not a cache of answers: it holds the internal state of **one** ongoing generation
# and is thrown away when that generation ends.

# %% [markdown]
# ## Look inside a cache
#
# A tiny Llama-style model (2 layers, 4 query heads sharing 2 key/value heads), on the CPU so that
# the printed numbers are the same on every machine. We generate 8 tokens and look at what the
# cache holds.

# %%
# NBVAL_CHECK_OUTPUT
model = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cpu")
cfg = model.config
prompt = "The cache keeps"                    # 15 bytes = 15 tokens with the built-in byte tokenizer
out = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=8)
cache = out.cache
print(cache)
for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
    print(f"layer {layer}: K {tuple(k.shape)}  V {tuple(v.shape)}   (batch, kv_heads, tokens, head_dim)")

# %% [markdown]
# Each layer stores one K and one V tensor of shape (batch, kv_heads, tokens, head_dim). Count the
# tokens: the prompt has 15 and we generated 8, yet the cache holds one fewer than 15 + 8. The
# last generated token has not been fed back yet; it would be on the next step.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons import verdicts

verdicts(out, "cache_holds_every_token_but_the_last")

# %% [markdown]
# This model has 2 key/value heads for 4 query heads: with **grouped-query attention** two query
# heads share one K/V head, which halves the cache.

# %% [markdown]
# ## Same tokens, with and without the cache
#
# The cache is a saving, not an approximation: with greedy decoding, cached and uncached generation
# must write exactly the same tokens. (This cell is checked by the test suite.)

# %%
# NBVAL_CHECK_OUTPUT
uncached = kvlab.generate(model, prompt, cache="none", max_new_tokens=20)
cached = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=20)
print(cached.tokens)
runs = {"none": uncached, "dynamic": cached}
verdicts(runs, "cached_and_uncached_write_the_same_tokens")

# %% [markdown]
# ## The memory formula, next to the measurement
#
# Every layer keeps a key **and** a value (the 2) for every key/value head, every head dimension,
# every token and every sequence of the batch, each element taking some bytes:
#
# **`bytes = 2 × layers × kv_heads × head_dim × tokens × batch × bytes_per_element`**

# %%
# NBVAL_CHECK_OUTPUT
tokens = cache.seq_len
bytes_per_element = cache.keys[0].element_size()   # float32: 4 bytes
formula = kvlab.kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, tokens, batch=1,
                               bytes_per_element=bytes_per_element)
measured = cache.memory().allocated_bytes
print(f"formula : 2 x {cfg.num_layers} layers x {cfg.num_kv_heads} kv_heads x {cfg.head_dim} head_dim x {tokens} tokens"
      f" x 1 sequence x {bytes_per_element} bytes = {formula:,} bytes")
print(f"measured: {measured:,} bytes allocated by the DynamicCache")
verdicts(out, "dynamic_cache_allocates_the_formula")

# %% [markdown]
# ## As the tokens grow, for every cache strategy
#
# The panel generates with each strategy kvlab has and reads the cache's own accounting after every
# step. Press **Run** (or read the saved figure below).

# %%
from kvlab.lessons.l02_kv_cache.panel import cache_memory_panel

memory_panel = cache_memory_panel(model)
memory_panel

# %%
memory_result = memory_panel.run()
memory_result.show()

# %% [markdown]
# **Reading the figure.** `dynamic` stores exactly what the tokens need, so it should follow the
# formula and grow with every token. `static` reserves room for the whole request (prompt + tokens
# to generate) at the start: a flat line, part of it reserved but still empty. `quantized` keeps
# its newest 64 tokens at full precision and packs older ones into 4 bits with a scale per group,
# so its line should bend down once it holds more than 64 tokens. `offloaded` keeps every layer in
# a slower memory tier (on a CPU machine, a file) and only a working buffer for one layer at a time
# on the compute device: less device memory, but bytes moved at every step (notebook 03 measures
# them). Byte counts do not depend on the machine, so these lines read the same everywhere:

# %%
# NBVAL_CHECK_OUTPUT
verdicts(memory_result, "dynamic_memory_follows_the_formula", "static_reserves_the_whole_request",
         "quantized_saves_past_its_window", "offloaded_keeps_less_on_the_device")

# %% [markdown]
# ## A calculator for real models
#
# The same formula, for the shapes of published models (no weights needed to count bytes).
# Before you run the table below, **predict**: Llama-2-7B has 32 layers, 32 key/value heads of
# dimension 128. How much cache does one conversation of 4,096 tokens take in fp16? Type your guess
# in the box (in GiB), then run the next two cells.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("How many GiB of KV cache does Llama-2-7B (MHA) hold for one conversation of 4,096 tokens "
                "in fp16?", unit="GiB")
guess

# %% [markdown]
# What one token costs in each model, at 2 bytes per element (fp16), and what 4,096 tokens cost:

# %%
# NBVAL_CHECK_OUTPUT
lines = []
for name, c in kvlab.PUBLISHED_CONFIGS.items():
    per_token = c.kv_bytes_per_token(2)
    lines.append(f"{name:20s} {c.num_layers:3d} layers x {c.num_kv_heads:2d} kv_heads x {c.head_dim:3d} head_dim"
                 f" -> {per_token / 1024:7,.0f} KiB per token, {per_token * 4096 / 2**30:6.2f} GiB for 4,096 tokens")
guess.fold("\n".join(lines))   # folded until you type your guess above: it holds the answer

# %%
# NBVAL_CHECK_OUTPUT
guess.against(kvlab.PUBLISHED_CONFIGS["Llama-2-7B (MHA)"].kv_bytes_per_token(2) * 4096 / 2**30,
              what="the formula gives")

# %% [markdown]
# Now pick a model, a context length, a batch and a GPU. The calculator recomputes as you move the
# controls; the dashed line is the memory left for the cache once fp16 weights are loaded.

# %%
from kvlab.lessons.l02_kv_cache.panel import kv_calculator_panel

calculator = kv_calculator_panel("Llama-3-8B (GQA)", context=8192, batch=8, gpu_gib=80)
calculator

# %%
calculator.run().show()

# %% [markdown]
# ## A real model, where this machine is online
#
# Everything above ran on small models made for the lab. Where the machine can reach the Hugging
# Face hub (Colab, most laptops), the cell below loads a real published model (SmolLM2-135M) with
# its own tokenizer: readable text, the slowdown of notebook 01 and the cache bytes at a scale you
# know. Offline (a workshop without internet, or the tests) it says so in one line and the lesson
# goes on with the shipped models.

# %%
from kvlab.lessons.l02_kv_cache.real_model import real_model_demo, try_real_model

real, note = try_real_model()      # the model with its own tokenizer, or None offline
print(note)
if real is not None:
    demo = real_model_demo(real)   # readable text, none vs dynamic per token, cache bytes vs formula
    for name, table in demo.tables().items():
        display(table)
    display(verdicts(demo, "real_model_cache_is_the_formula", "real_model_is_slower_without_a_cache"))

# %% [markdown]
# ### Try it
#
# - Switch between **Llama-2-7B (MHA)** and **Llama-3-8B (GQA)** at the same context. Why is the
#   second cache 4 times smaller, although the models are about the same size? (Count the kv_heads.)
# - After exercise 2 below: how many conversations of 32K tokens fit at int4 instead of fp16?
# - Try **Llama-3-70B** on a GPU of `24 GiB`. What does "at most 0 sequences" mean for a service?
# - In the memory panel, generate fewer than 64 tokens in total: does `quantized` save anything yet?

# %% [markdown]
# <!-- kvlab:exercise check_kv_bytes -->

# %% [markdown]
# <!-- kvlab:exercise check_sequences_that_fit -->

# %% [markdown]
# <!-- kvlab:exercise check_what_the_cache_keeps -->

# %% [markdown]
# <!-- kvlab:exercise check_my_cache -->

# %% [markdown]
# ## Summary
#
# - Keys and values of past tokens never change, so they can be stored: that store, per layer, is
#   the KV cache. It makes generation faster and leaves its output unchanged.
# - Its size is `2 × layers × kv_heads × head_dim × tokens × batch × bytes_per_element`, and kvlab's
#   caches allocate exactly that (`dynamic`), reserve more up front (`static`), or trade precision
#   or location for memory (`quantized`, `offloaded`); the verdicts above check each on your run.
# - For served models the cache, not the weights, often decides how many requests fit at once:
#   context length and batch multiply it, and grouped-query attention and lower precision divide it.
# - A cache is a dozen lines: per layer, append the new K and V along the token axis and hand back
#   everything stored; `seq_len` tells the model where the next token stands (exercise 4).
# - Behind this notebook: `kvlab.cache` (the interface in `base.py`, the growing cache in
#   `dynamic.py`), and its folder `kvlab/lessons/l02_kv_cache/`: `memory.py` (`measure_cache_memory`,
#   `kv_memory_table`, `max_sequences`), the claims in `claims.py`, the checkers in `exercises.py`;
#   tests in `tests/test_experiments_memory.py`, `tests/test_claims_02.py` and `tests/test_exercises_build.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
