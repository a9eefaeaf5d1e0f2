# %% [markdown]
# <!-- kvlab:header -->
# A service can answer quickly on average and still leave one person staring at an empty screen.
# Whether it is "fast" depends on which clock you look at: when the answer starts, how steadily
# it flows, when it is complete, and how much the whole service produces. This notebook follows
# one request through a busy serving engine and reads all four clocks off its timeline.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - name the four clocks and say what each one does **not** tell you;
# - read a request's journey: arrival, queue, admission, prefill, first token, every later token, finish;
# - compute TTFT, TPOT and E2E from a request's timestamps (and predict them from the steps it
#   waited for), and say why TPOT divides by *n − 1*;
# - tell a cold start from a warm one, and measure both instead of guessing;
# - explain why a mean latency can look fine while some requests wait far longer, and report quantiles with their sample size.

# %% [markdown]
# ## Four clocks
#
# Every clock here starts when the request was **scheduled to arrive**, the moment its user pressed
# enter. Starting later (say, when the server first looked at it) would quietly drop the time it
# spent waiting in line.
#
# | clock | the question it answers | what it leaves out |
# |---|---|---|
# | **TTFT**, time to first token | when does the answer start to appear? | how long the rest takes |
# | **time between tokens**: TPOT per request = (E2E − TTFT) / (n − 1); the gaps themselves (ITL) | does the text flow steadily? | the wait before it started |
# | **E2E**, end to end | when is the whole answer there? | how much of that is just a long answer |
# | **throughput**, output tokens per second of the whole service | how much work gets done? | what any one person waited |
#
# The first three belong to one request; throughput belongs to the service. Most arguments about
# "speed" are two people quoting different rows of this table.

# %% [markdown]
# ## The engine and the model
#
# The lesson model of notebook 01 (about 3 million parameters, random weights: the timing is that of
# a real model of this shape). The engine in `kvlab.serving` batches many requests over one paged
# KV cache, the way vLLM does; notebooks 05 and 07 open it up. Here it is a black box that stamps
# the time of every event of every request.

# %%
# %matplotlib inline
from kvlab.experiments.serving_run import lesson_model

model = lesson_model()
print(f"{model.config.name}: {model.num_parameters() / 1e6:.1f}M parameters, context of "
      f"{model.config.max_position_embeddings} tokens")

# %% [markdown]
# ## One request's journey
#
# A few long requests arrive first; the engine has only two batch slots (`max_seqs`), so our
# request (the *watched* one) arrives just after them and has to wait. Press **Run**, then move the
# sliders: more requests ahead, more slots, a longer prompt.

# %%
from kvlab.widgets.four_clocks import journey_panel

panel = journey_panel(model)
panel

# %%
result = panel.run()   # the same as pressing Run
result.show()

# %% [markdown]
# **Reading the figure.** The grey bar is the queue: the request has arrived (▼) but no slot
# is free. When a slot frees it is admitted (●) and its prompt is computed in one step (orange),
# which produces the first token (★): TTFT is the whole span from ▼ to ★. How much of it was
# queue, not computation, on your run:

# %%
from kvlab.claims import verdicts

verdicts(result, "watched_ttft_is_mostly_queue")

# %% [markdown]
# Then one token per step (blue, each tick a token) until the last (■). The lower panel shows
# each gap between tokens: their mean is TPOT. A gap is one engine step, so it grows when that
# step also carries other requests' work (another prompt's prefill, most of all) or when the
# machine is busy with something else. With the default sliders the requests ahead are done by the
# time the watched one decodes, so it has its steps to itself; give the engine 3 slots to see it
# share them.
#
# Who was it waiting behind? The same run as a Gantt chart, one row per request:

# %%
from kvlab.plots.gantt import plot_gantt

plot_gantt(result.frame, result.frame.attrs["steps"], title="The journey run: every request")

# %% [markdown]
# ## The same journey, worked out by hand
#
# Real timings change from run to run. To check the arithmetic, the cell below serves the same
# requests with a **fixed step-cost executor**: the engine's real scheduler and block manager
# decide every step, but each step is priced at exactly `STEP_S` seconds instead of running the
# model, on a virtual clock. Now every timestamp can be predicted by hand: a request that decodes
# in every step gets one token per step, so its TPOT must be exactly one step, and its TTFT is the
# number of steps that ran before its first token came out, times `STEP_S`, minus its arrival time.

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.clocks import summarize
from kvlab.experiments.four_clocks import journey_clocks, run_journey
from kvlab.experiments.serving_run import FixedStepCostExecutor

STEP_S = 0.010
exact = run_journey(model, executor=FixedStepCostExecutor(step_s=STEP_S), clock="virtual")
r = exact.record(exact.extra["watched"])
mine = exact.steps[exact.steps["request_id"] == r.request_id]
first_step = int(mine["step"].min())
first_token_step = int(mine.loc[mine["phase"] == "prefill", "step"].max())
n = r.output_tokens
print(f"watched request: arrives {r.scheduled_s:.3f} s, admitted in step {first_step}, first token from step "
      f"{first_token_step}, {n} tokens")
c = r.clocks()
hand_ttft = (first_token_step + 1) * STEP_S - r.scheduled_s
hand_e2e = hand_ttft + (n - 1) * STEP_S
print(f"TTFT  by hand: ({first_token_step} + 1) steps x 10 ms - {r.scheduled_s * 1e3:.0f} ms = "
      f"{hand_ttft * 1e3:.0f} ms   engine: {c['ttft_s'] * 1e3:.0f} ms")
