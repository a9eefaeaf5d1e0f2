# %% [markdown]
# <!-- kvlab:header -->
# One request at a time leaves most of a machine idle: a decode step for several sequences costs far
# less than that many steps for one. So servers **batch**: many requests share each step. How a
# server forms its batches decides who waits, and for how long. This notebook runs the same requests
# through two batching rules and draws what happened.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - explain static and continuous batching, and predict when they differ;
# - read a Gantt chart of requests and what each step's batch held;
# - write the rule that admits waiting requests into the batch;
# - say what waiting for a fuller batch buys, and who pays for it.

# %% [markdown]
# ## Two rules for forming a batch
#
# - **Static batching**: take up to `max_seqs` requests and run them together until **the longest
#   one** finishes; only then form the next batch. A request that finishes early leaves its slot
#   empty.
# - **Continuous batching**: rebuild the batch at **every step**. When a sequence finishes, its slot
#   goes to the next waiting request at the next step. This is the iteration-level scheduling of
#   [Orca (OSDI '22)](https://www.usenix.org/conference/osdi22/presentation/yu), used by
#   [vLLM](https://github.com/vllm-project/vllm/blob/main/README.md) and by transformers'
#   [`generate_batch`](https://huggingface.co/docs/transformers/main/continuous_batching).
#
# When the requests arrive together and each asks for the same number of tokens, the two rules do
# the same thing. Real traffic arrives over time, with mixed lengths.

# %%
# %matplotlib inline
from kvlab.experiments.serving_run import lesson_model

model = lesson_model()
print(f"{model.config.name}: {model.num_parameters() / 1e6:.1f}M parameters")

# %% [markdown]
# ## Same requests, two policies
#
# Sixteen requests arrive together, with mixed prompt lengths and answers as mixed as chat answers:
# most short, a few long (as in ShareGPT's conversations,
# [Kwon et al. 2023, Fig. 11](https://arxiv.org/abs/2309.06180)). There are four batch slots.
# Before running them, predict: a static batch lasts as long as its longest member.

# %%
from kvlab.lessons.common.predict import predict

steps_guess = predict("Mixed lengths: static batching needs how many times as many steps as continuous batching?",
                      unit="×")
steps_guess

# %% [markdown]
# Type your number, then run the panel: press **Run** (or run the next cell), then try *equal* lengths
# or another number of slots.

# %%
from kvlab.lessons.l05_batching.panel import batching_panel, static_over_continuous_steps

panel = batching_panel(model).folded_until(steps_guess)  # its table and charts answer the prediction
panel

# %%
result = panel.run()   # the same as pressing Run
display(steps_guess.fold(result, what="the two runs' table and Gantt charts"))

# %%
# NBVAL_CHECK_OUTPUT
steps_guess.against(result, static_over_continuous_steps, what="the panel's two runs took")

# %%
from kvlab.lessons import verdicts

verdicts(result, "a_batched_step_costs_less_than_separate_steps")

# %% [markdown]
# **Reading the Gantt charts** (one row per request, same time axis). With static batching the
# second group of four starts only when the **longest** member of the first group is done: the grey
# queue bars end together. With continuous batching they end one by one, as slots free up. What each
# step held:

# %%
from kvlab.lessons.l05_batching.figures import plot_batch_composition

plot_batch_composition(result.frame.attrs["trace"], by="run", max_seqs=4)

# %% [markdown]
# Bottom row: the static batch starts full, then thins out (the staircase) until its last member
# is done; continuous batching stays at four while anyone waits. Top row: tokens per step. The tall
# orange bars are prompts; with continuous batching they join in the middle of decoding.
#
# ## Equal vs mixed lengths
#
# Fewer steps for the same tokens should mean more tokens per second, but on a shared machine every
# timing jitters. So the cell below serves both length mixes under both policies three times, in
# paired rounds: each round runs the two policies back to back. With equal lengths both policies run
# the same schedule, so their gap in a round is the machine's noise in that round. With 16 requests a
# run's p95 is about its slowest request.

# %%
from kvlab.experiments.batching import batching_table, policy_rounds, rounds_summary
from kvlab.lessons.l05_batching.figures import plot_policy_tradeoff

