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
# - say what keys and values are, and why those of past tokens can be kept;
# - read a cache's K and V tensors and their shapes;
# - compute a cache's memory with the formula, for a tiny model and for real ones;
# - write a cache yourself.

# %% [markdown]
# ## Keys and values
#
# Inside every attention layer, each position of the text is turned into three vectors:
#
# - a **query**, the question this position puts to the earlier text;
# - a **key**, a label against which questions are scored;
# - a **value**, the content a position contributes in proportion to its score.
#
# To write the next token, the model scores the newest position's query against the keys of all
# earlier positions, turns the scores into weights that sum to one, and mixes their values. A
# position only looks backwards, so a token's key and value never change once computed.
# Recomputing them at every step (notebook 01, cache `"none"`) is wasted work; a **KV cache** keeps
# them, per layer, and each step adds only the new token's.

# %% [markdown]
# ## Look inside a cache
#
# A tiny Llama-style model (2 layers), on the CPU so that the numbers are the same everywhere,
# writes 8 tokens. What does its cache hold?

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
# One K and one V tensor per layer. Count the tokens: one fewer than the 15 of the prompt plus the 8
# generated, because the last token is fed back only by the next step.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons import verdicts

verdicts(out, "cache_holds_every_token_but_the_last")

# %% [markdown]
# The model has 4 query heads sharing 2 key/value heads: with
# [grouped-query attention](https://arxiv.org/abs/2305.13245) the cache stores only the K/V heads,
# half as many here.

# %% [markdown]
# ## Same tokens, with and without the cache
#
# The cache is a saving, not an approximation: in this run, in fp32 on a CPU, greedy decoding writes
# the same tokens with and without it. The two paths still add numbers in a different order, so a
# near-tie between two tokens can in principle flip one, in fp32 too. In reduced precision (fp16 or
# bf16), on any device, rounding is coarser and such flips are seen in practice
# ([a transformers report](https://github.com/huggingface/transformers/issues/36536), with and
# without a GPU; [PyTorch on reproducibility](https://pytorch.org/docs/stable/notes/randomness.html)).

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
# Every layer keeps a key **and** a value (the 2) for every key/value head, head dimension, token
# and sequence of the batch, each element taking some bytes:
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
# ### Going deeper: every cache strategy, as the tokens grow
#
# The panel generates with each strategy kvlab has and reads the cache's own accounting after every
# step. `dynamic` stores exactly what the tokens need, so it should follow the formula and grow with
# every token. `static` reserves room for the whole request (prompt + tokens to generate) at the
# start: a flat line, part of it reserved but still empty. `quantized` keeps its newest 64 tokens at
# full precision and packs older ones into 4 bits with a scale per group, so its line should bend
# down past 64 tokens (generate fewer in all: does it save anything?). `offloaded` keeps every layer
# in a slower memory tier (on a CPU machine, a file) and only a working buffer for one layer at a
# time on the compute device: less device memory, but bytes moved at every step (notebook 03).
# Byte counts do not depend on the machine, so these lines read the same everywhere.
#
# Behind this notebook: `kvlab.cache` (the interface in `base.py`, the growing cache in
# `dynamic.py`) and the folder `kvlab/lessons/l02_kv_cache/` (`memory.py`, `claims.py`,
# `exercises.py`).

# %%
from kvlab.lessons.l02_kv_cache.panel import cache_memory_panel

memory_panel = cache_memory_panel(model)
memory_panel

# %%
memory_result = memory_panel.run()
memory_result.show()

# %%
# NBVAL_CHECK_OUTPUT
verdicts(memory_result, "dynamic_memory_follows_the_formula", "static_reserves_the_whole_request",
         "quantized_saves_past_its_window", "offloaded_keeps_less_on_the_device", fold=True)

# %% [markdown]
# ## A calculator for real models
#
# The same formula works for the shapes of published models, no weights needed. Predict first:
# [Llama-2-7B](https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json) has 32 layers
# and 32 key/value heads of dimension 128. How many GiB of cache does one conversation of 4,096
# tokens take in fp16 (2 bytes per element)? Type your guess, then run the next cells.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("How many GiB of KV cache does Llama-2-7B (MHA) hold for one conversation of 4,096 tokens "
                "in fp16?", unit="GiB")
guess

# %%
from kvlab.experiments.memory import gib_for, published_kv_table

per_model = published_kv_table(tokens=4096, bytes_per_element=2)   # the formula for every published shape
guess.fold(per_model.round(2), what="this table")                 # folded until you guess: it holds the answer

# %%
# NBVAL_CHECK_OUTPUT
guess.against(per_model, gib_for("Llama-2-7B (MHA)"), what="the formula gives")

# %% [markdown]
# Now pick a model, a context, a batch and a GPU. The dashed line is the memory left for the cache
# once the fp16 weights are loaded. "At most N sequences" is an upper bound: a real server also
# needs memory for activations, and vLLM, for one, uses only a set fraction of the GPU
# ([`gpu_memory_utilization`](https://github.com/vllm-project/vllm/blob/main/vllm/config/cache.py)).

# %%
from kvlab.lessons.l02_kv_cache.panel import kv_calculator_panel

calculator = kv_calculator_panel("Llama-2-7B (MHA)", context=4096, batch=8, gpu_gib=80)
calculator

# %%
calculator.run().show()

# %% [markdown]
# ### Going deeper: a real model, where this machine is online
#
# Where the machine can reach the Hugging Face hub (Colab, most laptops), the cell below loads a real
# published model, [SmolLM2-135M](https://huggingface.co/HuggingFaceTB/SmolLM2-135M), with its own
# tokenizer: readable text, the slowdown of notebook 01 and the cache bytes at a scale you know.
# Offline it says so in one line.

# %%
from kvlab.experiments.real_model import real_model_demo, try_real_model

real, note = try_real_model()      # the model with its own tokenizer, or None offline
print(note)
if real is not None:
    demo = real_model_demo(real)   # readable text, none vs dynamic per token, cache bytes vs formula
    for name, table in demo.tables().items():
        display(table)
    display(verdicts(demo, "real_model_cache_is_the_formula", "real_model_is_slower_without_a_cache", fold=True))

# %% [markdown]
# ## Try it
#
# - **Llama-2-7B (MHA)**, the calculator's default, against
#   [**Llama-3-8B (GQA)**](https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json) at
#   the same context: why is the second cache 4 times smaller? (Count the kv_heads.)
# - **Llama-3-70B** on a GPU of `24 GiB`: what does "at most 0 sequences" mean for a service?

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
# - Keys and values of past tokens never change, so each layer can store them: the KV cache. It
#   saves time; in this run (fp32, on a CPU) it left the tokens unchanged.
# - Its size is `2 × layers × kv_heads × head_dim × tokens × batch × bytes_per_element`. For served
#   models it, not the weights, often decides how many requests fit: context and batch multiply it,
#   fewer K/V heads and lower precision divide it.

# %% [markdown]
# <!-- kvlab:navigation -->
