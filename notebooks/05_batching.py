# %% [markdown]
# <!-- kvlab:header -->
# One request at a time leaves most of a machine idle: a decode step for several sequences costs
# far less than that many steps for one, because what a step pays once (reading every weight,
# starting every operation) is shared by all the sequences in it (your run checks this below, and
# says which of the two dominates on your machine). So servers **batch**: they run many requests in the same steps. How they
# form those batches decides who waits, and for how long. This notebook runs the same requests
# through two batching rules on a real model and draws what happened.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - explain static batching and continuous batching, and predict when they differ;
# - read a Gantt chart of requests and a per-step picture of what each batch held;
# - measure throughput and time to first token of each policy on the same requests;
# - write the rule that admits waiting requests into the batch, and check it against the engine's own;
# - explain the "wait for a fuller batch" knob: what it buys, and who pays for it.

# %% [markdown]
# ## Two rules for forming a batch
#
# - **Static batching**: take up to `max_seqs` requests from the queue and run them together until
#   **the longest one** finishes. Only then form the next batch. A request that finishes early
#   leaves its slot empty; a request that arrives meanwhile waits for the whole batch to end.
# - **Continuous batching** (iteration-level scheduling, from the Orca paper, used by vLLM and
#   transformers' `generate_batch`): rebuild the batch at **every step**. When a sequence finishes,
#   its slot goes to the next request in the queue at the very next step; a new request's prompt
#   can even share a step with the others' decodes.
#
# When every request asks for the same number of tokens, they all finish together and the two rules
# do the same thing. The difference appears with mixed lengths, which is what real traffic has.

# %%
# %matplotlib inline
from kvlab.runs.serving_run import lesson_model

model = lesson_model()
print(f"{model.config.name}: {model.num_parameters() / 1e6:.1f}M parameters")

# %% [markdown]
# ## Same requests, two policies
#
# Twelve requests arrive together; prompts and outputs have mixed lengths; four batch slots. Press
# **Run**, then switch to *equal* lengths, or change the number of slots.

# %%
from kvlab.lessons.l05_batching.panel import batching_panel

panel = batching_panel(model)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %%
from kvlab.lessons import verdicts

verdicts(result, "a_batched_step_costs_less_than_separate_steps")

# %% [markdown]
# **Reading the Gantt charts** (one row per request, same time axis). With static batching
# the second group of four (requests 4 to 7) starts only when the **longest** member of the first
# group is done: look at the long grey queue bars lining up at the same moment. With continuous
# batching the queue bars end one by one, each as soon as a slot frees. The table counts steps and
# sequences per step: fewer steps for the same tokens means fuller batches.
#
# What each step actually held, step by step:

# %%
from kvlab.lessons.l05_batching.figures_batches import plot_batch_composition

plot_batch_composition(result.frame.attrs["trace"], by="run", max_seqs=4)

# %% [markdown]
# Bottom row: the static batch starts full, then thins out as its members finish (the staircase)
# until the last one is done; continuous batching stays at four as long as anyone is waiting (the
# exact runs below count both). Top row: tokens computed per step. The tall orange bars are
# prompts; with continuous batching they arrive in the middle of decoding, sharing a step with the
# running sequences.
#
# ## Equal vs mixed lengths
#
# The same comparison with every request asking for the same lengths (same totals as before):

# %%
import pandas as pd
from kvlab.lessons.l05_batching.batching import batching_table, compare_policies
from kvlab.lessons.l05_batching.figures_policies import plot_policy_tradeoff

equal = compare_policies(model, lengths=("equal",))
table = pd.concat([batching_table(equal), result.frame.attrs["runs"]], ignore_index=True)
display(table[["run", "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_n", "steps", "mean_batch"]].round(3))
plot_policy_tradeoff(table)

# %%
verdicts(table, "equal_lengths_same_schedule", "mixed_lengths_continuous_serves_more_per_second",
         "mixed_lengths_continuous_first_tokens_sooner")

# %% [markdown]
# With equal lengths both policies run the same schedule, so any gap in their timings is the
# machine, not the policy: a yardstick for the noise on your machine (run it twice and watch the
# gap move). With mixed lengths, continuous batching needs fewer steps for the same tokens, so it
# can finish sooner, and its first tokens can come sooner because a freed slot is reused at once;
# the verdicts say whether your timings show it beyond that noise. The step counts are the same on
# every machine.
#
# ## The same runs, exactly
#
# Timings on a shared machine jitter. The scheduling itself does not: the cell below runs the same
# requests through the engine's real scheduler with a **fixed step-cost executor** (every step
# costs `step_s=0.010` seconds, no model runs, virtual clock). The step counts of the static runs
# can then be predicted by hand: each batch lasts as long as its longest output.
#
# **Predict first**: on the mixed lengths, how many times as many steps does static batching need
# as continuous batching for the same tokens? Type a number, then run the next two cells.

