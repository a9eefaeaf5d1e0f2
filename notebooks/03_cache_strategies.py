# %% [markdown]
# <!-- kvlab:header -->
# Notebook 02 showed that a KV cache costs memory. Every way to pay less moves the bill elsewhere:
# to time per token, to bytes moved between memories, to space reserved and never used, or to wrong
# answers. Here you measure all four.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - say what a **dynamic**, **static**, **quantized** (8, 4 or 2 bits) and **offloaded** cache changes;
# - read, for each, the memory it saves, the time per token it adds and the answers it keeps;
# - name the constraint that binds for a workload before picking a strategy.

# %% [markdown]
# ## A model whose answers can be checked
#
# Random weights are fine for timing, but their outputs mean nothing. So kvlab ships a tiny trained
# model whose only skill is **associative recall**: the prompt lists key→value pairs, then asks for
# one key. To answer, the model must look back through its cache at one earlier pair, so a cache that
# blurs keys or values shows up as wrong answers.

# %%
# %matplotlib inline
from kvlab.generate import generate
from kvlab.experiments.recall import load_recall_model, make_examples, score

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
# **Checked:** the exact cache answers the held-out questions. On a CPU the model, the questions and
# greedy decoding are deterministic, so the output is the same on most machines; a borderline answer
# can differ where another CPU adds the same numbers in another order.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.threads import torch_threads

held_out = make_examples(100, 16, seed=1000)
with torch_threads(1):
    exact = score(model, held_out, cache="dynamic")
print(f"exact (dynamic) cache: accuracy {exact.accuracy:.3f} on {len(held_out)} held-out questions "
      f"({int(exact.examples['correct'].sum())} right), {len(held_out[0].prompt_ids)} prompt tokens each")

# %% [markdown]
# **Checked:** `dynamic`, `static` and `offloaded` only change *where* the exact numbers live. They
# give the tokens of recomputing everything without a cache (`none`).

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
# The panel times a few generations of every setting at every context length, then asks the recall
# questions at the longest one. Static and offloaded caches are sized for the longest context, as a
# server sizes them for its longest request. The offloaded cache runs twice: at its own memory's
# speed, and behind a **slow link** you choose.
#
# Predict first. The exact cache stores every number in 32 bits. A 4-bit cache stores a 4-bit code
# per number, plus a 32-bit scale and a 32-bit zero-point per group of numbers (the panel's *group
# size*, 32). What fraction of the dynamic cache's bytes will it take? Type it in the box (0.5 for half).

# %%
from kvlab.lessons.common.predict import predict

guess = predict("At the longest context, how many times the dynamic cache's bytes will the 4-bit quantized "
                "cache take?", unit="×")
guess

# %%
from kvlab.lessons.l03_cache_strategies.panel import strategies_panel

panel = strategies_panel(model).folded_until(guess)   # its table and plots stay folded until you predict
panel

# %%
result = panel.run()   # the same as pressing Run
display(guess.fold(result, what="the panel's table and plots"))   # they hold the answer: folded until you predict

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons import verdicts
from kvlab.experiments.strategies import four_bit_memory_ratio

display(guess.against(result, four_bit_memory_ratio))
verdicts(result, "quantized_memory_follows_the_format", after=guess)

# %% [markdown]
# **Reading the page.** Top row: bytes allocated as tokens are stored (dashed: notebook 02's
# formula); the time of one decode step (median, whisker to the 95th percentile); the time spent
# inside the cache. Bottom row: bytes the offloaded cache moves per step; recall accuracy as bits
# fall; accuracy by how far back the fact sits (n under each tick). Darker means fewer bits; the slow
# link is dashed. On a busy machine the whiskers mostly measure other programs: compare the medians.

# %% [markdown]
# ## Static: bytes reserved, shapes fixed
#
# A static cache allocates its maximum length up front. At the longest context it holds what the
# dynamic one holds; at shorter ones the rest is memory kept for tokens that never came. What it buys
# is shapes that never change.

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
verdicts(result, "static_reserves_what_shorter_contexts_leave_empty", fold=True)

