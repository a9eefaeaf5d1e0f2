# %% [markdown]
# <!-- kvlab:header -->
# The previous notebook counted how many sequences fit a KV budget. This one runs the engine at the
# edge of it: what happens when the running sequences outgrow the budget (preemption), how a prompt
# prefix shared by many requests is computed once and reused (prefix caching), and how a long
# prompt is kept from stalling everyone else's answers (chunked prefill). Each section runs the
# real model on this machine, then counts the same requests exactly on a virtual clock; one more
# replays a whole trace of traffic with shared prefixes on the simulator of notebook 06.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - recognise preemption, and measure what it costs;
# - measure what prefix caching saves on a shared system prompt, and count the reused blocks by hand;
# - replay a trace's shared prefixes and read what caching buys on it: the ideal hit ratio, the hits
#   the engine reaches with the KV memory it has, and the four clocks with caching on and off;
# - say how chunked prefill keeps the time between tokens steady when a long prompt arrives, and
#   who pays for it.

# %%
# %matplotlib inline
import pandas as pd
from kvlab.lessons import verdicts
from kvlab.runs.serving_run import FixedStepCostExecutor, lesson_model, runs_frame

model = lesson_model()

# %% [markdown]
# ## When the budget runs out: preemption
#
# The engine admits a request when there are blocks for its prompt, not for the answer it has not
# written yet. If the running sequences then grow past the budget, one of them must give its
# blocks back: vLLM's V1 engine (and kvlab) **preempt** the most recently admitted sequence (under
# first-come-first-served scheduling), free its blocks, and put it back at the front of the queue;
# when it returns, its prompt and the tokens it had already written are computed again
# (*recompute*). Nothing is lost for the user except time.
#
# Twelve requests with short prompts and long answers, and a budget of 40 blocks (640 tokens).
# Press **Run**, then move the budget.

# %%
from kvlab.lessons.l08_prefix_and_chunks.panel_kv_budget import kv_budget_panel

panel = kv_budget_panel(model)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %% [markdown]
# Each red triangle is a step where the pool was full and a sequence was sent back to the queue.
# The same requests with room for all of them, for comparison (the pool is then 192 blocks: twelve
# sequences at their full context of 256 tokens):

# %%
from kvlab.lessons.l08_prefix_and_chunks.prefix_and_chunks import preemption_runs, preemption_table
from kvlab.lessons.l08_prefix_and_chunks.figures_kv_blocks import plot_kv_blocks

ample = preemption_runs(model, kv_blocks=(None,))
budgets = pd.concat([preemption_table(ample), result.frame.attrs["preemption"]], ignore_index=True)
display(budgets.round(3))
plot_kv_blocks(pd.concat([ample[0].trace, result.frame.attrs["trace"]]), by="run", block_size=16)

# %%
verdicts(budgets, "tight_budget_costs_time")

# %% [markdown]
# The tight budget runs into its limit again and again (it is using its memory well) but pays
# twice: tokens computed again after each preemption, and fewer sequences per step. Recomputed
# tokens are counted exactly: serving each request once computes prompt + output − 1 tokens, and
# everything above that was recomputed. The same counts with a fixed step-cost executor on a
# virtual clock, which makes the scheduling exact and repeatable:

