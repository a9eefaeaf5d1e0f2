# %% [markdown]
# <!-- kvlab:header -->
# Every running request keeps its KV cache in memory until it ends, and that cache grows with
# every token. So the memory set aside for KV decides how many requests a server can work on at
# once, which in turn decides how full its batches are and how long the queue gets. This notebook
# counts how many sequences fit a budget under two ways of handing out memory, and which settings
# change the count. Nothing here is timed: every number is a count, the same on every machine. The
# next notebook runs the engine at the edge of its budget.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - count how many sequences fit a KV budget when each reserves its maximum length, and when memory
#   comes in fixed-size blocks (paging), and say where the rest of the budget goes;
# - choose a block size knowing what it wastes;
# - use max context and max new tokens as capacity levers.

# %% [markdown]
# ## Two ways to hand out KV memory
#
# - **Reserve the maximum**: when a request is admitted, set aside room for the longest it could
#   become (here: the whole context). Simple and safe, but a short answer leaves most of its room
#   empty, and nobody else can use it.
# - **Paged blocks** (PagedAttention, vLLM): memory is a pool of fixed-size blocks of, say, 16 tokens;
#   a sequence gets a new block only when its last one is full, and a table maps its positions to
#   blocks scattered anywhere in the pool. The only waste is the unfilled end of each sequence's
#   last block.
#
# The budget below holds 8 sequences at the model's full context (1,024 tokens); the workload is
# 64 requests mixing chat turns, long documents and long generations, all waiting to be admitted.
# Each scheme admits them first come, first served, until the next one does not fit.
#
# Reserving the whole context, 8 of them fit: that is how the budget was chosen. Before you run the
# count, predict how many fit when memory comes in paged blocks of 16 tokens.

# %%
# %matplotlib inline
from kvlab.runs.serving_run import lesson_model
from kvlab.lessons.common.predict import predict

cfg = lesson_model().config
guess = predict("With paged blocks of 16 tokens, how many of the 64 requests fit the budget that holds 8 "
                "full-context reservations?", unit="sequences")
guess

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons.l07_memory_is_capacity.capacity import (block_size_table, budget_for_tokens, bytes_per_token, capacity_levers,
                                        capacity_workload, paged_vs_reserved)

requests = capacity_workload(cfg, n=64)
budget = budget_for_tokens(cfg, 8 * 1024)
print(f"{cfg.name}: {bytes_per_token(cfg):,} bytes of K/V per token; budget {budget:,} bytes = 8,192 tokens")
table = paged_vs_reserved(cfg, requests, budget, block_size=16, max_model_len=1024)
display(guess.fold(table[["scheme", "sequences_fit", "formula_fit", "block_manager_fit", "tokens_held",
                          "in_block_waste_tokens", "reserved_unused_tokens", "free_tokens",
                          "waste_share"]].round(3).to_string(index=False)))

# %%
# NBVAL_CHECK_OUTPUT
guess.against(table.set_index("scheme").at["paged blocks", "sequences_fit"])

# %% [markdown]
# `formula_fit` is the count by hand (reserved: the budget divided by the context; paged: the first
# *k* requests whose blocks, ⌈tokens / 16⌉ each, add up to at most the pool's 512 blocks).
# `block_manager_fit` is the engine's own `BlockManager` allocating them one by one.

# %%
from kvlab.lessons.l07_memory_is_capacity.figures import plot_paged_vs_reserved

plot_paged_vs_reserved(table)

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons import verdicts

verdicts(table, "reservation_fits_budget_over_context", "paging_fits_more_sequences", "reservation_wastes_most",
         "paging_wastes_only_last_blocks", after=guess)

# %% [markdown]
# ### Your own budget
#
# The same count for the budget, context limit, block size and queue you choose. Press **Run**, then
# halve the budget, or raise the max context: which scheme loses more sequences?

# %%
from kvlab.lessons.l07_memory_is_capacity.panel import capacity_panel

