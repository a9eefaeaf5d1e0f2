"""Write notebooks/07_memory_is_capacity.ipynb (and with --execute, run it and save its outputs).

    python scripts/nb_07_memory_is_capacity.py              # write the notebook, no outputs
    python scripts/nb_07_memory_is_capacity.py --execute    # write, run top to bottom, save with outputs
"""
from __future__ import annotations

import sys
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

sys.path.insert(0, str(Path(__file__).parent))
from build_notebooks import write_notebook, SETUP, header, navigation  # noqa: E402

from kvlab.course import lesson  # noqa: E402

FILE = "07_memory_is_capacity.ipynb"


def cells() -> list:
    entry = lesson(FILE)
    return [
        new_markdown_cell(header(entry, "07") + """

Every running request keeps its KV cache in memory until it ends, and that cache grows with
every token. So the memory set aside for KV decides how many requests a server can work on at
once, which in turn decides how full its batches are and how long the queue gets. This notebook
counts how many sequences fit a budget under two ways of handing out memory, then runs the engine
at the edge of its budget."""),
        new_code_cell(SETUP),
        new_markdown_cell("""## What you will be able to do

- count how many sequences fit a KV budget when each reserves its maximum length, and when memory
  comes in fixed-size blocks (paging), and say where the rest of the budget goes;
- choose a block size knowing what it wastes;
- use max context and max new tokens as capacity levers;
- recognise preemption, and measure what it costs;
- measure what prefix caching saves on a shared system prompt, and how chunked prefill keeps the
  time between tokens steady when a long prompt arrives."""),
        new_markdown_cell("""## Two ways to hand out KV memory

- **Reserve the maximum**: when a request is admitted, set aside room for the longest it could
  become (here: the whole context). Simple and safe, but a short answer leaves most of its room
  empty, and nobody else can use it.
- **Paged blocks** (PagedAttention, vLLM): memory is a pool of fixed-size blocks of, say, 16 tokens;
  a sequence gets a new block only when its last one is full, and a table maps its positions to
  blocks scattered anywhere in the pool. The only waste is the unfilled end of each sequence's
  last block.

The budget below holds 8 sequences at the model's full context (1,024 tokens); the workload is
64 requests mixing chat turns, long documents and long generations."""),
        new_code_cell('''%matplotlib inline
from kvlab.experiments.serving_run import lesson_model

model = lesson_model()'''),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
from kvlab.experiments.capacity import (block_size_table, budget_for_tokens, bytes_per_token, capacity_levers,
                                        capacity_workload, paged_vs_reserved)

cfg = model.config
requests = capacity_workload(cfg, n=64)
budget = budget_for_tokens(cfg, 8 * 1024)
print(f"{cfg.name}: {bytes_per_token(cfg):,} bytes of K/V per token; budget {budget:,} bytes = 8,192 tokens")
table = paged_vs_reserved(cfg, requests, budget, block_size=16, max_model_len=1024)
res, pag = table.iloc[0], table.iloc[1]
print(f"reserve max length: by hand 8,192 // 1,024 = {8192 // 1024}   counted: {res.sequences_fit}")
print(f"paged blocks      : by hand {pag.formula_fit} (first k with sum of ceil(n/16) <= 512 blocks)   "
      f"BlockManager: {int(pag.block_manager_fit)}")
print(f"ratio: {pag.sequences_fit / res.sequences_fit:.1f}x more sequences in the same memory")
print(table[["scheme", "sequences_fit", "tokens_held", "in_block_waste_tokens", "reserved_unused_tokens",
             "free_tokens", "waste_share"]].round(3).to_string(index=False))'''),
        new_code_cell('''from kvlab.plots.capacity import plot_paged_vs_reserved

plot_paged_vs_reserved(table)'''),
        new_markdown_cell("""**Reading the figure.** Reserving the maximum fills the budget with 8 sequences, and most of
what it holds is reserved space that no token will ever use. Paging fits about four times as
many in the same bytes; what it wastes is a few percent, the empty ends of last blocks. (The
PagedAttention paper reports the same picture on real servers: earlier systems used only a
fraction of their KV memory for actual tokens, paging brought the waste down to a few percent.)
More sequences at once means fuller batches, which is where throughput comes from (notebook 05).

## Block size

Why not blocks of 1 token, then? Each block costs bookkeeping (table entries, one gather per
block in attention, one hash per block for prefix caching), so real engines use 16 or 32. The
waste per sequence is the empty end of its last block: between 0 and block_size − 1 slots, about
half a block on average."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
from kvlab.plots.capacity import plot_block_size

sizes = block_size_table(cfg, requests, budget)
print(sizes[["block_size", "num_blocks", "waste_per_sequence", "rule_of_thumb", "waste_share",
             "sequences_fit"]].round(3).to_string(index=False))'''),
        new_code_cell('''plot_block_size(sizes)'''),
        new_markdown_cell("""## Max context and max new tokens are capacity levers

A server sets two limits: the longest context it accepts (`max_model_len`, prompts are cut to
fit) and the most tokens it will generate per answer (`max_new_tokens`). Both bound how big each
sequence's cache can get, so both decide how many fit. A reserving server must set aside prompt
+ max new tokens for every request, whatever it ends up writing; a paging one only holds what is
really written."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
from kvlab.plots.capacity import plot_capacity_levers

levers = capacity_levers(cfg, requests, budget)
print(levers.to_string(index=False, float_format=lambda x: f"{x:.1f}"))'''),
        new_code_cell('''plot_capacity_levers(levers)'''),
        new_markdown_cell("""Lowering max new tokens lets a reserving server admit many more requests, because every
reservation shrinks; the paging server gains less, because it never held the unused room in the
first place. When the reservation is close to what requests really use (small max new tokens),
the two schemes fit about as many: paging wins by not guessing. Lowering the max context cuts
long prompts (the `prompts_cut` column): more capacity, but those requests lose part of their input.

### Exercise 1: count them yourself

Six sequences reach 100, 40, 300, 17, 250 and 50 tokens, arriving in that order. The pool has 48
blocks of 16 tokens (768 token slots). How many fit at once, first come first served, with
paged blocks? And if each instead reserves 512 tokens?"""),
        new_code_cell('''from kvlab.exercises import check_sequences_fit

my_paged, my_reserved = None, None   # replace None with whole numbers
check_sequences_fit(None if my_paged is None else (my_paged, my_reserved))'''),
        new_markdown_cell("""<details><summary>Solution</summary>

Blocks needed: ⌈100/16⌉ = 7, then 3, 19, 2, 16, 4. Running total: 7, 10, 29, 31, 47, 51: the sixth
would pass 48, so **5** fit (adding tokens instead gives 757 ≤ 768 and the wrong answer 6: each
sequence takes whole blocks). Reserving 512 each: 768 // 512 = **1**.
</details>

### Exercise 2: one sequence's waste

How many token slots are wasted in the last block of a 100-token sequence with blocks of 16?"""),
        new_code_cell('''from kvlab.exercises import check_in_block_waste

check_in_block_waste(None)   # replace None with a whole number'''),
        new_markdown_cell("""<details><summary>Solution</summary>

7 blocks = 112 slots for 100 tokens: **12** empty slots (the last block holds 4 tokens and 12 gaps).
</details>

## When the budget runs out: preemption

The engine admits a request when there are blocks for its prompt, not for the answer it has not
written yet. If the running sequences then grow past the budget, one of them must give its
blocks back: vLLM (and kvlab) **preempt** the most recently admitted sequence, free its blocks, and
put it back at the front of the queue; when it returns, its prompt and the tokens it had already
written are computed again (*recompute*). Nothing is lost for the user except time.

Twelve requests with short prompts and long answers, and a budget of 40 blocks (640 tokens).
Press **Run**, then move the budget."""),
        new_code_cell('''from kvlab.widgets.capacity import kv_budget_panel

panel = kv_budget_panel(model)
panel'''),
        new_code_cell('''result = panel.run()   # the same as pressing Run
result.show()'''),
        new_markdown_cell("""Each red triangle is a step where the pool was full and a sequence was sent back to the queue.
The same requests with enough room for all of them, for comparison (the whole pool is then
192 blocks, far more than needed):"""),
        new_code_cell('''import pandas as pd
from kvlab.experiments.capacity import preemption_runs, preemption_table
from kvlab.plots.kv_blocks import plot_kv_blocks

ample = preemption_runs(model, kv_blocks=(None,))
display(pd.concat([preemption_table(ample), result.frame.attrs["preemption"]], ignore_index=True).round(3))
plot_kv_blocks(pd.concat([ample[0].trace, result.frame.attrs["trace"]]), by="run", block_size=16)'''),
        new_markdown_cell("""The tight budget keeps the pool full the whole time (it is using its memory well) but pays twice:
tokens computed again after each preemption, and fewer sequences per step. Recomputed tokens
are counted exactly: serving each request once computes prompt + output − 1 tokens, and
everything above that was recomputed. The same counts with a fixed step-cost executor, which
makes the scheduling exact and repeatable:"""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
from kvlab.experiments.serving_run import FixedStepCostExecutor

exact = preemption_runs(model, kv_blocks=(None, 40), executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")
print(preemption_table(exact)[["run", "preemptions", "recomputed_tokens", "peak_running", "peak_blocks_used",
                               "steps", "completed"]].to_string(index=False))'''),
        new_markdown_cell("""## Prefix caching: a shared system prompt

Many requests start with the same text: a system prompt, a long instruction, a shared document.
Their first blocks hold the same tokens, hence the same keys and values. With **prefix caching**
the engine names every full block by a hash of its tokens and of all the blocks before it, and a
new request whose first blocks match reuses them instead of computing them. Ten chat requests
sharing a 256-token system prompt, arriving eight per second, with caching off and on:"""),
        new_code_cell('''from kvlab.experiments.capacity import prefix_caching_runs, prefix_caching_table
from kvlab.experiments.serving_run import runs_frame
from kvlab.plots.gantt import plot_gantts

prefix = prefix_caching_runs(model)
display(prefix_caching_table(prefix).round(3))
frame = runs_frame(prefix)
plot_gantts(frame, frame.attrs["steps"])'''),
        new_markdown_cell("""`expected_hit_tokens` is the hand count: every request after the first reuses the 16 full
blocks of the system prompt, 9 × 256 tokens. With caching on, most prompt tokens are never
computed, the orange prefill bars shrink, and TTFT drops by the time those tokens took.
(If a request arrives while the first one is still computing its prompt, it finds fewer blocks
ready: measured hits can fall below the hand count on a slow machine.)

### Exercise 3: what can be reused?

A 250-token system prompt, blocks of 16, and a request whose prompt is that system prompt
followed by 50 words of its own. How many of its prompt tokens can come from the prefix cache?"""),
        new_code_cell('''from kvlab.exercises import check_prefix_hit

check_prefix_hit(None)   # replace None with a whole number'''),
        new_markdown_cell("""<details><summary>Solution</summary>

250 // 16 = 15 full blocks hold nothing but system prompt: **240** tokens. The 16th block holds
the last 10 system-prompt tokens and the first 6 of the user's own, so its hash differs from
any other request's.
</details>

## Chunked prefill: a long prompt among running answers

Four requests are writing long answers when a 768-token prompt arrives. If the engine computes
that whole prompt in one step, every running answer waits for that step: a visible pause in the
middle of their text. **Chunked prefill** caps the tokens per step (here 64) and spreads the prompt
over several steps, each also carrying one token of every running answer."""),
        new_code_cell('''from kvlab.experiments.capacity import chunked_prefill_runs, chunked_prefill_table
from kvlab.plots.token_gaps import plot_token_gaps

chunked = chunked_prefill_runs(model)
display(chunked_prefill_table(chunked).round(3))
frame = runs_frame(chunked)
plot_token_gaps(frame, exclude=[chunked[0].extra["long_id"]],
                marks={"long prompt arrives": chunked[0].extra["long_arrival_s"]})'''),
        new_markdown_cell("""**Reading the figure.** Each dot is one token of a running answer, placed at the time it
arrived, at the height of the gap before it. Without chunking one gap is as long as the whole
prompt's computation; with chunks the gaps grow a little for a while and never spike. The price
is paid by the long request: its first token comes later, because its prompt now shares steps.
Which is better depends on which clock matters: steady text for everyone already reading, or a
sooner start for the newcomer.

### Try it

- In the panel, raise the budget until the preemptions stop. How many blocks does that take, and
  how does it compare with the 192 blocks a worst-case reservation would need?
- Set the budget to 16 blocks (one request at full length): what happens to the number of sequences at once?
- `paged_vs_reserved(cfg, requests, budget, block_size=16, max_model_len=1024, max_new_tokens=64)`:
  how close do the two schemes get when requests promise to stay short?
- `chunked_prefill_runs(model, chunk_tokens=256)`: where is the balance between steady gaps and a sooner first token?

## Summary

- The KV budget, divided by what each sequence holds, is how many requests can run at once.
  Reserving each request's maximum wastes most of the budget; paged blocks waste only the end of
  each last block, about half a block per sequence.
- Max context and max new tokens bound each sequence's cache: they are capacity settings, not
  only product settings.
- A budget that runs out forces preemption: sequences recompute their tokens later, costing
  compute and latency, and nothing else.
- Prefix caching reuses the blocks of a shared prompt: fewer tokens computed, a sooner first token.
- Chunked prefill keeps the time between tokens steady when a long prompt arrives, at the cost of
  that prompt's own first token.
- Behind this notebook: `kvlab.serving.BlockManager` and `Scheduler`, `kvlab.experiments.capacity`,
  `kvlab.plots.capacity`, `kvlab.plots.kv_blocks`, `kvlab.plots.token_gaps`; tests in
  `tests/test_experiments_serving.py` and `tests/test_block_manager.py`."""),
        new_markdown_cell(navigation(entry)),
    ]


def main() -> None:
    write_notebook(FILE, cells, __doc__)


if __name__ == "__main__":
    main()