rounds = batching_table(policy_rounds(model, rounds=3))
table = rounds_summary(rounds)
display(table[["run", "rounds", "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_n", "steps",
               "mean_batch"]].round(3))
plot_policy_tradeoff(table)

# %%
verdicts(rounds, "equal_lengths_same_schedule", "mixed_lengths_continuous_serves_more_per_second",
         "mixed_lengths_continuous_first_tokens_sooner")

# %% [markdown]
# With mixed lengths, continuous batching needs fewer steps for the same tokens, so it finishes
# sooner, and a freed slot is reused at once, so first tokens come sooner. The checks ask for that in
# every round, by more than the noise the equal pairs showed. The step counts are the same on every
# machine.

# %% [markdown]
# ### Going deeper: the same runs, exactly
#
# The cell below runs the same requests through the engine's real scheduler with a **fixed
# step-cost executor** (every step costs `step_s=0.010` s, no model runs, virtual clock). The static
# step counts can be checked by hand: each batch lasts as long as its longest output.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.experiments.batching import compare_policies
from kvlab.experiments.serving_run import FixedStepCostExecutor

exact = compare_policies(model, executor=FixedStepCostExecutor(step_s=0.010), clock="virtual")
for row, run in zip(batching_table(exact).itertuples(), exact):
    line = (f"{row.run:26s} steps {row.steps:3d}, sequences/step {row.mean_batch:4.2f}, "
            f"TTFT p50 {row.ttft_p50_s * 1e3:4.0f} ms (n = {row.ttft_n}), "
            f"output {row.output_tokens_per_s:5.1f} tokens/s")
    if run.extra["policy"] == "static":
        outputs = [r.max_new_tokens for r in run.records]
        by_hand = sum(max(outputs[i:i + 4]) for i in range(0, len(outputs), 4))
        line += f"  | by hand: sum of longest outputs = {by_hand}"
    print(line)
verdicts(exact, "static_steps_are_the_sum_of_longest_outputs", "exact_equal_lengths_policies_coincide",
         "exact_mixed_lengths_continuous_fewer_steps", "continuous_keeps_every_slot_busy_while_requests_wait", fold=True)

# %% [markdown]
# <!-- kvlab:exercise check_idle_slots -->

# %% [markdown]
# <!-- kvlab:exercise check_admission_step -->

# %% [markdown]
# <!-- kvlab:exercise check_admission_rule -->

# %% [markdown]
# Your rule next to the engine's own on the checker's requests (exact step costs, virtual clock).
# A rule that broke a limit has no row: the checker above says where. With so few requests (`n`), a
# p95 is close to the slowest one.

# %%
from kvlab.experiments.admission import admission_run, clocks_table

builtin_run, _ = admission_run()                  # the engine's own rule
my_run, my_audit = admission_run(my_admission)    # yours, checked at every call
clocks_table([builtin_run] + ([my_run] if my_run is not None else []))

# %% [markdown]
# ## The "wait for a fuller batch" knob
#
# A static server can wait a little before starting a batch, hoping more requests arrive to fill it
# (`batch_wait_s`). Here twelve requests trickle in, twelve per second, and a batch may hold six
# (so a p95 is about the slowest of them).

# %%
from kvlab.experiments.batching import batch_wait_runs
from kvlab.experiments.serving_run import runs_frame
from kvlab.lessons.l05_batching.figures import plot_batch_wait

waits = batch_wait_runs(model, waits=(0.0, 0.15, 0.3, 0.6), rate=12.0, n=12, max_seqs=6)
wait_table = batching_table(waits)
display(wait_table[["run", "batch_wait_s", "mean_batch", "tokens_per_busy_s", "ttft_p50_s", "ttft_p95_s",
                    "ttft_n"]].round(3))
plot_batch_wait(wait_table)

# %%
verdicts(waits, "waiting_fills_batches_but_delays_first_tokens", "continuous_answers_first_under_a_trickle",
         "continuous_batches_only_what_has_arrived", fold=True)