panel = capacity_panel(cfg)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %% [markdown]
# **Reading the figure.** Reserving the maximum fills the budget with as many sequences as the
# context divides into it, and most of what those reservations hold is space no token will ever
# use. Paging fits several times as many in the same bytes; what it wastes is the empty ends of
# last blocks. (The PagedAttention paper reports the same picture on real servers: earlier systems
# used only a fraction of their KV memory for actual tokens, and paging brought the waste down to
# a few percent.) More sequences at once means fuller batches, which is where throughput comes
# from (notebook 05).
#
# ## Block size
#
# Why not blocks of 1 token, then? Each block costs bookkeeping (table entries, one gather per
# block in attention, one hash per block for prefix caching), so vLLM's default is 16 tokens per
# block (SGLang's default page is a single token, and it matches prefixes token by token in a radix
# tree instead of hashing blocks). The
# waste per sequence is the empty end of its last block: between 0 and block_size − 1 slots, about
# half a block on average.

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
verdicts(sizes, "waste_is_about_half_a_block", "bigger_blocks_fit_fewer")

# %% [markdown]
# ## Max context and max new tokens are capacity levers
#
# A server sets two limits: the longest context it accepts (`max_model_len`, prompts are cut to
# fit) and the most tokens it will generate per answer (`max_new_tokens`). Both bound how big each
# sequence's cache can get, so both decide how many fit. A reserving server must set aside prompt
# + max new tokens for every request, whatever it ends up writing; a paging one only holds what is
# really written.

# %%
# NBVAL_CHECK_OUTPUT
levers = capacity_levers(cfg, requests, budget)
print(levers.to_string(index=False, float_format=lambda x: f"{x:.1f}"))

# %%
from kvlab.lessons.l07_memory_is_capacity.figures import plot_capacity_levers

plot_capacity_levers(levers)

# %%
# NBVAL_CHECK_OUTPUT
verdicts(levers, "shorter_answers_help_reservation_most", "small_reservation_matches_paging",
         "short_context_cuts_prompts")

# %% [markdown]
# Lowering max new tokens lets a reserving server admit many more requests, because every
# reservation shrinks; the paging server gains less, because it never held the unused room in the
# first place. When the reservation is close to what requests really use (a small max new tokens),
# the two schemes fit about as many, and reserving can even fit a few more, since an exact
# reservation wastes nothing while paging still rounds each sequence up to whole blocks: paging's
# advantage is that it does not have to guess. Lowering the max context
# cuts long prompts (the `prompts_cut` column): more capacity, but those requests lose part of their
# input.

# %% [markdown]
# <!-- kvlab:exercise check_sequences_fit -->

# %% [markdown]
# <!-- kvlab:exercise check_in_block_waste -->

# %% [markdown]
# Attention never sees a paged sequence's cache in one piece: it finds each token's keys and values
# through the block table, wherever their blocks sit in the pool. The last exercise writes that gather.

# %% [markdown]
# <!-- kvlab:exercise check_paged_attention -->

# %% [markdown]
# ### Try it
#
# - `paged_vs_reserved(cfg, requests, budget, block_size=16, max_model_len=1024, max_new_tokens=64)`:
#   how close do the two schemes get when requests promise to stay short?
# - `capacity_workload(cfg, n=64, profile="long_gen")` makes every request a long generation. Count
#   again: does paging still win by as much, and why?
# - `block_size_table(cfg, requests, budget_for_tokens(cfg, 2 * 1024))`: with a small budget, how
#   much does the block size matter now?
#
# ## Summary
#
# - The KV budget, divided by what each sequence holds, is how many requests can run at once.
#   Reserving each request's maximum leaves most of the budget empty; paged blocks waste only the
#   end of each last block, about half a block per sequence.
# - Larger blocks mean less bookkeeping and more waste; vLLM settles on 16 tokens by default.
# - Max context and max new tokens bound each sequence's cache: they are capacity settings, not
#   only product settings. They matter most to a server that reserves.
# - The counts above are the same on every machine; the verdicts under each table check the
#   sentences against them.
# - Behind this notebook: `kvlab.serving.BlockManager`, `kvlab.lessons.l07_memory_is_capacity.capacity`
#   (`paged_vs_reserved`, `block_size_table`, `capacity_levers`), `kvlab.lessons.l07_memory_is_capacity.figures`, the claims in
#   `kvlab/lessons/l07_memory_is_capacity/claims.py`; tests in `tests/test_experiments_serving.py`,
#   `tests/test_block_manager.py` and `tests/test_claims_07.py`.

# %% [markdown]
# <!-- kvlab:navigation -->