# %% [markdown]
# ### Going deeper: fixed shapes and a compiled step
#
# A dynamic cache hands attention a key tensor one token longer at every step, so a compiler that
# builds one program per set of shapes must rebuild it or fall back to general code.
# `FixedShapeStaticCache` (in `kvlab.experiments.static_compile`) writes each new
# token at a position held in a tensor and attends over *all* reserved slots, masking the empty
# ones. Every decode step then has the same shapes, and `torch.compile` can build one program and
# replay it for every token. transformers' `StaticCache` does the same for the same reason
# ([docs](https://huggingface.co/docs/transformers/main/en/llm_optims#static-kv-cache-and-torchcompile)),
# and CUDA graphs need it too ([PyTorch blog](https://pytorch.org/blog/accelerating-pytorch-with-cuda-graphs/)).
#
# Compiling takes time. On a CPU, torch's inductor writes and builds C++ code, and a first compile can
# outlast this notebook, so the cell below starts nothing there unless you give it a budget
# (`try_compiled_decode(budget_s=300)`). On a GPU it compiles within `default_budget_s()` and prints
# how long that took. If the compiler is missing, fails or runs out of time, it says so and the
# notebook moves on. Eager and compiled then decode the same prompt in alternating rounds; the
# speed-up is the median of the per-round ratios, with its min–max.

# %%
from kvlab.experiments.static_compile import try_compiled_decode

compiled = try_compiled_decode()  # within 120 s on CUDA; on CPU only when given a budget_s (see the message)
print(compiled["message"])
if compiled["status"] == "compiled":
    print(f"same tokens as the dynamic cache (eager and compiled): {compiled['same_tokens']}; "
          f"dynamic cache: {compiled['dynamic_ms']:.2f} ms per step")
    display(verdicts(compiled, "compiled_step_is_faster", fold=True))

# %% [markdown]
# ## Quantized: memory saved, time spent (in kvlab), answers lost
#
# A quantized cache stores each group of numbers as small integer codes plus a scale and a
# zero-point to turn them back into numbers. You checked its memory above. Time is the second price:
# kvlab quantizes each new token as it is stored and, every step, dequantizes the whole history into
# a full-precision copy before attention reads it. transformers' `QuantizedCache` also dequantizes
# the history every step, but keeps new tokens in a full-precision residual and quantizes them only
# when that residual fills ([docs](https://huggingface.co/docs/transformers/main/en/kv_cache#quantized-cache), [`cache_utils.py`](https://github.com/huggingface/transformers/blob/main/src/transformers/cache_utils.py)).

# %%
q = frame[frame["strategy"] == "quantized"]
for ctx, rows in q.groupby("context_tokens"):
    print(f"--- {ctx} prompt tokens")
    for r in rows.itertuples():
        print(f"{r.setting:45s} time/token {r.latency_ratio:.2f} x dynamic   "
              f"{r.cache_ms_per_step:.2f} ms/step inside the cache")
display(verdicts(result, "quantized_slower_at_every_context"))
verdicts(result, "quantized_time_goes_into_the_cache", fold=True)

# %% [markdown]
# Serving engines can avoid the copy: they store 8-bit floats, and attention kernels built for them
# read those directly ([vLLM](https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/),
# [SGLang](https://docs.sglang.io/advanced_features/quantized_kv_cache.html), which warns that a
# backend without that support can be much slower). What they still pay is precision.
#
# Answers are that price. The table counts right answers per bucket of distance between the fact
# and the question (each column gives its n, so one answer moves a bucket a lot). The exact cache's
# row is the reference. On a CPU these counts are the same on most machines; an answer on the edge
# (most likely at the lowest bits) can differ, since another CPU may add its sums in another order.
# On a GPU other kernels round differently, so such an answer can flip there too.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.experiments.cache_accuracy import accuracy_summary, accuracy_table

accuracy = frame.attrs["accuracy"]
display(accuracy_table(accuracy))
display(verdicts(result, "answers_fall_as_bits_fall"))
verdicts(result, "eight_bit_cache_keeps_the_answers", "lowest_bits_lose_most_answers", fold=True)