# %% [markdown]
# **Reading the figure.** Right: waiting fills the batches, and fuller batches get more output from
# each second the model is busy. Left: the price, in time to first token: each batch's first member
# waits for the others. Continuous batching (dotted lines) makes no one wait for a batch, but it can
# only batch the requests that have arrived: under a trickle its batches stay small; when requests
# pile up, its slots fill.

# %% [markdown]
# ### Going deeper: the knob at fixed prices
#
# The same knob on the virtual clock: a step costs `step_s` plus `token_s` per token it computes, so
# a fuller batch costs a little more per step but far less per token. It comes out the same on every
# machine.

# %%
# NBVAL_CHECK_OUTPUT
exact_waits = batch_wait_runs(model, waits=(0.0, 0.15, 0.3, 0.6), rate=12.0, n=12, max_seqs=6, clock="virtual",
                              executor=FixedStepCostExecutor(step_s=0.004, token_s=0.0001))
verdicts(exact_waits, "exact_waiting_trades_first_tokens_for_fuller_batches",
         "exact_continuous_batches_stay_small_under_a_trickle", "exact_arrivals_set_the_pace", fold=True)

# %% [markdown]
# The last line is why the knob is a bet on load: while requests trickle in, the arrivals set the
# pace, so waiting delays first tokens and buys no throughput. Once the machine is saturated
# (notebook 06), work per busy second becomes throughput. The trade on the real model as Gantt charts:

# %%
from kvlab.lessons.common.gantt import plot_gantts

frame = runs_frame([waits[0], waits[-2], waits[-1]])
plot_gantts(frame, frame.attrs["steps"])

# %% [markdown]
# ## Why batching works
#
# A decode step pays some costs once, whatever its batch: starting every small operation, and
# reading every weight. Extra sequences share them. A large model reads its weights from main memory
# at every step; this one's fit in the cache of a CPU whose L2/L3 holds tens of MiB (many server
# CPUs; not every laptop), and there the shared cost is mostly starting each operation. The section
# below times one step at batch sizes from 1 to 64 and says which shared cost dominates on your
# machine.

# %% [markdown]
# ### Going deeper: why batching works, measured
#
# - **Reading the weights.** A decode step multiplies every weight matrix by one new row per
#   sequence. With one sequence each weight read from memory serves two operations (a multiply and an
#   add); with B sequences the same read serves B times the arithmetic.
# - **Per-operation overhead.** Every small operation of a step (a norm, a rotary embedding, a
#   reshape, the Python between them; on a GPU, each kernel launch) takes about as long for a few rows
#   as for one.
#
# Which one a batch mostly shares depends on the model and the machine. This model has a few million
# weights; on a CPU most of its one-sequence step is per-operation overhead, and the line under the
# tables times the weight products alone. A 7-billion-parameter model in 16 bits streams two bytes per
# weight, every weight, every step: milliseconds even on a GPU, while engines such as vLLM remove most launch
# overhead by replaying
# [CUDA graphs](https://docs.vllm.ai/en/latest/design/cuda_graphs/) (on a GPU): there the weight read is what
# batching shares, the textbook "memory-bound decode".
#
# The cell also measures two limits of your machine, each giving a floor no step can beat:
#
# - **memory floor** = bytes a step reads / main memory's bandwidth (a matrix-vector product over a
#   matrix too big for any cache). It is nearly flat: the weights are read once per step, whatever
#   the batch; only the K/V bytes grow with it. It is the floor of a model too big for the cache;
#   where this model's weights stay in a CPU's cache, which reads faster, its steps could in
#   principle go below it;
# - **compute floor** = (a multiply and an add) × weights × batch / arithmetic speed (a large matrix
#   product's). It rises with the batch.
#
# Then the same for prompts: several prefilled one after the other, or all in one batch.

# %%
from kvlab.experiments.batch_scaling import batch_scaling
from kvlab.lessons.l05_batching.figures import plot_batch_scaling

scaling = batch_scaling(model, batch_sizes=(1, 2, 4, 8, 16, 32, 64), repeats=5)
m = scaling.machine
print(f"this machine, {m['threads']} thread(s) (the serving lessons run one: on a shared machine a step split "
      f"over several cores waits for the slowest): main memory {m['bandwidth_GBps']:.1f} GB/s (matrix-vector), "
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
         "first_prompt_waits_for_the_batch", "batched_step_regime", fold=True)

