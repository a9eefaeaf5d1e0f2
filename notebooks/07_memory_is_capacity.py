# %% [markdown]
# <!-- kvlab:header -->
# Every running request keeps its KV cache in memory until it ends, and the cache grows with every
# token. So the memory set aside for KV decides how many requests a server works on at once. Here
# you count how many fit a budget under two ways of handing out memory. Nothing is timed: every
# number is a count, the same on every machine.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - count how many sequences fit a KV budget when each reserves its maximum length, and when memory
#   comes in fixed-size blocks (paging);
# - choose a block size knowing what it wastes;
# - use max context and max new tokens as capacity levers.

# %% [markdown]
# ## Two ways to hand out KV memory
#
# - **Reserve the maximum**: an admitted request gets room for the longest it could become (here the
#   whole context). A short answer leaves most of it empty, and nobody else can use it.
# - **Paged blocks**: memory is a pool of fixed-size blocks, say of 16 tokens. A sequence gets a new
#   block only when its last one is full; a table maps its positions to blocks anywhere in the pool.
#   vLLM works this way: its
#   <a href="https://github.com/vllm-project/vllm/blob/main/vllm/v1/core/kv_cache_manager.py">KV cache manager</a>
#   hands out the blocks, and its attention kernels, PagedAttention, read K/V through the table
#   (<a href="https://arxiv.org/abs/2309.06180">Kwon et al. 2023, §3–4</a>).
#
# The budget holds 8 sequences at the model's full context (1,024 tokens). The workload is 64
# requests mixing chats, long documents and long generations, admitted first come, first served
# until the next one does not fit.
#
# Reserving the whole context, 8 fit: that is how the budget was chosen. Predict how many fit when
# memory comes in paged blocks of 16 tokens.

# %%
# %matplotlib inline
from kvlab.lessons.common.predict import predict
from kvlab.experiments.serving_run import lesson_model

cfg = lesson_model().config
guess = predict("With paged blocks of 16 tokens, how many of the 64 requests fit the budget that holds 8 "
                "full-context reservations?", unit="sequences")
guess

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.experiments.presets import LESSON_SPEC
from kvlab.experiments.capacity import (block_size_table, budget_for_tokens, bytes_per_token,
                                                           capacity_levers, capacity_workload, paged_vs_reserved)

requests = capacity_workload(cfg, n=64)
budget = budget_for_tokens(cfg, 8 * 1024)
print(f"{cfg.name}: {bytes_per_token(cfg):,} bytes of K/V per token; budget {budget:,} bytes = 8,192 tokens")
spec = LESSON_SPEC.replace(kv_budget_bytes=budget, block_size=16, max_model_len=1024)  # the engine's pool
table = paged_vs_reserved(cfg, requests, spec)
display(guess.fold(table[["scheme", "sequences_fit", "formula_fit", "block_manager_fit", "tokens_held",
                          "in_block_waste_tokens", "reserved_unused_tokens", "free_tokens",
                          "waste_share"]].round(3).to_string(index=False)))

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.experiments.capacity import paged_fit

guess.against(table, paged_fit)

# %%
from kvlab.lessons.l07_memory_is_capacity.figures import plot_paged_vs_reserved

plot_paged_vs_reserved(table)

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons import verdicts

verdicts(table, "reservation_fits_budget_over_context", "paging_fits_more_sequences", "reservation_wastes_most",
         "paging_wastes_only_last_blocks", after=guess)

# %% [markdown]
# **Reading the figure.** Most of what the reservations hold is space no token will use. Paging
# fits several times as many sequences in the same bytes, wasting only the empty ends of last
# blocks. The PagedAttention paper saw the same on real servers: earlier systems used only a
# fraction of their KV memory for tokens (<a href="https://arxiv.org/abs/2309.06180">§1, Fig. 2</a>),
# and paging brought the waste down to a few percent
# (<a href="https://blog.vllm.ai/2023/06/20/vllm.html">vLLM blog</a>). More sequences at once means fuller batches: throughput (notebook 05).

# %% [markdown]
# ### Going deeper: how the count is made
#
# `formula_fit` is the count by hand (reserved: the budget divided by the context; paged: the first
# *k* requests whose blocks, ⌈tokens / 16⌉ each, add up to at most the pool's blocks).
# `block_manager_fit` is the engine's own `BlockManager` allocating them one by one. The token
# columns add up to the budget: tokens held, waste in last blocks, reserved but never used, free.

# %% [markdown]
# ### Your own budget
#
# Press **Run**, then halve the budget or raise the max context: which scheme loses more sequences?

# %%
from kvlab.lessons.l07_memory_is_capacity.panel import capacity_panel