# %% [markdown]
# ### Going deeper: cheaper measures than counting answers
#
# Checking answers needs questions with known answers. Two cheaper measures compare a setting's
# next-token distributions with the exact cache's on a few prompts: the **KL divergence** (how far
# the distributions moved, in nats) and **top-1 agreement** (how often the most likely next token is
# the same). The panel computes them on the first few questions. Do they see what the answers saw?

# %%
from kvlab.lessons.l03_cache_strategies.figures import plot_accuracy_by_distance

display(accuracy_summary(accuracy)[["setting", "correct", "examples", "quality_prompts", "compared_positions",
                                   "top1_agreement", "kl_mean"]])
plot_accuracy_by_distance(accuracy)

# %%
# NBVAL_CHECK_OUTPUT
verdicts(result, "token_metrics_order_settings_like_accuracy", "few_prompt_metrics_miss_lost_answers", fold=True)

# %% [markdown]
# The token measures order the settings, but a handful of prompts cannot vouch for a setting whose
# errors hit only some questions: to adopt a setting, count right answers on the task, with enough
# questions that the count means something. (KL's exact value differs between machines, since sums
# are added in another order: compare orders, not digits.)

# %% [markdown]
# ## Offloaded: bytes moved every step
#
# An offloaded cache keeps every layer's keys and values in a slower, larger memory. Each decode
# step copies each layer's history back to the compute device, computes, and writes the new token
# out, so the bytes moved grow with the context, on every step. transformers' offloaded cache moves
# whole layers the same way, fetching the next layer while the current one computes
# ([docs](https://huggingface.co/docs/transformers/main/en/kv_cache#offloaded-cache)). On a CPU-only machine the slower memory is a file that stays in
# RAM, so its copies are cheap; the **slow link** shows what they cost behind a slower rate, one you set.

# %%
from kvlab.lessons.l03_cache_strategies.figures import plot_offload_cost

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

# %%
# NBVAL_CHECK_OUTPUT
verdicts(result, "offloaded_bytes_follow_the_count")

# %%
verdicts(result, "slow_link_time_shows_in_the_step")

# %% [markdown]
# ### Going deeper: the slow link, and what serving engines offload
#
# The table, per decode step: *KiB moved* between the tiers; *link ms*, the link's own time for those
# bytes (bytes / rate); *ms copying*, the time the copies really took (waiting for the link
# included); *GB/s copying*, bytes per second of copying; *GB/s of step*, the bytes moved divided by
# the whole step's time. gpt-fast's bandwidth figure is the same kind of rate, bytes over time: it
# multiplies the model's weight bytes by the tokens per second
# ([`generate.py`](https://github.com/pytorch-labs/gpt-fast/blob/main/generate.py)); here only the
# cache's bytes count. Then the step's median time beside the dynamic cache's.
#
# The slow link is a model, stated plainly (`OffloadedCache(link_gbps=...)`, the panel's *slow link*).
# Every byte is still copied, in chunks, and after each chunk the cache waits until those bytes would
# have crossed a link of that rate. The wait is inside the step, so it is in the time you measure.
# Nothing here measures a real disk or network. On CUDA the tier is **pinned host memory** instead of
# a file, and the next layer's history is prefetched on a side stream while the current layer
# computes, which hides part of the copy time. The same code runs both ways (`kvlab/cache/offloaded.py`).

# %%
verdicts(result, "slow_link_cost_grows_with_bytes", "memory_tier_copies_outrun_the_link", fold=True)

# %% [markdown]
# On a tiny model the history is a few hundred KiB per step. The same count for an 8B Llama-style
# model (32 layers, 8 K/V heads of 128 numbers, fp16) holding 32,000 tokens, over the nominal rate of
# a PCIe 4.0 x16 link and over the modelled link above:

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.cache import kv_cache_bytes

per_step = kv_cache_bytes(32, 8, 128, 32_000, 1, 2)   # every stored token, every layer, K and V, 2 bytes each
print(f"{per_step / 2**30:.2f} GiB of cache read back every decode step")
for link, gbps in (("PCIe 4.0 x16, nominal", 32.0), ("the modelled slow link", 1.0)):
    print(f"over {link} ({gbps:g} GB/s): {per_step / (gbps * 1e9) * 1e3:,.0f} ms per token for the copies alone")

