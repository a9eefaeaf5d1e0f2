# %% [markdown]
# <!-- kvlab:header -->
# Notebook 02 showed that a KV cache costs memory, and hinted that there are ways to pay less. Every
# one of them moves the bill somewhere else: to time spent on each token, to bytes shuffled between
# memories, to space reserved and never used, or to answers that quietly become wrong. This notebook
# puts five ways of keeping the cache side by side on one small model and measures all four bills.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - say what each strategy changes: **dynamic** (grow as needed), **static** (reserve the maximum up
#   front), **quantized** (store 8, 4 or 2 bits per number), **offloaded** (keep the cache in a slower
#   memory and bring it back every step);
# - read, for each one, the memory it saves, the time per token it adds, the bytes it moves and the
#   answers it keeps, at several context lengths;
# - see what moving bytes costs when the slower memory sits behind a slower link;
# - see what offloading does to a server under concurrent requests: not only slower steps but a wider
#   spread of the gaps between tokens;
# - check a lower-precision cache on a task whose answers are right or wrong, broken down by how far
#   back the needed fact sits;
# - explain what fixed shapes make possible (a compiled decode step) and what they cost (reserved bytes);
# - pick the constraint that dominates for a given workload before picking a strategy.

# %% [markdown]
# ## A model whose answers can be checked
#
# A model with random weights is fine for timing, but its outputs mean nothing, so nothing could
# visibly get worse. kvlab ships a tiny trained model instead (`load_recall_model()`; the cell below
# prints its size), trained by `python scripts/train_recall.py` (it takes minutes on a laptop CPU, not seconds).
# Its only skill is **associative recall**: the prompt lists key→value pairs, then asks for one key;
# the answer is that key's value.
# To answer, the model has to look back through its KV cache at exactly one earlier pair, so a cache
# that blurs stored keys or values shows up as wrong answers, and the distance between the fact and
# the question tells us how far back it had to look.

# %%
# %matplotlib inline
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
      f"(the fact sits {ex.distance} tokens before the end of the prompt)")

# %% [markdown]
# **Checked:** the exact cache answers the held-out questions the training script evaluates
# on (seed 1000, 16 pairs per prompt). This cell's output is compared by the tests: the model, the
# questions and greedy decoding on CPU are all deterministic.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.threads import torch_threads

held_out = make_examples(100, 16, seed=1000)
with torch_threads(1):
    exact = score(model, held_out, cache="dynamic")
print(f"exact (dynamic) cache: accuracy {exact.accuracy:.3f} on {len(held_out)} held-out questions "
      f"({int(exact.examples['correct'].sum())} right), {len(held_out[0].prompt_ids)} prompt tokens each")

# %% [markdown]
# **Checked:** three strategies only change *where* and *how* the exact numbers are kept:
# `dynamic` grows its tensors, `static` writes into a block reserved up front, `offloaded` keeps
# every layer in a slower memory and copies it back each step. They must give exactly the tokens of
# the uncached computation (`none`), which recomputes everything and serves as the oracle.

# %%
# NBVAL_CHECK_OUTPUT
prompt = make_examples(1, 8, seed=3)[0].prompt
runs = {name: generate(model, prompt, cache=name, max_new_tokens=12).tokens
        for name in ("none", "dynamic", "static", "offloaded")}
print("none, dynamic, static and offloaded give the same tokens:", all(t == runs["none"] for t in runs.values()))
print("tokens:", runs["dynamic"])
print("text:  ", repr(model.tokenizer.decode(runs["dynamic"])))

# %% [markdown]
# ## All strategies side by side
#
# The panel runs every chosen setting at every chosen context length: a few timed generations each
# (settings take turns, so a busy moment on the machine hits them all alike), then the recall
# questions at the longest context through the dynamic cache and each quantized setting. Static and
# offloaded caches are sized for the longest context, the way a server sizes them for the longest
# request it accepts. The offloaded cache runs twice: at its memory's own speed, and behind the
# **slow link** you choose (more on that below). Choose, press **Run**, and read the table and the
# six plots.
#
# One prediction first. The exact cache stores every number in 32 bits. A 4-bit quantized cache
# stores each number as a 4-bit code, plus a full-precision scale and zero-point for every group of
# `group_size` numbers (the panel's *group size*; with *residual window* 0 nothing else stays at full
# precision). What fraction of the dynamic cache's bytes will it take? Type it in the box (0.5 for
# half), then press **Run**.

