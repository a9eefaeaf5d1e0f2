"""Write notebooks/05_batching.ipynb (and with --execute, run it and save its outputs).

    python scripts/nb_05_batching.py              # write the notebook, no outputs
    python scripts/nb_05_batching.py --execute    # write, run top to bottom, save with outputs
"""
from __future__ import annotations

import sys
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

sys.path.insert(0, str(Path(__file__).parent))
from build_notebooks import write_notebook, SETUP, header, navigation  # noqa: E402

from kvlab.course import lesson  # noqa: E402

FILE = "05_batching.ipynb"


def cells() -> list:
    entry = lesson(FILE)
    return [
        new_markdown_cell(header(entry, "05") + """

One request at a time leaves most of a machine idle: a decode step for one sequence costs almost
as much as a step for several, because the weights are read once either way. So servers
**batch**: they run many requests in the same steps. How they form those batches decides who
waits, and for how long. This notebook runs the same requests through two batching rules on a
real model and draws what happened."""),
        new_code_cell(SETUP),
        new_markdown_cell("""## What you will be able to do

- explain static batching and continuous batching, and predict when they differ;
- read a Gantt chart of requests and a per-step picture of what each batch held;
- measure throughput and time to first token of each policy on the same requests;
- explain the "wait for a fuller batch" knob: what it buys, and who pays for it."""),
        new_markdown_cell("""## Two rules for forming a batch

- **Static batching**: take up to `max_seqs` requests from the queue and run them together until
  **the longest one** finishes. Only then form the next batch. A request that finishes early
  leaves its slot empty; a request that arrives meanwhile waits for the whole batch to end.
- **Continuous batching** (iteration-level scheduling, from the Orca paper, used by vLLM and
  transformers' `generate_batch`): rebuild the batch at **every step**. When a sequence finishes,
  its slot goes to the next request in the queue at the very next step; a new request's prompt
  can even share a step with the others' decodes.

When every request asks for the same number of tokens, they all finish together and the two rules
do the same thing. The difference appears with mixed lengths, which is what real traffic has."""),
        new_code_cell('''%matplotlib inline
from kvlab.experiments.serving_run import lesson_model

model = lesson_model()
print(f"{model.config.name}: {model.num_parameters() / 1e6:.1f}M parameters")'''),
        new_markdown_cell("""## Same requests, two policies

Twelve requests arrive together; prompts and outputs have mixed lengths; four batch slots. Press
**Run**, then switch to *equal* lengths, or change the number of slots."""),
        new_code_cell('''from kvlab.widgets.batching import batching_panel

panel = batching_panel(model)
panel'''),
        new_code_cell('''result = panel.run()   # the same as pressing Run
result.show()'''),
        new_markdown_cell("""**Reading the Gantt charts** (one row per request, same time axis). With static batching
the second group of four (requests 4 to 7) starts only when the **longest** member of the first
group is done: look at the long grey queue bars lining up at the same moment. With continuous
batching the queue bars end one by one, each as soon as a slot frees. The table counts steps and
sequences per step: fewer steps for the same tokens means fuller batches.

What each step actually held, step by step:"""),
        new_code_cell('''from kvlab.plots.batches import plot_batch_composition

plot_batch_composition(result.frame.attrs["trace"], by="run", max_seqs=4)'''),
        new_markdown_cell("""Bottom row: the static batch starts full, then thins out as its members finish (the staircase)
until the last one is done; continuous batching stays at four as long as anyone is waiting. Top
row: tokens computed per step. The tall orange bars are prompts; with continuous batching they
arrive in the middle of decoding, sharing a step with the running sequences.

## Equal vs mixed lengths

The same comparison with every request asking for the same lengths (same totals as before):"""),
        new_code_cell('''import pandas as pd
from kvlab.experiments.batching import batching_table, compare_policies
from kvlab.plots.policies import plot_policy_tradeoff

equal = compare_policies(model, lengths=("equal",))
table = pd.concat([batching_table(equal), result.frame.attrs["runs"]], ignore_index=True)
display(table[["run", "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_n", "steps", "mean_batch"]].round(3))
plot_policy_tradeoff(table)'''),
        new_markdown_cell("""With equal lengths both policies run the same number of steps with full batches: any gap in
their timings is the machine, not the policy (run it twice and watch the gap move). With mixed
lengths, continuous batching needs fewer steps for the same tokens, so it finishes sooner, and its
first tokens come sooner because a freed slot is reused at once.

## The same runs, exactly

Timings on a shared machine jitter. The scheduling itself does not: the cell below runs the same
requests through the engine's real scheduler with a **fixed step-cost executor** (every step
costs 10 ms, no model runs, virtual clock). The step counts of the static runs can then be
predicted by hand: each batch lasts as long as its longest output."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
from kvlab.experiments.serving_run import FixedStepCostExecutor

exact = compare_policies(model, executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")
for row, run in zip(batching_table(exact).itertuples(), exact):
    line = (f"{row.run:26s} steps {row.steps:3d}, sequences/step {row.mean_batch:4.2f}, "
            f"TTFT p50 {row.ttft_p50_s * 1e3:4.0f} ms, output {row.output_tokens_per_s:5.1f} tokens/s")
    if run.extra["policy"] == "static":
        outputs = [r.max_new_tokens for r in run.records]
        by_hand = sum(max(outputs[i:i + 4]) for i in range(0, len(outputs), 4))
        line += f"  | by hand: sum of longest outputs = {by_hand}"
    print(line)'''),
        new_markdown_cell("""### Exercise 1: empty slots

Four requests want 8, 16, 32 and 64 output tokens; static batching with `max_seqs = 2` runs them
as two batches, in order. Counting one *slot* as one sequence for one step, and ignoring
prefill, how many slots sit idle because a member finished before its batch did?"""),
        new_code_cell('''from kvlab.exercises import check_idle_slots

my_idle_slots = None   # a whole number
check_idle_slots(my_idle_slots)'''),
        new_markdown_cell("""<details><summary>Solution</summary>

Batch 1 = (8, 16): it lasts 16 steps with 2 slots = 32 slots, of which 8 + 16 = 24 produce a token:
8 idle. Batch 2 = (32, 64): 2 × 64 = 128 slots, 96 used: 32 idle. In all **40** idle slots, a quarter
of what ran. `kvlab.experiments.batching.idle_slots` does the same count.
</details>

### Exercise 2: when does the third request start?

Same four requests (prompts of 16 tokens), `max_seqs = 2`, all arriving at once. At which step
(counting from 0) is request 2, the third one, admitted under continuous batching, and under
static batching? (A request's prefill step also produces its first token.)"""),
        new_code_cell('''from kvlab.exercises import check_admission_step

my_continuous, my_static = None, None   # replace None with step numbers
check_admission_step(None if my_continuous is None else (my_continuous, my_static))'''),
        new_markdown_cell("""<details><summary>Solution</summary>

Request 0 produces its 8 tokens in steps 0 to 7, so with continuous batching its slot goes to
request 2 at **step 8**. With static batching the batch (0, 1) lasts until request 1's 16th token
(step 15), so request 2 starts at **step 16**. The checker runs the engine's scheduler to get these.
</details>

## The "wait for a fuller batch" knob

A static server can also wait a little before starting a batch, hoping more requests arrive to
fill it (`batch_wait_s`: start when the batch is full or its first member has waited that long).
Here twelve requests trickle in, one every 83 ms, and each batch may hold six."""),
        new_code_cell('''from kvlab.experiments.batching import batch_wait_runs
from kvlab.experiments.serving_run import runs_frame
from kvlab.plots.policies import plot_batch_wait

waits = batch_wait_runs(model, waits=(0.0, 0.15, 0.3, 0.6), rate=12.0, n=12, max_seqs=6)
wait_table = batching_table(waits)
display(wait_table[["run", "batch_wait_s", "mean_batch", "tokens_per_busy_s", "ttft_p50_s", "ttft_p95_s",
                    "ttft_n"]].round(3))
plot_batch_wait(wait_table)'''),
        new_markdown_cell("""**Reading the figure.** Right: the longer the server waits, the fuller its batches and the more
output it gets from each second the model is busy (the batching gain). Left: the price, in time
to first token: the first member of each batch now waits for the others to arrive. Waiting
helps a static server in one way, too: without it, the first request forms a batch of one that
everyone arriving next must wait out. Continuous batching (dotted lines) needs no such bet: it
starts at once, and late arrivals join the running batch at the next step.

The same trade as Gantt charts:"""),
        new_code_cell('''from kvlab.plots.gantt import plot_gantts

frame = runs_frame([waits[0], waits[-2], waits[-1]])
plot_gantts(frame, frame.attrs["steps"])'''),
        new_markdown_cell("""### Try it

- In the panel, choose **equal** lengths: do the two Gantt charts still differ?
- Set **batch slots** to 1: batching is off. How much lower is the throughput of both policies?
- Set **batch slots** to 8 with 24 requests: which policy gains more from the extra slots?
- Rerun the knob with `rate=4.0` (a slower trickle). What does a 600 ms wait cost now?

## Summary

- Batching shares each step's cost among many sequences; the rule that forms batches decides who waits.
- Static batching runs a batch until its longest member finishes: with mixed lengths, slots sit
  idle and queued requests wait for the slowest member. Continuous batching refills a slot at the
  next step.
- With equal lengths the two rules coincide; the difference comes from the spread of lengths.
- Waiting for a fuller batch buys work per second of compute and costs time to first token;
  continuous batching gets full batches without making anyone wait for them.
- Behind this notebook: `kvlab.serving.Scheduler` (policies), `kvlab.experiments.batching`
  (`compare_policies`, `batch_wait_runs`, `batching_table`, `idle_slots`), `kvlab.plots.gantt`,
  `kvlab.plots.batches`, `kvlab.plots.policies`; tests in `tests/test_experiments_serving.py`."""),
        new_markdown_cell(navigation(entry)),
    ]


def main() -> None:
    write_notebook(FILE, cells, __doc__)


if __name__ == "__main__":
    main()