# %% [markdown]
# That is why streaming the history every step suits only work whose latency budget is loose.
# Throughput-oriented offloading systems do stream it ([FlexGen](https://arxiv.org/abs/2303.06865)
# keeps the K/V on CPU or disk for batch jobs). Latency-oriented GPU engines such as vLLM (V1) keep
# running sequences' K/V on the GPU. When vLLM runs out of blocks it preempts by **recompute**: it
# frees the sequence's blocks and computes its tokens again later
# ([docs](https://docs.vllm.ai/en/latest/configuration/optimization/#preemption); notebook 08). What
# engines move to host memory is K/V kept for *reuse*: idle prefix blocks that come back, once, when
# a later request's prefix matches them. vLLM does this through KV connectors such as
# [LMCache](https://docs.lmcache.ai/), SGLang through
# [HiCache](https://docs.sglang.io/advanced_features/hicache_design.html), a host-memory tier under
# its prefix cache. For long documents asked about again and again, that is a standard lever. kvlab
# streams every running sequence's history each step on purpose, to make the traffic visible.

# %% [markdown]
# ### Going deeper: offloading under load
#
# A server runs many sequences in every step, and kvlab's offloaded pool then carries the history of
# *every* sequence in the batch across the link, each step (the traffic latency-oriented engines
# avoid, as said above). How much changes from step to step as long sequences join and leave, so the
# wait for your next token depends on the company your sequence keeps. Offloading should add
# variance, not only latency. Does it?
#
# `kvlab.cache.paged_offloaded.OffloadedPagedKVCache` keeps the serving engine's pool of KV blocks in
# a slower tier and holds on the device one layer's working pool. In every layer of every step it
# copies in the blocks its sequences attend over and writes the new tokens back: real copies,
# counted. On a CPU-only machine the tier is a memory-mapped file behind a modelled link
# (`link_gbps`); on CUDA it is pinned host memory behind the real host-to-GPU link. The cell serves
# sixteen requests of mixed lengths, all arriving at once, through four batch slots, twice: with the
# pool on the device and offloaded. Both runs execute the same steps; only their prices differ.

# %%
from kvlab.experiments.offload_load import distribution_table, offload_under_load
from kvlab.lessons.l03_cache_strategies.figures import plot_offload_under_load

loaded = offload_under_load(n=16, max_seqs=4, prompt_tokens=192, max_new_tokens=32)
print(f"tier: {loaded.settings['tier']}, link: {loaded.settings['link_gbps'] or 'the real one'} GB/s, "
      f"{loaded.settings['tier_bytes'] / 2**20:.0f} MiB in the tier, "
      f"{loaded.settings['working_bytes'] / 2**20:.0f} MiB working pool on the device")
display(distribution_table(loaded, ms=True).round(2))
plot_offload_under_load(loaded)

# %% [markdown]
# **Checked:** both runs gave the same tokens in the same steps, and the bytes the offloaded pool
# counted match a count by hand from the engine's trace.

# %%
# NBVAL_CHECK_OUTPUT
verdicts(loaded, "offloaded_engine_serves_the_same_tokens", "offloaded_pool_moves_the_counted_bytes", fold=True)

# %% [markdown]
# The times. Over a real link (a GPU's, with no `link_gbps`) they are checked, ✓ or ✗. Behind a
# modelled link each step waits its bytes / rate, so the offloaded run is slower by construction:
# the lines show the numbers, marked •.

# %%
verdicts(loaded, "offloaded_tail_between_tokens_is_longer", "offloading_widens_the_spread",
         "offload_cost_follows_the_bytes", fold=True)

# %% [markdown]
# **Reading the figure.** Left and middle: every step and every gap between two tokens of one
# request, sorted from fastest to slowest; ● the median, ◆ the 95th percentile, the bar the middle
# half (IQR), n in the legend. On the device the steps that hold a prompt make the tail. Offloaded,
# every step also carries its batch's stored context across the link, and that amount changes with
# the batch. Right: each step's time against the bytes it moved; offloaded it climbs along the dashed
# line (on-device median + bytes / rate). A token's wait depends on who shares its step, and latency
# targets are set on the tail (p95, p99), not on the median.
#
# Try `offload_under_load(max_seqs=8)` (more company per step: what happens to the spread?) and
# `offload_under_load(link_gbps=None)` (the tier at memory speed: what is left of the cost?). Behind
# this section: `kvlab.cache.paged_offloaded` and `kvlab.experiments.offload_load`.

