# %% [markdown]
# <!-- kvlab:header -->
# The previous notebook counted how many sequences fit a KV budget. This one runs the engine at the
# edge of it: what happens when the budget runs out, how a prompt prefix shared by many requests is
# computed once, and how a long prompt is kept from stalling everyone else's answers.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - recognise preemption and what it costs;
# - measure what prefix caching saves, and count the reused blocks by hand;
# - say how chunked prefill keeps the gaps between tokens steady, and who pays for it.

# %%
# %matplotlib inline
import pandas as pd
from kvlab.lessons import verdicts
from kvlab.experiments.serving_run import FixedStepCostExecutor, lesson_model, runs_frame

model = lesson_model()

# %% [markdown]
# ## When the budget runs out: preemption
#
# The engine admits a request when its prompt fits, not its answer. When the running answers outgrow
# the pool, one sequence gives its blocks back and waits; when it returns, its prompt and the tokens
# it wrote are computed again. This is **preemption by recompute**, as in
# [vLLM](https://docs.vllm.ai/en/stable/configuration/optimization/#preemption). Nothing is lost but time.
#
# Twelve requests with long answers and a pool of 40 blocks. Press **Run**, then move the budget.

# %%
from kvlab.lessons.l08_prefix_and_chunks.panel import kv_budget_panel

panel = kv_budget_panel(model)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %% [markdown]
# Each red triangle is a sequence sent back to the queue. The same requests with room for all of
# them (192 blocks), for comparison:

# %%
from kvlab.experiments.prefix_and_chunks import preemption_runs, preemption_table
from kvlab.lessons.l08_prefix_and_chunks.figures import plot_kv_blocks

ample = preemption_runs(model, kv_blocks=(None,))
budgets = pd.concat([preemption_table(ample), result.frame.attrs["preemption"]], ignore_index=True)
display(budgets.round(3))
plot_kv_blocks(pd.concat([ample[0].trace, result.frame.attrs["trace"]]), by="run", block_size=16)

# %%
verdicts(budgets, "tight_budget_costs_time")

# %% [markdown]
# The tight pool pays twice: tokens computed again, and fewer sequences per step.

# %% [markdown]
# <!-- kvlab:exercise check_recomputed_tokens -->

# %% [markdown]
# ## Going deeper: counting the recomputed tokens exactly
#
# Serving each request once computes prompt + output − 1 tokens; everything above that was
# recomputed. kvlab's engine preempts the most recently admitted sequence. On a virtual clock with a
# fixed cost per step the counts are exact and the same on every machine:

# %%
# NBVAL_CHECK_OUTPUT
exact = preemption_runs(model, kv_blocks=(None, 40), executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")
print(preemption_table(exact)[["run", "preemptions", "recomputed_tokens", "peak_running", "peak_blocks_used",
                               "steps", "mean_batch", "completed"]].round(2).to_string(index=False))
verdicts(exact, "tight_budget_preempts_and_recomputes", "tight_budget_runs_fewer_sequences_per_step", fold=True)

# %% [markdown]
# ## Prefix caching: a shared system prompt
#
# Many requests start with the same text, so their first blocks hold the same keys and values. With
# **prefix caching** the engine names every full block by a hash of its tokens and of all the blocks
# before it, and a new request reuses the blocks it matches, as
# [vLLM does](https://docs.vllm.ai/en/latest/design/prefix_caching/) ([SGLang](https://arxiv.org/abs/2312.07104)
# finds the shared prefix in a radix tree instead). Ten chat requests share a 512-token system
# prompt, with caching off and on:

# %%
from kvlab.experiments.prefix_and_chunks import prefix_caching_runs, prefix_caching_table
from kvlab.lessons.common.gantt import plot_gantts

prefix = prefix_caching_runs(model)
display(prefix_caching_table(prefix).round(3))
frame = runs_frame(prefix)
plot_gantts(frame, frame.attrs["steps"])

# %%
verdicts(prefix, "prefix_hits_on_your_run", "prefix_cache_brings_first_token_sooner")

# %% [markdown]
# Every request after the first reuses the 32 full blocks of the system prompt: `9 × 512 = 4,608`
# tokens never computed. The orange prefill bars shrink, and the first token comes sooner.

# %% [markdown]
# <!-- kvlab:exercise check_prefix_hit -->

# %% [markdown]
# Prefix caching and preemption rest on one piece of bookkeeping: which blocks each sequence holds,
# and how many sequences use each block. Write it, checked call by call against the engine's own
# `BlockManager`:

# %% [markdown]
# <!-- kvlab:exercise check_block_table -->

# %% [markdown]
# ## Going deeper: the exact count
#
# A request that arrives while the first is still computing the system prompt finds fewer blocks
# ready, so on a slow machine the hits can fall below the hand count. On the virtual clock every
# prompt is done before the next request arrives:

# %%
# NBVAL_CHECK_OUTPUT
prefix_exact = prefix_caching_runs(model, executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")
print(prefix_caching_table(prefix_exact)[["run", "hit_tokens", "expected_hit_tokens", "prompt_tokens",
                                          "prompt_tokens_computed"]].to_string(index=False))
verdicts(prefix_exact, "prefix_hits_match_hand_count", fold=True)

# %% [markdown]
# ## Real traffic: a trace's shared prefixes
#
# Real prompts share more than a system prompt: a chat resends the whole conversation at every turn,
# an agent resends its tool descriptions. A [Mooncake](https://github.com/kvcache-ai/Mooncake/blob/main/FAST25-release/README.md)
# trace records, for each request, an id per 512-token prompt block: equal ids, reusable blocks.
# kvlab ships a **synthetic** trace in that format (300 requests: multi-turn chats under a few shared
# system prompts, agent runs, one-off documents), scaled to fit this model's context.
#
# Predict first: a cache that kept every block it ever saw would find what share of all the prompt
# tokens already computed? Think of which kind of session resends most.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("What share of the trace's prompt tokens would an ideal prefix cache find already computed?",
                unit="%")
guess

# %%
from kvlab.experiments.prefix_traces import ideal_hit_percent, load_sample_trace

trace = load_sample_trace()   # one row a request: arrival, lengths, block ids
trace[["arrival_s", "prompt_tokens", "output_tokens", "hash_ids"]].head(4)

# %%
# NBVAL_CHECK_OUTPUT
guess.against(trace, ideal_hit_percent, what="the ideal cache finds")

# %%
# NBVAL_CHECK_OUTPUT
verdicts(trace, "ideal_cache_hit_ratio_of_the_trace", after=guess)

# %% [markdown]
# An engine is sure to reach it only with room for every block: its cache is its KV pool, and a full
# pool evicts the least recently used blocks.

# %% [markdown]
# ### Going deeper: where the hits come from, and the trace replayed
#
# By request: a *later turn* reuses blocks its own session sent before, a *first turn* only a shared
# prompt. A block found in 9 or more requests counts as a shared prompt (no session of the sample has
# more than 8 requests):

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.experiments.prefix_traces import hit_sources, hit_sources_table

display(hit_sources_table(hit_sources(trace)))
verdicts(trace, "later_turns_hold_most_of_the_ideal_hits", fold=True)

# %% [markdown]
# The trace is written by `scripts/make_sample_trace.py` with a fixed seed; `kvlab.traces` reads it
# with lengths divided by 16 (a 512-token block becomes 32 tokens, two engine blocks), giving equal ids
# equal tokens. As in vLLM, a finished request's blocks stay cached until the pool needs room, blocks of
# running requests cannot be evicted, only full blocks are cached, and the prompt's last token is always
# computed (its logits give the first output token).
#
# The panel replays the trace on the simulator of notebook 06 (steps priced by the authors' machine's
# calibration, virtual clock: the same numbers everywhere). Left: hit ratio against KV memory at the
# trace's own pace. Middle and right: caching on against off at the first slider's load, with the
# second slider's pool.

# %%
from kvlab.lessons.l08_prefix_and_chunks.panel import prefix_trace_panel

trace_panel = prefix_trace_panel()
trace_panel

# %%
replay = trace_panel.run()   # the same as pressing Run
replay.show()
curve, on_off = replay.frame.attrs["curve"], replay.frame

# %%
# NBVAL_CHECK_OUTPUT
verdicts(curve, "engine_hits_rise_with_kv_memory_to_the_ideal",
         "lru_reaches_most_of_the_ideal_with_a_fraction_of_the_memory", fold=True)

# %% [markdown]
# LRU comes near the ideal long before the pool could hold the whole trace: what a request reuses was
# mostly sent recently (its conversation's previous turn, a popular system prompt). At the same
# offered load, caching on against off:

# %%
# NBVAL_CHECK_OUTPUT
verdicts(on_off, "caching_on_computes_fewer_prompt_tokens", "caching_on_answers_sooner_at_the_same_load",
         "caching_on_serves_at_least_as_much", fold=True)

# %% [markdown]
# Every cached token is a prompt token not computed. Without the cache the engine needs more compute
# than the arrivals leave it: a queue builds (TTFT), steps carry more prompt tokens (TPOT), and it
# serves fewer tokens per second than are asked for. Read the shape, not the third digit: `python -m
# kvlab calibrate --out my.json` fits your machine, and `--calibration my.json` makes `sweep` use it.
#
# **Public traces** are not shipped; download one and replay it (the format is detected):
#
# - Mooncake: [`FAST25-release/traces/`](https://github.com/kvcache-ai/Mooncake/tree/main/FAST25-release/traces)
#   (`conversation_trace.jsonl`, `synthetic_trace.jsonl`). Its
#   [README](https://github.com/kvcache-ai/Mooncake/blob/main/FAST25-release/README.md) reports cache hit
#   ratios of up to about half. The sample's ideal sits higher because shared system and tool prompts,
#   resent by every turn, dominate it.
# - Azure: the [2023 LLM inference traces](https://github.com/Azure/AzurePublicDataset/blob/master/AzureLLMInferenceDataset2023.md)
#   (`TIMESTAMP`, `ContextTokens`, `GeneratedTokens`) hold arrivals and lengths but no prefixes: kvlab
#   gives their prompts random tokens, so their hit ratio is zero. Use them for load, not caching.
#
# ```
# python -m kvlab sweep --simulate --trace PATH --length-scale 16       # a simulated service curve of the trace
# python -m kvlab serve --port 8000                                      # the real engine behind HTTP (notebook 09)
# python -m kvlab loadtest --url http://127.0.0.1:8000 --trace PATH --length-scale 16   # measured at the client
# ```
#
# `sweep` prints, rate by rate, the clocks with their n, the hit ratio and the prompt tokens computed
# (`--requests 2000` keeps the first 2,000). For a Mooncake trace the length scale must divide 512;
# prompts still too long are cut, and `sweep` says how many. `loadtest` sends the same prompts to any
# OpenAI-compatible server, so its own prefix cache sees the sharing. Quote the length scale with every
# result.

# %% [markdown]
# ## Chunked prefill: a long prompt among running answers
#
# Four requests are writing long answers when a 768-token prompt arrives. Computed in one step, that
# prompt makes every running answer wait: a pause in the middle of their text. **Chunked prefill**
# caps the tokens per step (here 64) and spreads the prompt over several steps, each also carrying one
# token of every running answer, as [vLLM's scheduler](https://docs.vllm.ai/en/stable/configuration/optimization/#chunked-prefill)
# does by default (the idea is [Sarathi-Serve's](https://arxiv.org/abs/2403.02310)).

# %%
from kvlab.experiments.prefix_and_chunks import chunked_prefill_runs, chunked_prefill_table
from kvlab.lessons.l08_prefix_and_chunks.figures import plot_token_gaps

chunked = chunked_prefill_runs(model)
display(chunked_prefill_table(chunked).round(3))
frame = runs_frame(chunked)
plot_token_gaps(frame, exclude=[chunked[0].extra["long_id"]],
                marks={"long prompt arrives": chunked[0].extra["long_arrival_s"]})

# %%
verdicts(chunked, "chunks_cap_the_longest_gap", "chunks_delay_the_long_prompt")

# %% [markdown]
# Each dot is one token of a running answer, at the height of the gap before it. In one step, one gap
# is as long as the whole prompt; in chunks, the gaps grow a little for a while instead. The long
# request can pay: its prompt now takes many steps. Which clock matters more, steady text for those
# already reading or a sooner start for the newcomer?
#
# ## Try it
#
# - In the panel, raise the budget until the preemptions stop. How does it compare with 192 blocks?
# - `prefix_caching_runs(model, system_prompt_tokens=250)`: count the hits by hand first, then compare.
# - `chunked_prefill_runs(model, chunk_tokens=256)`: where is the balance between steady gaps and a
#   sooner first token?
#
# ## Summary
#
# - A pool that runs out preempts: sequences compute their tokens again later, costing time only.
# - Prefix caching reuses the full blocks of a shared prompt: fewer tokens computed, a sooner first
#   token. On real traffic, the trace's own sharing bounds what it can save.
# - Chunked prefill keeps the gaps between tokens steady when a long prompt arrives; that prompt's
#   first token can come later.

# %% [markdown]
# ### Going deeper: the code behind this notebook
#
# `kvlab.serving.BlockManager` and `Scheduler`; `kvlab.experiments.prefix_and_chunks`
# (`preemption_runs`, `prefix_caching_runs`, `chunked_prefill_runs`) and `.prefix_traces` (`ideal_hit_ratio`,
# `hit_sources`, `capacity_curve`, `caching_on_off`, `trace_curve`); `kvlab.traces` (`mooncake_frame`,
# `replay_trace`); the claims in `kvlab/lessons/l08_prefix_and_chunks/claims.py`. Tests:
# `tests/test_experiments_serving.py`, `tests/test_block_manager.py`, `tests/test_traces.py`,
# `tests/test_claims_08.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