# %% [markdown]
# **Reading the figure.** Top left: the measured step (blue; the band holds the middle half of its
# steps) against the two floors. Where the blue line runs nearly flat, extra sequences cost little:
# what the step pays once, mostly the fixed cost of each operation here (the last line above), dwarfs
# what each sequence adds. It does not stay flat until the floors cross (dotted vertical line). The
# floors are lower bounds at the machine's best speed, and a small batch's step does not hide its
# arithmetic behind its reads: each sequence's work (its rows through every matrix, its attention over
# its own cache) adds to the step as soon as it is a visible share of it. On a CPU that can happen
# while the compute floor is still under the memory floor: the last line above says where your step
# first grew, and where the floors stood then. The floors crossing says where a perfectly efficient step would stop being bound by memory;
# on a data-centre GPU, whose 16-bit tensor cores do hundreds of operations per byte of memory read
# ([H100 specifications](https://www.nvidia.com/en-us/data-center/h100/)), that lies at hundreds of
# tokens per step, which is why engines batch prompt and decode tokens together
# ([chunked prefill in vLLM](https://docs.vllm.ai/en/latest/configuration/optimization/#chunked-prefill)).
#
# Top right: each sequence's share of a step falls as the batch grows. Bottom left: bytes read per
# second of step, beside the bandwidth test: a small model's one-sequence step sits well above the
# memory floor because of its fixed costs; the bigger the model, the closer it comes
# (`python -m kvlab bench decode --config llama-30m` measures a bigger one).
#
# Bottom right, prompts: a batched prefill gives every prompt its first token when the whole batch's
# prefill ends: sooner than the last would get it one by one, later than the first would get it
# alone. Batching prompts buys throughput, not each prompt's first token; the mean time to first token
# (`mean_ttft_s`) can come out higher batched. Try `batch_scaling(model, prefill_tokens=8)` and
# `prefill_tokens=128`: when does batching prompts stop paying?

# %% [markdown]
# ## Try it
#
# - In the panel, choose **equal** lengths: do the two Gantt charts still differ?
# - Set **batch slots** to 1: batching is off. How much lower is the throughput of both policies?
# - Rerun the knob with `rate=4.0`, a slower trickle. What does the longest wait cost now?

# %% [markdown]
# ### Going deeper: more to try, and what is behind this notebook
#
# - Set **batch slots** to 8 with 24 requests: which policy gains more from the extra slots?
# - In the exact knob, set `rate=4.0` too: what does each wait buy now, and what does it cost?
# - `policy_rounds(model, rounds=5)`: more paired rounds; does the spread of the ratios shrink?
# - `policy_rounds(model, seed=0)`: another shuffle of the same requests, whose longest answer arrives
#   last. It then runs alone at the end under either rule: how much of continuous batching's gain is left?
#   (This notebook's shuffle, `LESSON_SHUFFLE`, brings the longest answer early.)
#
# Behind this notebook: `kvlab.serving.Scheduler` (policies; `SchedulerConfig(admission=...)` takes
# your rule), `kvlab.experiments.batching` (`compare_policies`, `policy_rounds`,
# `batch_wait_runs`), `kvlab.experiments.admission`, `kvlab.experiments.batch_scaling`
# and `kvlab.experiments.bandwidth`; the claims checked on your runs in `kvlab.lessons.l05_batching.claims`.

# %% [markdown]
# ## Summary
#
# - Batching shares each step's fixed cost among many sequences; the rule that forms batches decides
#   who waits.
# - Static batching runs a batch until its longest member finishes: with mixed lengths, slots sit
#   idle and queued requests wait. Continuous batching refills a slot at the next step.
# - Admission is a few lines: oldest first, while the request fits the free blocks, the token budget
#   and the free slots.
# - Waiting for a fuller batch buys work per busy second and costs time to first token; under a
#   trickle the arrivals, not the batches, set the pace.

# %% [markdown]
# <!-- kvlab:navigation -->