# %% [markdown]
# ## Going deeper: the same strategies in transformers
#
# transformers ships its own caches behind the same contract: `update(key, value, layer_idx)` stores
# one layer's new keys and values and returns everything to attend over
# ([docs](https://huggingface.co/docs/transformers/main/en/kv_cache), [`cache_utils.py`](https://github.com/huggingface/transformers/blob/main/src/transformers/cache_utils.py)). The panel converts the recall model to
# transformers (`kvlab.model.loading.to_transformers`: the same weights) and generates greedily after
# the same recall prompts with each strategy in both libraries, timed the same way. The bytes are
# counted as allocated: for transformers, the storage behind every tensor a cache layer holds,
# quantized codes, scales and shifts included (`kvlab.experiments.transformers_steps.transformers_cache_bytes`).
# A transformers cache that cannot run on this machine keeps its row and says why.

# %%
import transformers

from kvlab.experiments.transformers_caches import not_run, quantized_backend
from kvlab.lessons.l03_cache_strategies.panel import transformers_caches_panel

print(f"transformers {transformers.__version__}; {quantized_backend()}")
beside = transformers_caches_panel(model)
beside

# %%
compared = beside.run()   # the same as pressing Run
for line in not_run(compared.frame):
    print(line)
compared.show()

# %% [markdown]
# **Checked:** exact caches give kvlab's greedy tokens on the same weights, and every cache holds,
# after every step, what its own layout's formula says (`formula_bytes`).

# %%
# NBVAL_CHECK_OUTPUT
verdicts(compared, "transformers_exact_caches_give_kvlab_tokens", "cache_bytes_follow_each_layout", fold=True)

# %% [markdown]
# The quantized caches (where transformers' one could run here: it needs optimum-quanto) follow their
# formulas too, but not the same one, as the table below explains; then their tokens and times:

# %%
verdicts(compared, "quantized_caches_hold_their_own_layouts", "quantized_caches_keep_different_tokens",
         "transformers_quantized_cache_costs_time", "same_strategy_different_speed", fold=True)

# %% [markdown]
# Where each kvlab strategy meets its transformers counterpart, and where they part (read in
# transformers' [`cache_utils.py`](https://github.com/huggingface/transformers/blob/main/src/transformers/cache_utils.py), of the version printed above):
#
# | kvlab | transformers | where they behave differently |
# |---|---|---|
# | `dynamic` | `DynamicCache`, what `generate` uses by default | Nowhere that matters here: both concatenate each layer's new K and V onto its history, a new tensor every step. transformers builds its layers from the model's config, so a model with sliding-window layers keeps only the window in those. |
# | `static` (`max_len`) | `StaticCache(config, max_cache_len)`, `cache_implementation="static"` | Both reserve the maximum up front. transformers allocates it (zeros) at the first update, writes at a position held in a tensor (`index_copy_`) and hands attention the *whole* reserved block, masking the empty slots, so every step has the same shapes; kvlab's `static` hands over only the filled part, and its fixed-shape twin `FixedShapeStaticCache` (above) does what transformers does. `generate` sizes it to prompt + new tokens, or to the largest size an earlier call used. |
# | `quantized` (`bits`, `group_size`, `residual`) | `QuantizedCache(backend, config, nbits, q_group_size, residual_length)`, `cache_implementation="quantized"` with a `cache_config`; backends `quanto` (2 or 4 bits, package optimum-quanto), `hqq` (1, 2, 3, 4 or 8 bits, package hqq), `fp8` (built in: one scale per tensor, fixed at the first update, no residual; each backend's docstring in [cache_utils.py](https://github.com/huggingface/transformers/blob/main/src/transformers/cache_utils.py)) | Both store groups of values as codes with a scale and a zero-point (quanto groups along head_dim, as kvlab does, when `q_group_size` divides it) and dequantize the whole history every step. The full-precision part differs: kvlab keeps a sliding window of the newest `residual` tokens and quantizes each token once, when it leaves the window; transformers quantizes the whole prompt at prefill (the prefill's own attention still reads full precision), lets a residual grow, and when it reaches `residual_length` dequantizes everything, appends the residual and quantizes it all again, so old tokens are re-quantized at every flush. Defaults differ too: group 64 and residual 128 in transformers, `gcd(head_dim, 32)` and 64 in kvlab. |
# | `offloaded` (`max_len`) | `DynamicCache(offloading=True)`, `cache_implementation="offloaded"` (`"offloaded_static"` for a static one) | kvlab preallocates its tier for `max_len` tokens (pinned host memory on CUDA, a memory-mapped file on CPU), keeps working buffers for one layer on the device, copies a layer's history in and writes back only the new token. transformers moves each layer's whole K and V to the CPU right after its update, and before it starts fetching the next layer back on a side stream (one layer ahead). Its copies run on CUDA streams, so it needs a GPU: the run above says whether it ran here. |
#
# Each layout's formula is `formula_bytes` in `kvlab/experiments/transformers_caches.py`,
# tested in `tests/test_experiments_transformers_caches.py`.