print(f"TPOT  by hand: one step = {STEP_S * 1e3:.0f} ms   engine: {c['tpot_s'] * 1e3:.0f} ms")
print(f"E2E   by hand: TTFT + {n - 1} steps x 10 ms = {hand_e2e * 1e3:.0f} ms   engine: {c['e2e_s'] * 1e3:.0f} ms")
cut = summarize(exact.records, until_s=0.5)
print(f"at t = 0.5 s: sent {cut.sent} = completed {cut.completed} + failed {cut.failed} + "
      f"waiting {cut.waiting} + running {cut.running}")
verdicts(exact, "watched_clocks_follow_from_its_steps")

# %% [markdown]
# The last line is the other half of honest reporting: at any cut-off, every request sent is
# either completed, failed, still waiting or still running. A latency figure computed over the
# completed ones only says nothing about the others, so the counts go next to it.

# %% [markdown]
# <!-- kvlab:exercise check_step_cost_clocks -->

# %% [markdown]
# ## Cold start vs warm start
#
# The very first request a service gets after starting can wait for things that have nothing to do
# with it: the interpreter starting, libraries importing, weights loading, the KV pool being
# allocated, the first forward pass setting things up. This notebook's own process paid those costs
# long ago, so measuring them here would be dishonest. The cell below starts a **fresh Python
# process**, times each start-up phase, then serves the same single request five times in a row.

# %%
from kvlab.experiments.four_clocks import cold_vs_warm, cold_warm_summary, startup_phases
from kvlab.plots.startup import plot_cold_warm

cold = cold_vs_warm(repeats=5)
display(startup_phases(cold).round(3))
display(cold_warm_summary(cold).round(3))
plot_cold_warm(cold)

# %%
verdicts(cold, "startup_dwarfs_a_warm_request", "first_request_extra_is_small")

# %% [markdown]
# **What the measurement says.** The big cost of a cold start is everything *before* the request:
# the first verdict compares it, phase by phase, with a warm request's TTFT on your machine. The
# first serving (run 0) may pay some extra of its own; the second verdict puts that extra next to
# the spread of the warm servings and next to the start-up. With only a few warm servings, a
# difference of the size of their spread is noise. With real weights loaded from disk, and on a GPU (where the first
# calls also create the device context and load kernels), the start-up phases grow further. So a
# benchmark must say whether it measured a cold or a warm service, and a service that scales down
# to zero should expect some users to meet the cold one.
#
# ## Why a mean hides the wait
#
# Now thirty requests of mixed lengths (chat turns, long documents, long generations) arrive at
# random, six per second on average but in bursts, as real traffic does, with four batch slots.
# A request that arrives while a slot is free is admitted at the next step; one that arrives in a
# burst, or behind a long prompt, waits.

# %%
from kvlab.experiments.four_clocks import mean_vs_tail, run_mixed_load
from kvlab.plots.distribution import plot_clock_distribution

mixed = run_mixed_load(model)
display(mean_vs_tail(mixed.requests).round(3))
plot_clock_distribution(mixed.requests, "ttft_s")

# %%
verdicts(mixed, "fewer_than_half_wait_longer_than_the_mean", "ttft_tail_is_well_above_the_mean")

# %% [markdown]
# **Reading the figure.** When the bars pile up on the left with a thin tail to the right, a few
# long waits pull the mean above the median, and yet the mean stays far below what the slowest
# requests experienced: the verdicts above say how far on your run. A dashboard showing only the
# mean would call such a service fine. Always quote a few quantiles (p50, p95, p99), and always
# with **n**: with n = 30, the p99 lies between the two slowest requests, so it is a hint, not a
# law; run the cell again and watch it move. (If every request waited long here, your machine is
# slower than the lesson assumes and the service is overloaded: try `run_mixed_load(model, rate=3)`.)

# %% [markdown]
# <!-- kvlab:exercise check_share_above_mean -->

# %% [markdown]
# ### Try it
#
# - In the panel, set **batch slots** to 8: the queue disappears. What happens to TTFT, and to TPOT?
# - Set **long requests ahead** to 0 and the prompt to 512 tokens: now TTFT is mostly prefill, not queue.
# - Run `run_mixed_load(model, rate=12)`: twice the arrival rate. Which grows faster, the p50 or the p95?
# - Run `run_mixed_load(model, burstiness=4.0)`: the same rate, evenly spaced. What happens to the tail?
# - In the exact run, change `STEP_S` to 0.020 and predict every clock before running the cell.
#
# ## Summary
#
# - TTFT, time between tokens, E2E and throughput answer different questions; a single number
#   answers one of them at most. Each request clock starts at the scheduled arrival.
# - A request's TTFT can be mostly queueing: the model was fast, the line was long.
# - TPOT = (E2E − TTFT) / (n − 1): the mean gap after the first token. The largest gap is what a reader notices.
# - A cold start pays start-up costs before the first request, many times a warm request's TTFT.
#   Say which one a number measured.
# - Latency distributions have tails: report p50, p95, p99 with n, and the counts of completed,
#   failed, waiting and running requests.
# - Behind this notebook: `kvlab.experiments.four_clocks` (`run_journey`, `journey_clocks`,
#   `cold_vs_warm`, `run_mixed_load`, `mean_vs_tail`), `kvlab.clocks`, `kvlab.plots.journey`,
#   `kvlab.plots.gantt`; the claims checked on your runs in `kvlab.claims.c04_four_clocks`; tests in
#   `tests/test_experiments_serving.py`, `tests/test_plots_serving.py` and `tests/test_claims_04.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
