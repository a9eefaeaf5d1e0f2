# %% [markdown]
# <!-- kvlab:header -->
# Ask a model for a long answer and watch the tokens arrive: without the right machinery the pace
# drops as the answer grows. Nothing is broken and the network is fine; the slowdown comes from
# how text is generated. This notebook measures it.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - explain why, without a KV cache, each new token takes longer than the one before;
# - predict the slowdown from the tokens each step processes, and measure it;
# - explain why the measurement falls short of that prediction.

# %% [markdown]
# ## The idea
#
# A language model writes one token at a time, and each new token depends on all the text before
# it. If the model remembers nothing between steps, every step pushes **all of it** through every
# layer again: with a prompt of *T* tokens, the step that writes token *i* processes *T + i* tokens.
#
# A **KV cache** keeps what earlier steps computed for each position (their keys and values,
# notebook 02). Then each step processes only the new token and reads the stored history.
#
# | cache | tokens processed by the step that writes token *i* |
# |---|---|
# | `"none"` | *T + i*: one more every step |
# | `"dynamic"` | 1 (and it reads *T + i* stored keys and values) |
#
# Both start with the same step 0, the **prefill**, which processes the whole prompt once.

# %% [markdown]
# ## The model
#
# A Llama-style decoder of about 3 million parameters with random weights: gibberish text, but the
# arithmetic, and so the time, of a trained model of this shape, in seconds on two CPU cores.

# %%
from kvlab.experiments.slowdown import slowdown_model

model = slowdown_model()
cfg = model.config
weights_mib = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
print(f"{cfg.name}: {model.num_parameters() / 1e6:.1f}M parameters ({weights_mib:.1f} MiB of weights), "
      f"{cfg.num_layers} layers, hidden size {cfg.hidden_size}, {cfg.num_heads} query heads sharing "
      f"{cfg.num_kv_heads} key/value heads")

# %% [markdown]
# ## The experiment
#
# The panel generates the same prompt with each cache, three times, and times every step (each step
# counts its fastest run: other programs can only add time), on one thread: a model this small gains
# little from more.
#
# First, predict. Without a cache, the step of a late token (near the end) processes many more
# tokens than the step of an early one (a tenth of the way in). How many times as long will it take?
# Type your number, then run the next cells.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("Without a cache, how many times as long as the step of an early token (a tenth of the way "
                "into the answer) will the step of a late token (near the end) take?", unit="×")
guess

# %%
from kvlab.lessons.l01_the_slowdown.panel import slowdown_panel

panel = slowdown_panel(model).folded_until(guess)  # its figure answers the prediction above
panel

# %%
result = panel.run()   # the same as pressing Run with the settings above
display(guess.fold(result, what="this run's table and figure"))

# %%
from kvlab.experiments.slowdown import late_over_early

guess.against(result, late_over_early)

# %% [markdown]
# **Reading the figure.** Left: the time of each step. Without a cache (`none`, red) each step
# processes one token more than the last, so the line climbs; with one (`dynamic`, blue) it stays
# nearly flat. Right: when each token arrived. A steady pace is a straight line; a line that bends
# upward means each token waited longer than the one before. Your run, checked:

# %%
from kvlab.lessons import verdicts

verdicts(result, "uncached_tokens_slow_down", "cached_steps_stay_flat", "uncached_wait_gap_widens", after=guess)

# %% [markdown]
# ## Expected against measured
#
# If time were proportional to the tokens processed, a late uncached step would take
# (*T* + late) / (*T* + early) times as long as an early one: the **work ratio**. The table sets it
# beside the **measured ratio** (median step time of the 11 tokens around each).

# %%
from kvlab.experiments.slowdown import slowdown_summary

guess.fold(slowdown_summary(result.frame)[["cache", "early_token", "late_token", "early_step_ms", "late_step_ms",
                                           "measured_ratio", "work_ratio"]])

# %% [markdown]
# ## Why the measurement falls short of the work
#
# Divide each step's time by the tokens it pushed through the model: what one token cost in that
# step.

# %%
from kvlab.experiments.slowdown import per_token_costs

per_token_costs(result.frame)

# %% [markdown]
# Some of a pass's cost is paid once, however many tokens it holds: every operation is started,
# Python runs between them, every weight is read. This model's weights (the MiB printed above) fit
# in the caches of a CPU whose L2/L3 holds tens of MiB (many server CPUs; not every laptop), and
# there the first two dominate; on a large model on a GPU, reading the weights does (notebook 05).
# A cached step pays all that for one token; an uncached step shares it among all the tokens of its
# pass. So a token gets cheaper as the pass grows, and the measured ratio falls short of the work
# ratio mostly by that.
#
# "Tokens processed" also undercounts one part: attention compares each token of the pass with
# every token before it, work that grows with the **square** of the length. Once a pass holds enough
# tokens to keep the machine busy, its cost per token stops falling, and that square term makes long
# uncached steps grow *faster* than the work ratio. At these short lengths on a small model the
# shared cost usually wins; by how much depends on the CPU:

# %%
display(verdicts(result, "measured_slowdown_below_work"))
verdicts(result, "many_tokens_per_pass_cost_less_each", fold=True)

# %% [markdown]
# ### Going deeper: a line through the uncached steps
#
# A straight line through the uncached step times splits them into two parts: `fixed_ms`, where the
# line meets zero context, and `us_per_context_token`, what each token of text adds to **every**
# later step. The line extends the measured steps down to zero context, so it is an estimate: a
# change of load during the run tilts it, and `fixed_low_ms` to `fixed_high_ms` is how far
# resampling this run's steps moves it. Compare the fixed part with a whole cached step, which pays
# the same per-pass costs for one token and its cache's own work besides (kvlab's dynamic cache
# copies its keys and values into a longer tensor every step). If the fixed part comes out several
# times a cached step, the cost per token was still falling across the measured steps: the curve
# bends, and a straight line through it meets zero high. The per-token table above is the direct
# measurement; the line summarises it.

# %%
from kvlab.experiments.slowdown import slowdown_fit

slowdown_fit(result.frame)

# %%
verdicts(result, "uncached_steps_share_a_per_pass_cost", fold=True)

# %% [markdown]
# ### Going deeper: with a cache, at long context
#
# The cached line looked flat, but over a few hundred tokens only. A cached step computes one new
# token, yet its attention reads the stored key and value of **every** earlier position, in every
# layer (and kvlab's dynamic cache also copies them into a longer tensor every step):
# `context × 2 × layers × kv_heads × head_dim × bytes_per_element` bytes per step (4 bytes in
# kvlab's fp32, 2 in fp16 or bf16), the memory formula of notebook 02. The cell below prefills prompts of four lengths,
# up to nearly the model's whole context, and times a few cached decode steps after each (the
# fastest of three runs).

# %%
from kvlab.experiments.long_context import context_step_summary, run_context_steps

long_run = run_context_steps(model)
display(context_step_summary(long_run).round(3))
verdicts(long_run, "cached_steps_grow_at_long_context", fold=True)

# %% [markdown]
# So "flat" holds at a short context only: with a cache a step costs a fixed part plus a read (and,
# in kvlab's dynamic cache, a copy) of the whole history, which grows by one token's K/V with every
# token written. On a small model on a CPU it takes a long context to show; on a large model serving
# long contexts the history a step reads can approach the size of the weights. So engines shrink the
# K/V itself: fewer key/value heads
# ([grouped-query attention](https://arxiv.org/abs/2305.13245), as this model has), or an
# [FP8 KV cache in vLLM](https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/)
# (quantized caches: notebook 03).
#
# Two names often credited here do other jobs.
# [FlashAttention](https://arxiv.org/abs/2205.14135) is IO-aware: it computes attention in tiles
# held in fast on-chip memory and never writes the full matrix of query–key scores to GPU memory;
# for decode, its [Flash-Decoding](https://crfm.stanford.edu/2023/10/12/flashdecoding.html) variant
# splits one long history into chunks processed in parallel across the GPU.
# [PagedAttention](https://arxiv.org/abs/2309.06180) (vLLM) is an attention algorithm and kernel
# that reads K/V from fixed-size blocks anywhere in the pool, through each sequence's block table
# (§3); vLLM's
# [KV cache manager](https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/kv_cache_manager.py)
# hands those blocks out (§4 of the paper), with near-zero waste and blocks shared between requests
# (notebooks 07 and 08). The paper measures the PagedAttention kernel somewhat slower than one
# reading contiguous memory (§7.1: the block table costs lookups), paid back by the larger batches
# the saved memory allows.

# %% [markdown]
# ## Try it
#
# - **Double the prompt** (64, then 128 tokens). Does the measured ratio come closer to the work
#   ratio? Compare the cost per token of the early and late steps.
# - **Generate 400 tokens.** How far apart are the two curves at the end, against 200 tokens?
# - **Repeats 1**: how much noisier is the left panel?
#
# ## Exercises

# %% [markdown]
# <!-- kvlab:exercise check_work_ratio -->

# %% [markdown]
# <!-- kvlab:exercise check_total_processed -->

# %% [markdown]
# ## Summary
#
# - Without a cache, the step that writes token *i* reprocesses *T + i* tokens, so each step takes
#   longer than the last; with a KV cache each step processes one token.
# - The measured slowdown falls short of the ratio of tokens processed: what a pass pays once is
#   shared by all its tokens. Attention's work grows with the square of the length, so at long
#   contexts the uncached steps can catch up with that ratio and overtake it (not shown at these sizes).

# %% [markdown]
# <!-- kvlab:navigation -->