# %% [markdown]
# ## Which constraint dominates?
#
# No strategy wins everywhere. Start from the workload and find the constraint that binds first.
#
# | if your workload… | what binds | try first |
# |---|---|---|
# | short prompts, memory to spare | time per token | `dynamic` |
# | fixed maximum length, steady traffic | per-step overhead | `static` with a compiled step |
# | long contexts or many sequences, memory full | bytes per token | 8 bits, then 4 with a residual window, measured on your task |
# | memory full, latency loose (batch jobs) | device memory | offloading |
# | answers quote the context exactly | quality | exact caches; quantize only after counting right answers |

# %% [markdown]
# <!-- kvlab:exercise check_quantized_memory_ratio -->

# %% [markdown]
# <!-- kvlab:exercise check_offloaded_bytes -->

# %% [markdown]
# <!-- kvlab:exercise check_dominant_constraint -->

# %% [markdown]
# ### Try it
#
# - At 2 bits, set **residual window** to 32. Which distance bucket recovers, and why that one?
# - At 2 bits, set **group size** to 8 (its memory is exercise 1). How many answers does it buy back?
# - Set the **slow link** to each rate. Predict the step time first: dynamic's step + bytes / rate.
#
# <details><summary>Going deeper: more to try</summary>
#
# - Choose only the shortest context, then only the longest. Does the quantized cache's time per
#   token, relative to dynamic, get better or worse as the context grows? Look at the time inside the cache.
# - Raise **recall questions** to 200. Which accuracy differences survive, and which were noise?
# - `try_compiled_decode(budget_s=300)`: is the compiled step faster? Is it worth the compile time for
#   a 16-token answer? For 1,000 answers?
#
# </details>
#
# ## Summary
#
# - `dynamic`, `static` and `offloaded` keep exact numbers and give the same tokens; they differ in
#   where the bytes live and when they are allocated.
# - `static` reserves its maximum up front: bytes held empty at short contexts, for shapes that never change.
# - `quantized` takes bits/32 of an fp32 cache plus a scale and zero-point per group. It pays in
#   answers as bits fall. Here, and in transformers, the history is dequantized before attention,
#   so it also pays in time every step. An engine whose attention kernel reads 8-bit values directly
#   skips that copy ([vLLM](https://docs.vllm.ai/en/latest/features/quantization/quantized_kvcache/)),
#   and where decode waits on memory, fewer bytes can even make its step faster.
# - `offloaded` keeps little on the device but moves the whole history every step; behind a slow
#   link that time is in every token.
# - Name the constraint that binds for your workload, then measure it, outputs included.
#
# <details><summary>Going deeper: the code behind this notebook</summary>
#
# `kvlab.lessons.l03_cache_strategies` (experiments, figures, panels, claims), `kvlab.experiments.quality` and
# `kvlab.cache.offloaded` (the slow link), each with its tests under `tests/`.
#
# </details>

# %% [markdown]
# <!-- kvlab:navigation -->
