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
# - measure the time of every token and the cumulative time, without a cache (`"none"`) and with one (`"dynamic"`);
# - predict the slowdown from the work done at each step, and explain why the measurement falls short of the
#   prediction: a pass over many tokens costs far less per token than a pass over one.
# - explain why, even with a cache, a step slows slowly as the context grows: it reads every stored key and value.

# %% [markdown]
# ## The idea
#
# A language model writes one token at a time, and every new token depends on all the text before
# it. If the model remembers nothing between steps, the only way to take that text into account is
# to push **all of it** through every layer again: the prompt, plus every token written so far.
# With a prompt of *T* tokens, the step that writes token *i* processes *T + i* tokens. Each step
# does a little more work than the last, so each step takes a little longer.
#
# A **KV cache** keeps what earlier steps already computed for each position (their keys and values,
# the subject of notebook 02). Then each step only has to process the one new token and read the
# stored history.
#
# | cache | tokens processed by the step that writes token *i* | grows with *i*? |
# |---|---|---|
# | `"none"` | *T + i* | yes, by one token per step |
# | `"dynamic"` | 1 (and it reads *T + i* stored keys and values) | hardly at first; the reading grows, slowly |
#
# Both start with the same step 0, the **prefill**, which processes the whole prompt once.

# %% [markdown]
# ## The model
#
# A Llama-style decoder of about 3 million parameters with random weights. Its text is gibberish,
# but the arithmetic, and therefore the time, is exactly that of a trained model of this shape.
# It is small so that the experiment takes seconds on two CPU cores.

# %%
from kvlab.lessons.l01_the_slowdown.slowdown import slowdown_model

model = slowdown_model()
cfg = model.config
print(f"{cfg.name}: {model.num_parameters() / 1e6:.1f}M parameters, {cfg.num_layers} layers, "
      f"hidden size {cfg.hidden_size}, {cfg.num_heads} query heads sharing {cfg.num_kv_heads} key/value heads")

# %% [markdown]
# ## The experiment
#
# The same prompt is generated with each cache, three times over, and every step is timed. Each
# step counts its fastest run: other programs on the machine can only add time to a step, never
# remove it. Runs use one CPU thread, so that a step never waits for a second core that another
# program holds (`run_slowdown(threads=...)` changes it).
#
# Before you press **Run**, predict. Without a cache, the step that writes an early token (a tenth
# of the way into the answer) and the step that writes a late one (near the end) both recompute the
# prompt and every token so far, the late one many more of them (the table in *The idea* counts
# them). How many times as long as the early step will the late one take? Type your number in the
# box, then press **Run**, and afterwards try other settings.

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
from kvlab.lessons.l01_the_slowdown.slowdown import slowdown_fit, slowdown_summary

guess.against(slowdown_summary(result.frame).set_index("cache").at["none", "measured_ratio"])

# %% [markdown]
# **Reading the figure.** Left: the time of each step. Without a cache (`none`, red) each step
# recomputes one token more than the one before, so the line should climb; with one (`dynamic`,
# blue) each step computes one token, so at this short context it should stay nearly flat (it
# still reads every stored key and value, a cost that shows at long context, measured further down). Right: when each token arrived. A
# steady pace is a straight line; a line that bends upward means every token waited longer than
# the one before. What your run shows, checked on its numbers:

# %%
from kvlab.lessons import verdicts

verdicts(result, "uncached_tokens_slow_down", "cached_steps_stay_flat", "uncached_wait_gap_widens", after=guess)

# %% [markdown]
# ## Expected against measured
#
# If time were proportional to the tokens processed, a late step would take
# (*T* + late) / (*T* + early) times as long as an early one without a cache, and just as long
# with one. The table compares that **work ratio** with the **measured ratio** (the median step
# time of the 11 tokens around each).

# %%
guess.fold(slowdown_summary(result.frame)[["cache", "early_token", "late_token", "early_step_ms", "late_step_ms",
                                           "measured_ratio", "work_ratio"]])

# %% [markdown]
# ## Why the measurement falls short of the work
#
# Divide each step's time by the tokens it pushed through the model: that is what one token cost
# in that step. A cached step processes one token per pass; an uncached step processes the whole
# text so far in one pass.

# %%
from kvlab.lessons.l01_the_slowdown.slowdown import per_token_costs

per_token_costs(result.frame)

# %%
verdicts(result, "many_tokens_per_pass_cost_less_each", "measured_slowdown_below_work")

# %% [markdown]
# A pass over many tokens costs far less per token than a pass over one: the lesson of the
# prefill in notebook 00. Some of the work of a pass is done once, however many tokens it holds:
# every weight is read from memory, every operation is started, Python runs between them, and
# the output layer scores the next token for the last position only (in both paths). A cached
# step pays all of that for a single token; an uncached step shares it among all the tokens of
# its pass, and its matrix products keep the arithmetic units busy. The measured ratio is the
# work ratio times (cost per token of the late step) / (cost per token of the early step), so it
# falls short of the work ratio exactly by how much cheaper each token got.
#
# A straight line through the uncached step times splits them into the two parts: `fixed_ms`,
# where the line meets zero context, and `us_per_context_token`, what each token of text adds to
# **every** later step. The line extends the measured steps down to zero context, so it is an
# estimate: a change of load on the machine during the run tilts it, and `fixed_low_ms` to
# `fixed_high_ms` is how far resampling this run's steps moves it. Compare the fixed part with a
# whole cached step, which pays the same per-pass costs for one token and its cache's own work
# besides (kvlab's dynamic cache copies its keys and values into a longer tensor every step):