# %%
# NBVAL_CHECK_OUTPUT
exact = preemption_runs(model, kv_blocks=(None, 40), executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")
print(preemption_table(exact)[["run", "preemptions", "recomputed_tokens", "peak_running", "peak_blocks_used",
                               "steps", "mean_batch", "completed"]].round(2).to_string(index=False))
verdicts(exact, "tight_budget_preempts_and_recomputes", "tight_budget_runs_fewer_sequences_per_step")

# %% [markdown]
# <!-- kvlab:exercise check_recomputed_tokens -->

# %% [markdown]
# ## Prefix caching: a shared system prompt
#
# Many requests start with the same text: a system prompt, a long instruction, a shared document.
# Their first blocks hold the same tokens, hence the same keys and values. With **prefix caching**
# kvlab's engine, like vLLM, names every full block by a hash of its tokens and of all the blocks
# before it, and a new request whose first blocks match reuses them instead of computing them
# (SGLang finds the shared prefix in a radix tree of token sequences instead). Ten chat requests
# sharing a 256-token system prompt, arriving eight per second, with caching off and on:

# %%
from kvlab.lessons.l08_prefix_and_chunks.prefix_and_chunks import prefix_caching_runs, prefix_caching_table
from kvlab.lessons.common.gantt import plot_gantts

prefix = prefix_caching_runs(model)
display(prefix_caching_table(prefix).round(3))
frame = runs_frame(prefix)
plot_gantts(frame, frame.attrs["steps"])

# %%
verdicts(prefix, "prefix_hits_on_your_run", "prefix_cache_brings_first_token_sooner")

# %% [markdown]
# `expected_hit_tokens` is the hand count: every request after the first reuses the 16 full
# blocks of the system prompt, `9 × 256 = 2,304` tokens. With caching on, most prompt tokens are
# never computed, the orange prefill bars shrink, and the first token comes sooner by the time those
# tokens took. If a request arrives while the first one is still computing its prompt, it finds
# fewer blocks ready, so on a slow machine the measured hits can fall below the hand count. On the
# virtual clock every prompt is done before the next request arrives, and the count is exact:

# %%
# NBVAL_CHECK_OUTPUT
prefix_exact = prefix_caching_runs(model, executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")
print(prefix_caching_table(prefix_exact)[["run", "hit_tokens", "expected_hit_tokens", "prompt_tokens",
                                          "prompt_tokens_computed"]].to_string(index=False))
verdicts(prefix_exact, "prefix_hits_match_hand_count")

# %% [markdown]
# <!-- kvlab:exercise check_prefix_hit -->

# %% [markdown]
# Prefix caching and preemption both rest on one piece of bookkeeping: which blocks each sequence
# holds, and how many sequences use each block. The next exercise has you write it, checked call by
# call against the engine's own `BlockManager`.

# %% [markdown]
# <!-- kvlab:exercise check_block_table -->

# %% [markdown]
# ## Real traffic: replaying a trace's shared prefixes
#
# Ten requests under one system prompt show the mechanism; production traffic is messier. A chat
# prompt carries the whole conversation so far, an agent resends its long tool descriptions at every
# step, and some requests share nothing at all. The **Mooncake** traces (FAST'25) record this without
# the text: one JSON line per request with `timestamp` (ms), `input_length`, `output_length` and
# `hash_ids`, one id per 512-token block of the prompt. Equal ids mean the same block after the same
# prefix: what a prefix cache can reuse.
#
# **The trace in this section is synthetic.** Nothing is downloaded while the notebook runs, so kvlab
# ships `mooncake_sample.jsonl`, written by `scripts/make_sample_trace.py` with a fixed seed. It has
# the Mooncake format, not Mooncake's data: 300 requests from three kinds of session. Multi-turn chats,
# in which each turn's prompt extends the previous one (that prompt, the model's answer, a new message)
# under one of a few shared system prompts; agent runs that resend one of two long shared tool prompts
# at every step; and one-off documents that share nothing. `mooncake_frame` reads it as it will be
# replayed: lengths divided by 16 so every prompt fits the simulated model's 1024-token context. The
# 512-token block becomes 32 tokens, two of the engine's 16-token blocks, so the sharing is kept block
# for block: `kvlab.traces` gives equal ids equal tokens and different ids different tokens.
#
# Predict before you read the trace: an ideal cache keeps every block it has ever seen. What share
# of all the prompt tokens of the trace would it find already computed? Think of which of the three
# kinds of session resends most, then type a percentage.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("What share of the trace's prompt tokens would an ideal prefix cache find already computed?",
                unit="%")
guess

# %%
from kvlab.lessons.l08_prefix_and_chunks.prefix_traces import hit_sources, hit_sources_table
from kvlab.traces import MOONCAKE_SAMPLE_TRACE, mooncake_frame

trace = mooncake_frame(MOONCAKE_SAMPLE_TRACE, length_scale=16, max_context=1024)   # one row a request, as replayed
display(trace.head(6))
display(hit_sources_table(hit_sources(trace)))

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons.l08_prefix_and_chunks.prefix_traces import ideal_hit_ratio

guess.against(100 * ideal_hit_ratio(trace)["token_hit_ratio"])

# %%
# NBVAL_CHECK_OUTPUT
verdicts(trace, "ideal_cache_hit_ratio_of_the_trace", "later_turns_hold_most_of_the_ideal_hits", after=guess)

# %% [markdown]
# The **ideal** is a cache that keeps every block it has ever seen: a bound no engine reaches. The
# second table splits its hits two ways. By request: a *later turn* reuses blocks its own session sent
# before (and usually a shared prompt in front of them), a *first turn* only a shared prompt. By block:
# kvlab counts a block found in 9 or more requests as part of a shared prompt, since no session of the
# sample has more than 8 requests (the trace has no session ids; for another trace choose a count above
# its longest session).
#
# In kvlab, as in vLLM, the cache is the engine's KV pool. A finished request's blocks stay in the
# cache until the pool needs room; then the **least recently used** go first (LRU). Blocks of running
# requests cannot be given away, only full blocks are cached (SGLang, with pages of one token by
# default, can reuse a prefix of any length), and the prompt's last token is always computed (its
# logits give the first output token). The panel replays the trace on the simulator of notebook 06: steps
# priced by the cost model calibrated on the authors' machine and shipped with kvlab, on a virtual
# clock, so every number below is the same on every machine, and the trace replays far faster than it
# took to record. On the left, the hit ratio against KV memory, with the trace at its own pace. In the
# middle and on the right, caching on against off at the offered load of the first slider (faster than
# the trace's own pace), with the KV pool of the second (the engine's default holds 16 sequences of
# 1024 tokens).

# %%
from kvlab.lessons.l08_prefix_and_chunks.panel_prefix_traces import prefix_trace_panel

trace_panel = prefix_trace_panel()
trace_panel

# %%
replay = trace_panel.run()   # the same as pressing Run
replay.show()
curve, on_off = replay.frame.attrs["curve"], replay.frame

# %%
# NBVAL_CHECK_OUTPUT
verdicts(curve, "engine_hits_rise_with_kv_memory_to_the_ideal",
         "lru_reaches_most_of_the_ideal_with_a_fraction_of_the_memory")

# %% [markdown]
# A pool with room for one request keeps little for the next; as the pool grows the hits climb towards
# the ideal, and they come close long before the pool could hold the whole trace. That is why LRU works
# here: what a request reuses was mostly sent recently (its conversation's previous turn, a system
# prompt that many sessions keep sending), and recently used blocks are the last to be evicted.
#
# The same requests at the same offered load, caching on against off, on the four clocks:

# %%
# NBVAL_CHECK_OUTPUT
verdicts(on_off, "caching_on_computes_fewer_prompt_tokens", "caching_on_answers_sooner_at_the_same_load",
         "caching_on_serves_at_least_as_much")

# %% [markdown]
# Every cached token is a prompt token the engine does not compute, so caching on has less work for
# the same traffic. At this load that decides who keeps up: without the cache the engine needs more
# compute than the arrivals leave it, so a queue builds and the first token waits (TTFT); its steps
# carry more prompt tokens, so the running answers flow more slowly (TPOT); and it serves fewer tokens
# per second than are asked for (throughput). The seconds are simulated with the authors' machine's
# calibration: read the shape and the order, not the third digit. `python -m kvlab calibrate --out
# my.json` fits your machine, and `--calibration my.json` makes `sweep` replay on it.
#
# ### Replaying a public trace
#
# The public traces are not shipped with kvlab: download one, then replay it (the format is detected
# from the file).
#
# - **Mooncake**: repository `kvcache-ai/Mooncake`, folder `FAST25-release/traces/`, with a
#   conversation trace (`conversation_trace.jsonl`) and a synthetic one (`synthetic_trace.jsonl`). Its
#   README reports cache hit ratios of up to about half. The sample's ideal sits above that because
#   multi-turn history dominates it: most of its hits are in later turns, which resend their whole
#   session so far, as the verdicts above say.
# - **Azure**: repository `Azure/AzurePublicDataset`, the 2023 LLM inference traces
#   (`AzureLLMInferenceDataset2023.md` links a conversation and a code trace, CSV files with
#   `TIMESTAMP`, `ContextTokens`, `GeneratedTokens`). They hold arrival times and lengths but no prefix
#   information: kvlab gives their prompts random token ids, so their hit ratio is zero by
#   construction. Use them for load, not for caching.
#
# ```
# python -m kvlab sweep --simulate --trace PATH --length-scale 16       # a simulated service curve of the trace
# python -m kvlab serve --port 8000                                      # the real engine behind HTTP (notebook 09)
# python -m kvlab loadtest --url http://127.0.0.1:8000 --trace PATH --length-scale 16   # measured at the client
# ```
#
# `sweep` replays the trace at rising loads and prints, level by level, the clocks with their n, the
# hit ratio and the prompt tokens computed (`--requests 2000` keeps the first 2,000 requests). For a
# Mooncake trace the length scale must divide the 512-token block (1, 2, 4, 8, 16, ...); prompts still
# too long for the context are cut, and `sweep` says how many. `loadtest` sends the same prompts (token
# ids, or text with `--prompt-format text`) to any OpenAI-compatible server, so that server's own prefix
# cache sees the trace's sharing. Quote the length scale next to every result.

# %% [markdown]
# ## Chunked prefill: a long prompt among running answers
#
# Four requests are writing long answers when a 768-token prompt arrives. If the engine computes
# that whole prompt in one step, every running answer waits for that step: a visible pause in the
# middle of their text. **Chunked prefill** caps the tokens per step (here 64) and spreads the prompt
# over several steps, each also carrying one token of every running answer.

# %%
from kvlab.lessons.l08_prefix_and_chunks.prefix_and_chunks import chunked_prefill_runs, chunked_prefill_table
from kvlab.lessons.l08_prefix_and_chunks.figures_token_gaps import plot_token_gaps

chunked = chunked_prefill_runs(model)
display(chunked_prefill_table(chunked).round(3))
frame = runs_frame(chunked)
plot_token_gaps(frame, exclude=[chunked[0].extra["long_id"]],
                marks={"long prompt arrives": chunked[0].extra["long_arrival_s"]})

# %%
verdicts(chunked, "chunks_cap_the_longest_gap", "chunks_delay_the_long_prompt")

# %% [markdown]
# **Reading the figure.** Each dot is one token of a running answer, placed at the time it
# arrived, at the height of the gap before it. Without chunking one gap is as long as the whole
# prompt's computation; with chunks the gaps grow a little for a while instead of spiking once.
# The price is paid by the long request: its first token comes later, because its prompt now
# shares steps and every step pays the engine's fixed cost again. Which is better depends on which
# clock matters: steady text for everyone already reading, or a sooner start for the newcomer.
#
# ### Try it
#
# - In the panel, raise the budget until the preemptions stop. How many blocks does that take, and
#   how does it compare with the 192 blocks a worst-case reservation would need?
# - Set the budget to 16 blocks (one request at full length): what happens to the number of sequences at once?
# - `prefix_caching_runs(model, system_prompt_tokens=250)`: count the hits you expect by hand first
#   (exercise 2), then compare.
# - `chunked_prefill_runs(model, chunk_tokens=256)`: where is the balance between steady gaps and a sooner first token?
# - In the trace panel, lower the load until caching off keeps up too. Which clock still shows the
#   difference? Then shrink the KV pool for the comparison to 1,024 tokens: what is left of the gain?
#
# ## Summary
#
# - A budget that runs out forces preemption: sequences recompute their tokens later, costing
#   compute and latency, and nothing else. The engine admits on the prompt, so only a run shows
#   how far the answers will grow.
# - Prefix caching reuses the full blocks of a shared prompt: fewer tokens computed, a sooner first
#   token. Only whole blocks are shared.
# - On a trace, what prefix caching can save is bounded by the trace's own sharing (the ideal hit
#   ratio) and by KV memory: the engine's pool is its cache, evicting least recently used blocks, and
#   it comes near the ideal with a fraction of the trace's footprint. At the same load, caching on
#   computes fewer prompt tokens and keeps up where caching off falls behind.
# - Chunked prefill keeps the time between tokens steady when a long prompt arrives, at the cost of
#   that prompt's own first token.
# - The verdicts say whether your run showed each of these; the counts on the virtual clock are the
#   same on every machine.
# - Behind this notebook: `kvlab.serving.BlockManager` and `Scheduler`, `kvlab.lessons.l08_prefix_and_chunks.prefix_and_chunks`
#   (`preemption_runs`, `prefix_caching_runs`, `chunked_prefill_runs`), `kvlab.traces` (`mooncake_frame`,
#   `replay_trace`), `kvlab.lessons.l08_prefix_and_chunks.prefix_traces` (`ideal_hit_ratio`, `hit_sources`, `capacity_curve`,
#   `caching_on_off`, `trace_curve`), `kvlab.lessons.l08_prefix_and_chunks.figures_kv_blocks`, `kvlab.lessons.l08_prefix_and_chunks.figures_token_gaps`,
#   `kvlab.lessons.l08_prefix_and_chunks.figures_prefix_traces`, `kvlab.lessons.l08_prefix_and_chunks.panel_kv_budget`, `kvlab.lessons.l08_prefix_and_chunks.panel_prefix_traces`, the claims in
#   `kvlab/lessons/l08_prefix_and_chunks/claims.py`; tests in `tests/test_experiments_serving.py`,
#   `tests/test_block_manager.py`, `tests/test_traces.py` and `tests/test_claims_08.py`.

# %% [markdown]
# <!-- kvlab:navigation -->