# %%
from kvlab.lessons.common.predict import predict

steps_guess = predict("Mixed lengths: static batching needs how many times as many steps as continuous batching?",
                      unit="×")
steps_guess

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.runs.serving_run import FixedStepCostExecutor

exact = compare_policies(model, executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")
lines = []
for row, run in zip(batching_table(exact).itertuples(), exact):
    line = (f"{row.run:26s} steps {row.steps:3d}, sequences/step {row.mean_batch:4.2f}, "
            f"TTFT p50 {row.ttft_p50_s * 1e3:4.0f} ms (n = {row.ttft_n}), "
            f"output {row.output_tokens_per_s:5.1f} tokens/s")
    if run.extra["policy"] == "static":
        outputs = [r.max_new_tokens for r in run.records]
        by_hand = sum(max(outputs[i:i + 4]) for i in range(0, len(outputs), 4))
        line += f"  | by hand: sum of longest outputs = {by_hand}"
    lines.append(line)
display(steps_guess.fold("\n".join(lines), what="this printout"))
verdicts(exact, "static_steps_are_the_sum_of_longest_outputs", "exact_equal_lengths_policies_coincide",
         "exact_mixed_lengths_continuous_fewer_steps", "continuous_keeps_every_slot_busy_while_requests_wait",
         after=steps_guess)

# %%
# NBVAL_CHECK_OUTPUT
steps = {(run.extra["policy"], run.extra["lengths"]): len(run.trace) for run in exact}
steps_guess.against(steps["static", "mixed"] / steps["continuous", "mixed"], what="the exact runs measured")

# %% [markdown]
# <!-- kvlab:exercise check_idle_slots -->

# %% [markdown]
# <!-- kvlab:exercise check_admission_step -->

# %% [markdown]
# <!-- kvlab:exercise check_admission_rule -->

# %% [markdown]
# Your rule next to the engine's own on the checker's requests (exact step costs, virtual clock).
# A rule that broke a limit has no row: the checker above says where.

# %%
from kvlab.lessons.l05_batching.admission import admission_run, clocks_table

builtin_run, _ = admission_run()                  # the engine's own rule
my_run, my_audit = admission_run(my_admission)    # yours, checked at every call
clocks_table([builtin_run] + ([my_run] if my_run is not None else []))

# %% [markdown]
# ## The "wait for a fuller batch" knob
#
# A static server can also wait a little before starting a batch, hoping more requests arrive to
# fill it (`batch_wait_s`: start when the batch is full or its first member has waited that long).
# Here twelve requests trickle in, evenly spaced at twelve per second (`rate=12.0`), and each batch
# may hold six.

# %%
from kvlab.lessons.l05_batching.batching import batch_wait_runs
from kvlab.runs.serving_run import runs_frame
from kvlab.lessons.l05_batching.figures_policies import plot_batch_wait

waits = batch_wait_runs(model, waits=(0.0, 0.15, 0.3, 0.6), rate=12.0, n=12, max_seqs=6)
wait_table = batching_table(waits)
display(wait_table[["run", "batch_wait_s", "mean_batch", "tokens_per_busy_s", "ttft_p50_s", "ttft_p95_s",
                    "ttft_n"]].round(3))
plot_batch_wait(wait_table)

# %%
verdicts(waits, "waiting_fills_batches_but_delays_first_tokens", "continuous_answers_first_under_a_trickle",
         "continuous_batches_only_what_has_arrived")

# %% [markdown]
# **Reading the figure.** Right: waiting gives the server fuller batches, and fuller batches get
# more output from each second the model is busy (the batching gain). Left: the price, in time
# to first token: the first member of each batch now waits for the others to arrive. Without
# any wait, the first request forms a batch of one that everyone arriving next must wait out.
# Continuous batching (dotted lines) makes no one wait for a batch: it starts each request at the
# next step, and late arrivals join the running batch. But it batches only the requests that have
# arrived and not yet finished. When the machine serves a request about as fast as the next one
# arrives, that is one or two at a time, and its work per busy second stays that of small batches;
# when requests pile up (a busy machine, a faster trickle), its slots fill. The third verdict says
# which happened on your machine.
#
# Timings on the real model depend on how fast your machine serves a request compared with how
# often they arrive. The same knob with fixed prices, on the virtual clock (a step costs `step_s`
# plus `token_s` for each token it computes, so a fuller batch costs a little more per step but far
# less per token), comes out the same everywhere:

# %%
# NBVAL_CHECK_OUTPUT
exact_waits = batch_wait_runs(model, waits=(0.0, 0.15, 0.3, 0.6), rate=12.0, n=12, max_seqs=6, clock="virtual",
                              executor=FixedStepCostExecutor(step_s=0.004, token_s=0.0001))
verdicts(exact_waits, "exact_waiting_trades_first_tokens_for_fuller_batches",
         "exact_continuous_batches_stay_small_under_a_trickle", "exact_arrivals_set_the_pace")

# %% [markdown]
# The last line is why the knob is a bet on load: while requests trickle in, the arrivals set the
# pace whatever the batches hold, so waiting delays first tokens and the efficiency of full batches
# buys no throughput. Once the machine is saturated (notebook 06), work per busy second becomes
# throughput, and continuous batching's slots stay full because requests queue.
#
# The trade on the real model as Gantt charts:

# %%
from kvlab.lessons.common.gantt import plot_gantts

frame = runs_frame([waits[0], waits[-2], waits[-1]])
plot_gantts(frame, frame.attrs["steps"])

# %% [markdown]
# ## Why batching works, measured
#
# Every rule above rests on one fact: a decode step for several sequences costs far less than that
# many steps for one. Why? A step pays two costs once, whatever its batch:
#
# - **reading the weights.** A decode step multiplies every weight matrix of the model by one new row
#   per sequence. With one sequence it reads every weight from memory to do two operations with it (a
#   multiply and an add), so the step waits on memory. With a batch of B sequences it reads the same
#   weights **once** and does B times the arithmetic;
# - **the per-operation overhead.** Every small operation of a step (a norm, a rotary embedding, a
#   reshape, the Python between them; on a GPU, each kernel launch) takes about as long for a few
#   rows as for one.
#
# Until the arithmetic takes longer than both, the extra sequences ride along almost free. Which of
# the two a batch mostly shares depends on the model and the machine. This notebook's model has a few
# million weights, read in a fraction of a millisecond, so on a CPU most of its one-sequence step is
# per-operation overhead (the verdicts under the tables say how much on your run). A GPU serving a
# 7-billion-parameter model in 16-bit precision streams 14 billion bytes of weights every step, which
# takes milliseconds even at a GPU's memory bandwidth, while its launches take microseconds each (and
# engines such as vLLM capture them in CUDA graphs): there it is the weight read that batching shares,
# the textbook "memory-bound decode".
#
# The cell below times one decode step of this notebook's model at batch sizes from 1 to 64 (each
# sequence holds only a few tokens, so the weights are most of what a step reads), the sizes taking
# turns so that a busy moment hits them all. In the same run it measures your machine's two limits:
# how fast its memory streams a large matrix through a matrix-vector product (bandwidth), and how fast
# it multiplies two large matrices (arithmetic). Each limit gives a floor no step can beat:
#
# - **memory floor** = `bytes a step reads / bandwidth` (the weights, plus the stored K/V). It is
#   flat: the weights are read once, whatever the batch;
# - **compute floor** = `2 × weights × batch / arithmetic speed` (a multiply and an add per weight and
#   sequence). It rises with the batch.
#
# Then the same question for prompts: several prompts prefilled one after the other, or all in one
# batch.

# %%
from kvlab.lessons.l05_batching.batch_scaling import batch_scaling
from kvlab.lessons.l05_batching.figures_batch_scaling import plot_batch_scaling

scaling = batch_scaling(model, batch_sizes=(1, 2, 4, 8, 16, 32, 64), repeats=5)
m = scaling.machine
print(f"this machine, {m['threads']} thread(s): memory {m['bandwidth_GBps']:.1f} GB/s (matrix-vector), "
      f"arithmetic {m['matmul_GFLOPs']:.0f} GFLOP/s (matrix product)")
display(scaling.decode[["batch", "n", "step_s", "per_seq_s", "achieved_GBps", "memory_floor_s",
                        "compute_floor_s"]].round(5))
display(scaling.prefill.round(4))
one = scaling.decode.iloc[0]  # batch 1
print(f"one sequence: a step took {one.step_s * 1e3:.2f} ms, its weight products alone {m['products_ms']:.2f} ms "
      f"({m['products_ms'] / (one.step_s * 1e3):.0%} of the step); the rest is attention, the cache and the "
      "fixed cost of each small operation")
plot_batch_scaling(scaling)

# %%
verdicts(scaling, "decode_step_stays_flat_for_small_batches", "per_sequence_decode_time_falls_with_batch",
         "batch_one_decode_reads_below_the_bandwidth", "batched_prompts_all_get_first_tokens_sooner",
         "first_prompt_waits_for_the_batch", "batched_step_regime")

# %% [markdown]
# **Reading the figure.** Top left: the measured step (blue; the band holds the middle half of its
# steps) against the two floors. Where the blue line runs nearly flat, extra sequences cost little:
# the step is bound by reading the weights and by the fixed cost of running each operation, both paid
# once per step. Past the point where the floors cross (dotted vertical line), the batch's arithmetic
# takes longer than reading the weights and the step grows with the batch: decode is no longer
# memory-bound. Where they cross is a fact of the machine, its arithmetic speed over its memory
# bandwidth: on one CPU thread in 32-bit floats it comes at a small batch, while a data-centre GPU's
# 16-bit tensor cores do hundreds of operations per byte its memory delivers, so there the ridge point
# lies at hundreds of tokens per step (why engines batch prefill tokens and decode tokens together
# to reach it). Top right, the same per token: each sequence's share of a step falls as the batch
# grows, steeply while the step is flat, slowly after. Bottom left: bytes read per second of step,
# beside what the memory delivered in the bandwidth tests. A small model's step sits well above both
# floors at small batches, because the fixed cost of each operation is a large part of it (the line
# under the tables times the step's weight products alone: how much of your step is left around them?); the
# bigger the model, the more each operation has to read and the closer a one-sequence step comes to
# the memory floor (`python -m kvlab bench decode --config llama-30m` measures a bigger one).
#
# Bottom right, prompts: a batched prefill gives every prompt its first token at once, when the
# whole batch's prefill ends: sooner than the last of them would get it one by one, later than the
# first would get it alone. What batching prompts buys is throughput, all of them through sooner;
# it does not bring each prompt's first token sooner. Whether the *mean* time to first token
# (`mean_ttft_s`) comes out lower batched or one by one is for your machine to decide, and it can
# be higher batched: one by one, the early prompts are answered early. A prompt long enough to keep
# the arithmetic busy on its own gains little from company. Try `batch_scaling(model,
# prefill_tokens=8)` and then `prefill_tokens=128`: when does batching prompts stop paying?
#
# Behind this section: `kvlab.lessons.l05_batching.batch_scaling` (`batch_scaling`, `decode_scaling`,
# `prefill_batching`, `crossover_batch`), the bandwidth test of `kvlab.measure.bandwidth`
# (`machine_bandwidth`, `weight_bytes_per_step`) and `kvlab.lessons.l05_batching.figures_batch_scaling`; the claims in
# `kvlab.lessons.l05_batching.claims`; tests in `tests/test_batch_scaling.py`.

# %% [markdown]
# ### Try it
#
# - In the panel, choose **equal** lengths: do the two Gantt charts still differ?
# - Set **batch slots** to 1: batching is off. How much lower is the throughput of both policies?
# - Set **batch slots** to 8 with 24 requests: which policy gains more from the extra slots?
# - Rerun the knob with `rate=4.0` (a slower trickle). What does the longest wait cost now?
# - In the exact knob, set `rate=4.0` too: what does each wait buy now, and what does it cost?
#
# ## Summary
#
# - Batching shares each step's cost among many sequences; the rule that forms batches decides who waits.
# - Static batching runs a batch until its longest member finishes: with mixed lengths, slots sit
#   idle and queued requests wait for the slowest member. Continuous batching refills a slot at the
#   next step.
# - With equal lengths the two rules coincide; the difference comes from the spread of lengths.
# - Admission is a few lines: oldest first, while the request fits the free blocks, the step's token
#   budget and the free slots. Letting short requests skip ahead of one that does not fit looks
#   faster on average and can keep that one waiting for ever (exercise 3).
# - Waiting for a fuller batch buys work per second of compute and costs time to first token.
#   Continuous batching makes no one wait for a batch, but it batches only the requests that are
#   there: under a trickle its batches stay small, and the arrivals, not the batches, set the pace;
#   when requests queue, its slots fill.
# - Behind this notebook: `kvlab.serving.Scheduler` (policies; `SchedulerConfig(admission=...)` takes
#   your rule), `kvlab.lessons.l05_batching.batching` (`compare_policies`, `batch_wait_runs`, `batching_table`,
#   `idle_slots`), `kvlab.lessons.l05_batching.admission`, `kvlab.lessons.common.gantt`, `kvlab.lessons.l05_batching.figures_batches`,
#   `kvlab.lessons.l05_batching.figures_policies`; the claims checked on your runs in `kvlab.lessons.l05_batching.claims`; tests in
#   `tests/test_experiments_serving.py`, `tests/test_claims_05.py`, `tests/test_admission.py` and
#   `tests/test_exercises_build.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