# %%
from kvlab.lessons.common.predict import predict

guess = predict("At the longest context, how many times the dynamic cache's bytes will the 4-bit quantized "
                "cache take?", unit="×")
guess

# %%
from kvlab.lessons.l03_cache_strategies.panel_strategies import strategies_panel

panel = strategies_panel(model)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons.l03_cache_strategies.strategies import quantized_memory_ratio

guess.against(quantized_memory_ratio(result.frame, bits=4))

# %% [markdown]
# **Reading the page.** Top row, left to right: bytes allocated as tokens are stored (the black
# dashed line is the formula of notebook 02); the time of one decode step, median with a whisker to
# the 95th percentile; and how much of each step is spent *inside the cache* (writing, quantizing,
# dequantizing, copying), with a whole dynamic step in grey for scale. Bottom row: bytes the
# offloaded cache moves per step; recall accuracy as bits fall; recall accuracy by how far back the
# fact sits, each bucket's number of questions under its tick. Each strategy keeps its colour
# through the lab; quantized settings get darker as bits fall, the slow link is dashed.
# On a machine shared with other programs the p95 whiskers mostly measure those programs (a step
# that waited for the CPU); compare the medians, and rerun if the whiskers are very uneven.
#
# The rest of the notebook takes the strategies one at a time, from the same `result.frame`.

# %% [markdown]
# ## Static: bytes reserved, shapes fixed
#
# A static cache allocates its maximum length up front. At the longest context it is as full as the
# dynamic one; at shorter contexts the difference is memory held for tokens that never came.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons import verdicts