panel = capacity_panel(cfg)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %% [markdown]
# ## Block size
#
# Why not blocks of 1 token? Each block costs bookkeeping: a table entry, a gather in attention, a
# hash for prefix caching. vLLM on NVIDIA GPUs picks 16 tokens per block when none is set (some
# attention backends force larger ones;
# <a href="https://github.com/vllm-project/vllm/blob/main/vllm/platforms/cuda.py">its CUDA platform</a>);
# SGLang's default page is a single token
# (<a href="https://github.com/sgl-project/sglang/blob/main/docs/advanced_features/server_arguments.md">`--page-size`</a>),
# and it matches prefixes token by token in a radix tree
# (<a href="https://arxiv.org/abs/2312.07104">Zheng et al., §3</a>). The waste per sequence is the
# empty end of its last block: between 0 and block_size − 1 slots, about half a block on average.
# This table averages over all 64 requests; the first one counted only those that fit, so its waste
# at blocks of 16 differs a little.

# %%
# NBVAL_CHECK_OUTPUT
sizes = block_size_table(cfg, requests, budget)
print(sizes[["block_size", "num_blocks", "waste_per_sequence", "rule_of_thumb", "waste_share",
             "sequences_fit"]].round(3).to_string(index=False))

# %%
from kvlab.lessons.l07_memory_is_capacity.figures import plot_block_size

plot_block_size(sizes)

# %%
# NBVAL_CHECK_OUTPUT
verdicts(sizes, "waste_is_about_half_a_block", "bigger_blocks_fit_fewer", fold=True)

# %% [markdown]
# ## Max context and max new tokens are capacity levers
#
# A server sets the longest context it accepts (`max_model_len`:
# <a href="https://github.com/vllm-project/vllm/blob/main/vllm/v1/engine/input_processor.py">vLLM</a>
# rejects a longer prompt, unless the request asks to cut it with
# <a href="https://docs.vllm.ai/en/stable/serving/openai_compatible_server/#extra-parameters">`truncate_prompt_tokens`</a>)
# and the most tokens it generates per answer (`max_new_tokens`). Both bound a sequence's cache, so both
# decide how many fit. A reserving server must set aside prompt + max new tokens for every request;
# a paging one holds only what is written.

# %%
# NBVAL_CHECK_OUTPUT
levers = capacity_levers(cfg, requests, spec)
print(levers.to_string(index=False, float_format=lambda x: f"{x:.1f}"))

# %%
from kvlab.lessons.l07_memory_is_capacity.figures import plot_capacity_levers

plot_capacity_levers(levers)

# %%
# NBVAL_CHECK_OUTPUT
verdicts(levers, "shorter_answers_help_reservation_most")

# %%
# NBVAL_CHECK_OUTPUT
verdicts(levers, "small_reservation_matches_paging", "short_context_cuts_prompts", fold=True)

# %% [markdown]
# Lowering max new tokens shrinks every reservation, so a reserving server admits many more; a
# paging server gains less, because it never held the unused room. With a small cap the two fit
# about as many (an exact reservation wastes nothing, while paging rounds up to whole blocks):
# paging's advantage is that it does not have to guess. A shorter max context cuts long prompts
# (`prompts_cut`): more capacity, but those requests lose part of their input.

# %% [markdown]
# <!-- kvlab:exercise check_sequences_fit -->

# %% [markdown]
# <!-- kvlab:exercise check_in_block_waste -->

# %% [markdown]
# Attention finds a paged sequence's keys and values through its block table. The last exercise
# writes that gather.

# %% [markdown]
# <!-- kvlab:exercise check_paged_attention -->

# %% [markdown]
# ### Try it
#
# - `paged_vs_reserved(cfg, requests, spec, max_new_tokens=64)`:
#   how close do the schemes get when requests promise to stay short?
# - `capacity_workload(cfg, n=64, profile="long_gen")`: all long generations. Does paging still win
#   by as much?

# %% [markdown]
# ## Summary
#
# - The KV budget, divided by what each sequence holds, is how many requests run at once.
#   Reserving each request's maximum leaves most of the budget empty; paged blocks waste only the
#   end of each last block, about half a block per sequence.
# - Larger blocks mean less bookkeeping and more waste.
# - Max context and max new tokens bound each sequence's cache: they are capacity settings, and
#   matter most to a server that reserves.

# %% [markdown]
# ### Going deeper: the code behind this notebook
#
# `kvlab.serving.BlockManager`, `kvlab.experiments.capacity` (`paged_vs_reserved`,
# `block_size_table`, `capacity_levers`), `kvlab.lessons.l07_memory_is_capacity.figures`, the claims
# in `kvlab/lessons/l07_memory_is_capacity/claims.py`; tests in `tests/test_experiments_serving.py`,
# `tests/test_block_manager.py` and `tests/test_claims_07.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