# %%
slowdown_fit(result.frame)

# %%
verdicts(result, "uncached_steps_share_a_per_pass_cost")

# %% [markdown]
# If the fixed part comes out several times a cached step, the cost per token was still falling
# across the measured steps: the curve bends, and a straight line through it meets zero high.
# Either way the per-token table above is the direct measurement; the line is a summary of it. With a cache, a token of context adds
# only the cost of reading its stored keys and values (the `dynamic` row of the fit): small per
# token, but paid by every later step, as the next section measures. Once a pass
# holds enough tokens to keep the machine busy, its cost per token stops falling and time follows
# the work: a larger model gets there with fewer tokens.
#
# ## With a cache, at long context
#
# The cached line above looked flat, but over a few hundred tokens only. A cached step computes one
# new token, yet its attention reads the stored key and value of **every** earlier position, in
# every layer: `context × 2 × layers × kv_heads × head_dim × bytes_per_element` bytes per step (4
# bytes in kvlab's fp32; 2 in the fp16 or bf16 most GPU serving uses), the memory formula of
# notebook 02. At a short context that read is small next to the rest of the step (the weights,
# starting each operation); as the context grows it becomes a larger part of it. The cell
# below prefills prompts of four lengths, from a short one to nearly the model's whole context, and
# times a few cached decode steps after each (the fastest of three runs, as before).

# %%
from kvlab.lessons.l01_the_slowdown.long_context import context_step_summary, run_context_steps

long_run = run_context_steps(model)
display(context_step_summary(long_run).round(3))
verdicts(long_run, "cached_steps_grow_at_long_context")

# %% [markdown]
# So "flat" holds at a short context only. With a cache a step costs a fixed part plus a read of
# the whole history, and that read grows by one token's K/V with every token written: a long answer
# slows gradually even with a cache, far less than without one. On a small model on a CPU it takes
# a long context to show; on a large model serving long contexts the history a step reads can
# approach the size of the weights, and a decode step's attention is bound by reading it. So
# engines shrink the K/V itself (fewer key/value heads, as this model has; FP8 or quantized caches,
# notebook 03). Two names often credited here do other jobs. **FlashAttention** is IO-aware: it
# computes attention in tiles held in fast on-chip memory and never writes the full matrix of
# query–key scores to GPU memory, which saves most on long prompts (for decode, its split-K/V
# variant, Flash-Decoding, spreads one long history over the whole GPU). vLLM's **PagedAttention**
# is memory management: K/V in fixed-size blocks anywhere in the pool, so almost no memory is wasted
# and requests can share blocks (notebooks 07 and 08). Its paper reports the paged kernel somewhat
# slower than one reading contiguous memory (the block table costs lookups), paid back by the larger
# batches the saved memory allows.
#
# ### Try it
#
# - **Double the prompt** (64, then 128 tokens). Where does the red line start? Every uncached step,
#   the early ones too, now recomputes the whole longer prompt. Does the measured ratio come closer
#   to the work ratio? Compare the cost per token of the early and late steps.
# - **Generate 400 tokens.** How many seconds apart are the two curves at the end, and how does that
#   compare with 200 tokens? (The uncached *work* grows with the square of the length; does its
#   time grow as fast, given what you found above?)
# - **Long context:** `run_context_steps(model, contexts=(32, 1000), steps=16)`. How many milliseconds
#   does a step at the long context add to one at the short context, and how many MB more did it read?
# - **Repeats:** set *repeats* to 1 and run again. How much noisier is the left panel? Everything
#   else on this computer competes for the same cores.
#
# ## Exercises

# %% [markdown]
# <!-- kvlab:exercise check_work_ratio -->

# %% [markdown]
# <!-- kvlab:exercise check_total_processed -->

# %% [markdown]
# ## Summary
#
# - Without a cache, the step that writes token *i* reprocesses *T + i* tokens: step time grows with
#   position, and the total work grows with the square of the length of the answer.
# - With a KV cache each step processes one token, but its attention reads every stored key and value:
#   step time is nearly flat at a short context and rises slowly as the context grows, with the K/V
#   bytes each step reads.
# - The measured slowdown falls short of the work ratio because a pass over many tokens costs far
#   less per token than a pass over one: what a pass pays once is shared by all its tokens. The
#   verdicts under each table say whether your run showed it.
# - Behind this notebook: its folder `kvlab/lessons/l01_the_slowdown/`: `slowdown.py` (`run_slowdown`,
#   `slowdown_summary`, `per_token_costs`, `slowdown_fit`), `long_context.py` (`run_context_steps`,
#   `context_step_summary`), `figures.py` (`plot_slowdown`) and the claims in `claims.py`; tests in
#   `tests/test_experiments_slowdown.py`, `tests/test_experiments_long_context.py` and `tests/test_claims_01.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