frame = result.frame
bpt = frame.attrs["bytes_per_token"]   # 2 x layers x kv_heads x head_dim x 4 bytes
max_len = int(frame.loc[frame["strategy"] == "static", "allocated_bytes"].max() // bpt)
print(f"static cache sized for {max_len} tokens ({bpt:,} bytes per token)\n")
print(f"{'prompt':>6} {'stored':>6} {'dynamic KiB':>11} {'static KiB':>10} {'reserved KiB: formula':>22} {'measured':>9}")
for p, rows in frame.groupby("pairs"):
    dyn, st = rows.set_index("strategy").loc["dynamic"], rows.set_index("strategy").loc["static"]
    expected = (max_len - st["stored_tokens"]) * bpt
    print(f"{st['context_tokens']:>6} {st['stored_tokens']:>6} {dyn['allocated_bytes'] / 1024:>11.1f} "
          f"{st['allocated_bytes'] / 1024:>10.1f} {expected / 1024:>22.1f} {st['reserved_bytes'] / 1024:>9.1f}")
verdicts(result, "static_reserves_what_shorter_contexts_leave_empty")

# %% [markdown]
# What do the fixed shapes buy? A dynamic cache hands attention a key tensor one token longer
# at every step. A compiler that builds a program for one set of shapes must then rebuild or fall
# back to general code. `kvlab.lessons.l03_cache_strategies.static_compile.FixedShapeStaticCache` writes each new
# token into its slot at a position held in a tensor and attends over *all* reserved slots, masking
# the empty ones, so every decode step has the same shapes and `torch.compile` can build one program
# and replay it for every token (CUDA graphs rely on the same property).
#
# Compiling takes time: on CPU, torch's inductor writes and builds C++ code, which the first time can
# take far longer than the decoding it speeds up (later runs reuse its on-disk cache). On a GPU the
# cell below gives it a budget (`default_budget_s()`: a cold CUDA context and Triton's kernels take a
# while) and prints how long compiling took on your machine; on a CPU it starts nothing unless you
# give it a budget yourself (the exercises do), since a first compile there outlasts this whole
# notebook. If the compiler is missing, fails or runs out of time, it says that it skipped the
# compiled step, and the notebook moves on.
# Eager and compiled then decode the same prompt in alternating rounds, and the speed-up printed is
# the median of the per-round ratios with its min–max: a busy moment slows both runs of a round alike.

# %%
from kvlab.lessons.l03_cache_strategies.static_compile import try_compiled_decode

compiled = try_compiled_decode()  # within 120 s on CUDA; on CPU only when given a budget_s (see the message)
print(compiled["message"])
if compiled["status"] == "compiled":
    print(f"same tokens as the dynamic cache (eager and compiled): {compiled['same_tokens']}; "
          f"dynamic cache: {compiled['dynamic_ms']:.2f} ms per step")
    display(verdicts(compiled, "compiled_step_is_faster"))

# %% [markdown]
# ## Quantized: memory saved, time spent, answers lost
#
# A quantized cache stores each group of `group_size` numbers as small integer codes plus a scale
# and a zero-point to turn them back into numbers. The newest `residual` tokens can stay in full
# precision. Memory should follow the format exactly: bits / 32 for the codes, plus two fp32
# numbers per group. In kvlab, as in transformers' `QuantizedCache`, every step pays for it: the new
# token is quantized, and the whole stored history is dequantized again into a full-precision copy
# before attention can read it. The transformers documentation warns that this can make a quantized
# cache slower than the plain one when contexts are short; the verdicts under the table say what
# your run shows, at every context you measured. Serving engines do it differently: vLLM's
# `kv_cache_dtype="fp8"` (and SGLang's) stores 8-bit floats that the attention kernel converts as it
# reads them, so no dequantized copy of the history is made, and fewer bytes to read can make a step
# faster, not slower. What they still pay is the precision, measured further down.

# %%
q = frame[frame["strategy"] == "quantized"]
lines = []
for ctx, rows in q.groupby("context_tokens"):
    lines.append(f"--- {ctx} prompt tokens")
    for r in rows.itertuples():
        acc = f"   recall {r.correct}/{r.examples} right (exact {r.exact_correct})" if r.accuracy == r.accuracy else ""
        lines.append(f"{r.setting:45s} memory {r.memory_ratio:.3f} x dynamic (ideal {r.ideal_memory_ratio:.3f})   "
                     f"time/token {r.latency_ratio:.2f} x dynamic   {r.cache_ms_per_step:.2f} ms/step inside the cache{acc}")
display(guess.fold("\n".join(lines), what="this printout"))
verdicts(result, "quantized_slower_at_every_context", "quantized_time_goes_into_the_cache")

# %%
# NBVAL_CHECK_OUTPUT
verdicts(result, "quantized_memory_follows_the_format", after=guess)

# %% [markdown]
# Answers are the other price. The table counts right answers out of the questions asked, per
# bucket of distance between the fact and the query (each column says how many questions fell
# into it: a bucket holds only part of them, so one answer more or less moves it a lot). The
# questions are the same for every setting, so the exact cache's row is the reference. The model,
# the questions and greedy decoding on one CPU thread are deterministic: on a CPU these counts, and
# the verdicts under them, are the same on every machine. On a GPU other kernels round differently,
# so an answer on the edge (most likely at the lowest bits) can flip.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons.l03_cache_strategies.cache_accuracy import accuracy_summary, accuracy_table

accuracy = frame.attrs["accuracy"]
display(accuracy_table(accuracy))
verdicts(result, "eight_bit_cache_keeps_the_answers", "answers_fall_as_bits_fall", "lowest_bits_lose_most_answers")

# %% [markdown]
# Checking answers needs questions with known answers. Two cheaper measures compare a setting's
# next-token distributions with the exact cache's on a few prompts: the **KL divergence** (how far
# the distributions moved, in nats) and **top-1 agreement** (how often the most likely next token
# is the same). The panel computes them on the first few questions. Do they see what the answers saw?

# %%
from kvlab.lessons.l03_cache_strategies.figures_strategies import plot_accuracy_by_distance

display(accuracy_summary(accuracy)[["setting", "correct", "examples", "quality_prompts", "compared_positions",
                                   "top1_agreement", "kl_mean"]])
plot_accuracy_by_distance(accuracy)

# %%
# NBVAL_CHECK_OUTPUT
verdicts(result, "token_metrics_order_settings_like_accuracy", "few_prompt_metrics_miss_lost_answers")

# %% [markdown]
# The token measures order the settings, but a handful of prompts cannot vouch for a setting whose
# errors hit only some of the questions: to adopt a setting, count answers on the task, with
# enough questions that the count means something. With `residual` above 0 the newest tokens stay
# exact; the *Try it* section below has you measure what that buys. (KL's last digits change with
# the number of CPU threads, since sums are added in another order, so its values are shown in the
# table but not quoted in the verdicts.)

# %% [markdown]
# ## Offloaded: bytes moved every step
#
# An offloaded cache keeps the keys and values of every layer in a slower, larger memory and keeps
# on the compute device only working buffers, each with room for one layer's history at the full
# `max_len`: one buffer on CPU, two on CUDA with prefetch (the next layer fills one while the
# current layer reads the other). Each decode step copies every layer's history back in, computes,
# and writes the new token out. The bytes moved therefore grow with the context, on every single step.
#
# That is kvlab's design, and the design of transformers' offloaded cache, which also keeps whole
# layers off the device and brings each back just before it is used, prefetching the next one while
# the current one computes. Serving engines keep the K/V of running sequences on the GPU. When vLLM
# (its V1 engine) runs out of blocks it preempts by **recompute**: the preempted sequence's blocks
# are freed, not copied, and its tokens are computed again later (notebook 08); swapping them to CPU
# memory was an option of the older V0 engine (`preemption_mode="swap"`). What engines move to CPU
# memory is K/V kept for reuse: vLLM through a KV connector (its own `OffloadingConnector`, or
# LMCache), SGLang through HiCache, a host-memory tier under its radix-tree prefix cache. A block
# comes back when a later request's prefix matches it. None of them streams every running
# sequence's history across the link every step; kvlab does, to make the cost of that traffic visible.
#
# What "slower memory" means depends on the machine, and it changes what you measure:
#
# - **on this CPU-only machine** the slow tier is a **memory-mapped file**. Its pages live in the
#   operating system's page cache, that is, in RAM, unless the OS evicts them. The copies in and out
#   of the mapping run as fast as this machine copies memory, and on a small model that can be a
#   small part of a step (the verdicts below say how small on your run);
# - **on CUDA** the tier is **pinned host memory** (RAM the GPU can copy from directly), and the next
#   layer's history is prefetched on a side CUDA stream while the current layer computes, which hides
#   part of the copy time. The same code runs both ways (`kvlab/cache/offloaded.py`).
#
# To see what the traffic costs when the slower memory really is slower, the panel also runs the
# cache behind a **slow link** (`OffloadedCache(link_gbps=...)`, the panel's *slow link* choice).
# This is a model, stated plainly: every byte is still really copied, in chunks, and after each chunk
# the cache waits until the time those bytes take at the stated rate has passed. The wait happens
# inside the step, so it is in the step time you measure, not added on paper. Nothing here measures
# a real disk or network; the link rate is a setting you choose.

# %%
from kvlab.lessons.l03_cache_strategies.figures_strategies import plot_offload_cost

off = frame[frame["strategy"] == "offloaded"].sort_values(["context_tokens", "setting"])
dyn = frame[frame["strategy"] == "dynamic"].set_index("context_tokens")
print(f"{'prompt':>6} {'setting':25} {'KiB moved':>9} {'link ms':>7} {'ms copying':>10} {'GB/s copying':>12} "
      f"{'GB/s of step':>12} {'ms/token':>8} {'dynamic':>7}")
for r in off.itertuples():
    link = f"{r.link_ms_per_step:.3f}" if r.link_gbps == r.link_gbps else "-"
    print(f"{r.context_tokens:>6} {r.setting:25} {r.bytes_moved_per_step / 1024:>9.1f} {link:>7} "
          f"{r.copy_ms_per_step:>10.3f} {r.copy_gb_per_s:>12.2f} {r.moved_gb_per_s:>12.3f} {r.token_ms_p50:>8.2f} "
          f"{dyn.loc[r.context_tokens, 'token_ms_p50']:>7.2f}")
plot_offload_cost(frame)

# %% [markdown]
# Per decode step: *KiB moved* between the tiers; *link ms*, the link's own time for those bytes
# (bytes / rate); *ms copying*, the time the copies really took (waiting for the link included);
# *GB/s copying*, bytes moved per second of copying; *GB/s of step*, bytes moved per second of the
# whole step (what gpt-fast calls achieved bandwidth); then the step's median time beside the
# dynamic cache's. Times are medians over the steps. The bytes are the same at both speeds and
# follow the count exactly:

# %%
# NBVAL_CHECK_OUTPUT
verdicts(result, "offloaded_bytes_follow_the_count")

# %% [markdown]
# The link's time, on your run:

# %%
verdicts(result, "slow_link_time_shows_in_the_step", "slow_link_cost_grows_with_bytes",
         "memory_tier_copies_outrun_the_link")

# %% [markdown]
# On a tiny model the history is a few hundred KiB per step at most. On a real model at long
# context the same count gives gigabytes per step. The arithmetic for an 8B Llama-style model (32
# layers, 8 K/V heads of 128 numbers, fp16) holding 32,000 tokens, over the nominal rate of a
# PCIe 4.0 x16 link between host and GPU and over the modelled link above:

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.cache import kv_cache_bytes

per_step = kv_cache_bytes(32, 8, 128, 32_000, 1, 2)   # every stored token, every layer, K and V, 2 bytes each
print(f"{per_step / 2**30:.2f} GiB of cache read back every decode step")
for link, gbps in (("PCIe 4.0 x16, nominal", 32.0), ("the modelled slow link", 1.0)):
    print(f"over {link} ({gbps:g} GB/s): {per_step / (gbps * 1e9) * 1e3:,.0f} ms per token for the copies alone")

# %% [markdown]
# That is why offloading suits work where memory is scarce and latency is not, and why on a GPU the
# copies are overlapped with computing (prefetch) wherever possible.
#
# ## Which constraint dominates? A reading guide
#
# None of these strategies wins everywhere. Start from the workload (prompt lengths, answer
# lengths, how many sequences at once, what counts as a correct answer) and find the constraint that
# binds first; then read the plot that measures it.
#
# | if your workload… | the constraint that binds | read | try first |
# |---|---|---|---|
# | short prompts and answers, memory to spare | time per token | latency vs context | `dynamic`; a quantized cache would only add time |
# | fixed maximum length, steady traffic, steps dominated by overhead | per-step overhead | the compiled step's speed-up | `static` + `torch.compile` (or CUDA graphs), accepting the reserved bytes |
# | long contexts or many sequences, memory full | bytes per token | memory vs context, then accuracy | 8-bit, then 4-bit with a residual window, measured on *your* task and length |
# | memory full, latency budget loose (batch jobs, offline) | device memory | bytes moved per step | `offloaded` (on a GPU, with prefetch) |
# | answers must reproduce facts from the context exactly | quality | accuracy vs bits and by distance | the exact strategies; any quantization only after measuring the outputs |
#
# Whatever you choose, write down the engine version and its settings next to the result: the
# trade-offs move when either changes.

# %% [markdown]
# ## Offloading under load
#
# Everything above ran one sequence at a time. A server runs many in every step, and kvlab's
# offloaded KV cache then makes every step carry the history of *every* sequence in its batch across
# the link (real engines avoid that, as said above: this is the cost they avoid).
# How much that is changes from step to step: long sequences join, finish and are replaced. So the
# price of a step, and the wait for your next token, depend on the company your sequence keeps.
# Offloading should then add variance under load, not only latency. Does it?
#
# `kvlab.cache.paged_offloaded.OffloadedPagedKVCache` keeps the serving engine's pool of KV blocks
# (the engine of the serving notebooks) in a slower tier and holds on the device only one layer's
# working pool. In every layer of every step it copies in the blocks its sequences attend over and
# writes the new tokens back: real copies, counted. On a CPU-only machine the tier is a
# memory-mapped file behind a modelled slower link (`link_gbps`, as above; `offload_under_load`
# picks `CPU_LINK_GBPS`); on CUDA it is pinned host memory behind the real host-to-GPU link.
#
# The cell serves sixteen requests of mixed lengths, all arriving at once, through four batch slots
# of the serving lessons' model, twice: with the pool on the device and offloaded. Since every
# request arrives at once, both runs execute exactly the same steps; only their prices differ.

# %%
from kvlab.lessons.l03_cache_strategies.offload_load import distribution_table, offload_under_load
from kvlab.lessons.l03_cache_strategies.figures_offload_load import plot_offload_under_load

loaded = offload_under_load(n=16, max_seqs=4, prompt_tokens=192, max_new_tokens=32)
print(f"tier: {loaded.settings['tier']}, link: {loaded.settings['link_gbps'] or 'the real one'} GB/s, "
      f"{loaded.settings['tier_bytes'] / 2**20:.0f} MiB in the tier, "
      f"{loaded.settings['working_bytes'] / 2**20:.0f} MiB working pool on the device")
display(distribution_table(loaded, ms=True).round(2))
plot_offload_under_load(loaded)

# %% [markdown]
# **Checked:** the schedule and the bytes. Both runs gave the same tokens in the same steps, and
# the bytes the offloaded pool counted match a count by hand from the engine's trace (each
# sequence reads its stored blocks, every layer, K and V; the new tokens are written back):

# %%
# NBVAL_CHECK_OUTPUT
verdicts(loaded, "offloaded_engine_serves_the_same_tokens", "offloaded_pool_moves_the_counted_bytes")

# %% [markdown]
# The times, on your run. Over a real link (a GPU's, with no `link_gbps`) these are checked, ✓ or ✗.
# Behind a modelled link (a CPU's, where RAM to RAM needs one) each step waits its bytes / rate, so
# the offloaded run is slower by construction: the lines then show the numbers, marked •, not checked.

# %%
verdicts(loaded, "offloaded_tail_between_tokens_is_longer", "offloading_widens_the_spread",
         "offload_cost_follows_the_bytes")

# %% [markdown]
# **Reading the figure.** Left and middle: every step and every gap between two tokens of one
# request, sorted from fastest to slowest; ● marks the median, ◆ the 95th percentile, the bar on
# the left edge spans the middle half (the IQR), and the legend gives each one's n. On the device,
# the steps that hold a prompt make the tail (a prompt costs several decode steps), and the other
# steps are nearly alike. Offloaded, every step also carries its batch's stored context across the
# link, and that amount changes with the batch. Right: the same steps in both runs against the bytes
# they moved. On the device a step's time barely depends on them; offloaded it climbs with them,
# along the dashed line (on-device median + bytes / rate). That is the variance offloading adds: a
# token's wait depends on who shares its step, and latency targets are set on the tail (p95, p99),
# not on the median.
#
# Try `offload_under_load(max_seqs=8)` (more company per step: what happens to the spread?) and
# `offload_under_load(link_gbps=None)` (the tier at memory speed: what is left of the cost?).
#
# Behind this section: `kvlab.cache.paged_offloaded` (the pool), `kvlab.serving.offloaded_executor`
# (`OffloadedModelExecutor`, the engine's model runner over it), `kvlab.lessons.l03_cache_strategies.offload_load`
# (`offload_under_load`, `distribution_table`, `bytes_by_hand`), `kvlab.lessons.l03_cache_strategies.figures_offload_load`; tests in
# `tests/test_paged_offloaded.py` and `tests/test_offload_load.py`.

# %% [markdown]
# ## Beside transformers: the library's own caches
#
# kvlab's caches are written to be read. The library most people run, transformers, ships its own,
# behind the same contract: `update(key, value, layer_idx)` stores one layer's new keys and values and
# returns everything to attend over. The panel converts the recall model to transformers
# (`kvlab.model.loading.to_transformers`: the same weights) and generates greedily after the same recall
# prompts with each strategy in both libraries, timed the same way (the time of every step, the cache's
# bytes after it). The bytes are counted as allocated: for transformers, the storage behind every
# tensor a cache layer holds, its quantized codes, scales and shifts included
# (`kvlab.measure.transformers_steps.transformers_cache_bytes`). Press **Run**; a transformers cache that
# cannot run on this machine keeps its row and says why.

# %%
import transformers

from kvlab.lessons.l03_cache_strategies.transformers_caches import not_run, quantized_backend
from kvlab.lessons.l03_cache_strategies.panel_transformers_caches import transformers_caches_panel

print(f"transformers {transformers.__version__}; {quantized_backend()}")
beside = transformers_caches_panel(model)
beside

# %%
compared = beside.run()   # the same as pressing Run
for line in not_run(compared.frame):
    print(line)
compared.show()

# %% [markdown]
# **Checked:** the tokens and the bytes. Exact caches must give kvlab's greedy tokens on the same
# weights, and every cache must hold, after every step, what its own layout's formula says
# (`formula_bytes`: the same for both dynamic caches and both static ones):

# %%
# NBVAL_CHECK_OUTPUT
verdicts(compared, "transformers_exact_caches_give_kvlab_tokens", "cache_bytes_follow_each_layout")

# %% [markdown]
# The quantized caches (where transformers' one could run here: it needs optimum-quanto) follow their
# formulas too, but not the same one, as the table below explains; then their tokens and the times,
# on your run:

# %%
verdicts(compared, "quantized_caches_hold_their_own_layouts", "quantized_caches_keep_different_tokens",
         "transformers_quantized_cache_costs_time", "same_strategy_different_speed")

# %% [markdown]
# Where each kvlab strategy meets its transformers counterpart, and where they part (read in
# transformers' `cache_utils.py`, of the version the panel's cell prints):
#
# | kvlab | transformers | where they behave differently |
# |---|---|---|
# | `dynamic` | `DynamicCache`, what `generate` uses by default | Nowhere that matters here: both concatenate each layer's new K and V onto its history, a new tensor every step. transformers builds its layers from the model's config, so a model with sliding-window layers keeps only the window in those. |
# | `static` (`max_len`) | `StaticCache(config, max_cache_len)`, `cache_implementation="static"` | Both reserve the maximum up front. transformers allocates it (zeros) at the first update, writes at a position held in a tensor (`index_copy_`) and hands attention the *whole* reserved block, masking the empty slots, so every step has the same shapes; kvlab's `static` hands over only the filled part, and its fixed-shape twin `FixedShapeStaticCache` (above) does what transformers does. `generate` sizes it to prompt + new tokens, or to the largest size an earlier call used. |
# | `quantized` (`bits`, `group_size`, `residual`) | `QuantizedCache(backend, config, nbits, q_group_size, residual_length)`, `cache_implementation="quantized"` with a `cache_config`; backends `quanto` (2 or 4 bits, package optimum-quanto), `hqq` (1, 2, 3, 4 or 8 bits, package hqq), `fp8` (built in: one scale per tensor, fixed at the first update, no residual) | Both store groups of values as codes with a scale and a zero-point (quanto groups along head_dim, as kvlab does, when `q_group_size` divides it) and dequantize the whole history every step. The full-precision part differs: kvlab keeps a sliding window of the newest `residual` tokens and quantizes each token once, when it leaves the window; transformers quantizes the whole prompt at prefill (the prefill's own attention still reads full precision), lets a residual grow, and when it reaches `residual_length` dequantizes everything, appends the residual and quantizes it all again, so old tokens are re-quantized at every flush. Defaults differ too: group 64 and residual 128 in transformers, `gcd(head_dim, 32)` and 64 in kvlab. |
# | `offloaded` (`max_len`) | `DynamicCache(offloading=True)`, `cache_implementation="offloaded"` (`"offloaded_static"` for a static one) | kvlab preallocates its tier for `max_len` tokens (pinned host memory on CUDA, a memory-mapped file on CPU), keeps working buffers for one layer on the device, copies a layer's history in and writes back only the new token. transformers moves each layer's whole K and V to the CPU right after its update, and before it starts fetching the next layer back on a side stream (one layer ahead). Its copies run on CUDA streams, so it needs a GPU: the run above says whether it ran here. |
#
# The formula of each layout is written out in `formula_bytes` (`kvlab/lessons/l03_cache_strategies/transformers_caches.py`),
# with tests in `tests/test_experiments_transformers_caches.py`.

# %% [markdown]
# <!-- kvlab:exercise check_quantized_memory_ratio -->

# %% [markdown]
# <!-- kvlab:exercise check_offloaded_bytes -->

# %% [markdown]
# <!-- kvlab:exercise check_dominant_constraint -->

# %% [markdown]
# ### Try it
#
# - Set **residual window** to 32 and Run. Which distance bucket recovers at 2 bits, and why that one?
#   What happens to the memory ratio at the shortest context?
# - At 2 bits, change **group size** to 8. How much memory does it add (predict it first), and how
#   much accuracy does it buy back?
# - Choose only the shortest context (37 tokens) and then only the longest. Is the quantized cache's
#   time per token, relative to dynamic, better or worse as the context grows? Look at the time spent
#   inside the cache to explain it.
# - Set the **slow link** to each of its rates in turn. Predict the step time at the longest context
#   from the table's bytes moved before you press Run: dynamic's step plus bytes / rate.
# - Raise **recall questions** to 200. Which accuracy differences survive, and which were noise?
# - Give the compiler more time: `try_compiled_decode(budget_s=300)`. Is the compiled step faster
#   than the eager one? Is the speed-up worth the compile time for a 16-token answer? For 1,000 answers?
#
# ## Summary
#
# - `dynamic`, `static` and `offloaded` keep exact numbers and give the same tokens as recomputing
#   everything (checked above); they differ in where the bytes live and when they are allocated.
# - `static` reserves its maximum up front: memory held but empty at shorter contexts, in exchange
#   for shapes that never change, which is what a compiled decode step needs.
# - `quantized` takes bits/32 of kvlab's fp32 cache (bits/16 of an fp16 one) plus a scale and zero-point per group, exactly; it pays
#   with time spent quantizing and dequantizing every step and with answers as bits fall (the
#   verdicts above say how much on your run); an FP8 cache that the attention kernel converts as it
#   reads (vLLM, SGLang) makes no dequantized copy of the history. Token-level measures on a few prompts order the
#   settings but can miss errors that only a count of right answers shows.
# - `offloaded` keeps little on the device and moves the whole history every step, as transformers'
#   offloaded cache does: bytes that grow with the context (serving engines keep running sequences' K/V
#   on the GPU, preempt by recompute, and offload only K/V kept for reuse). On CPU the slow tier is a memory-mapped file in the page cache; on CUDA, pinned
#   host memory with the next layer prefetched on a side stream. Behind a slower link, the copies'
#   time is in every step and grows with the bytes. In a server under load, kvlab's offloaded pool moves
#   every scheduled sequence's history each step, so steps and gaps between tokens spread out, not
#   only slow down (the distributions above, with n).
# - transformers' own caches follow the same strategies: the exact ones give kvlab's tokens on the same
#   weights; the quantized and offloaded ones keep their full-precision tokens and move their bytes in
#   their own way (the table above), and each holds what its layout's formula says.
# - Name the constraint that binds for your workload, then measure that one, outputs included.
# - Behind this notebook: `kvlab.lessons.l03_cache_strategies.strategies.run_strategies`,
#   `kvlab.lessons.l03_cache_strategies.cache_accuracy.accuracy_by_distance`, `kvlab.quality`,
#   `kvlab.lessons.l03_cache_strategies.static_compile`, `kvlab.cache.offloaded` (the slow link), `kvlab.lessons.l03_cache_strategies.figures_strategies`,
#   `kvlab.lessons.l03_cache_strategies.panel_strategies`; the claims in `kvlab.lessons.l03_cache_strategies.claims`; tests in
#   `tests/test_experiments_strategies.py`, `tests/test_quality.py`, `tests/test_plots_strategies.py`,
#   `tests/test_cache_offloaded.py` and `tests/test_claims_03.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
