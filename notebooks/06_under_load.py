# %% [markdown]
# <!-- kvlab:header -->
# A demo with one user says little about a service. Here a server gets more and more traffic, and
# you draw its **service curve**: how soon answers start, how much gets done, how many are turned
# away. Then two real scheduling rules meet one overload: the one that gets more done starts later.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - read a service curve and its **capacity at a TTFT target**;
# - say why long prompts reach it at a lower load than short chats;
# - explain "more throughput, later first token" with two real scheduling rules, and why it shows
#   only past capacity.

# %% [markdown]
# ## Why a simulator
#
# A curve needs many loads with hundreds of requests each: hours of real serving. The simulator runs
# the same engine but predicts each step's time from a cost model of llama-30m, fitted on the
# authors' 2-core machine while it was busy: every laptop prints the same numbers in seconds. A
# folded section below prints that load and checks a fresh llama-3m fit against your machine.

# %% [markdown]
# ## The service curve of each kind of traffic
#
# Four kinds of traffic, each at eight loads up to one and a half times its estimated capacity. The
# server runs 16 sequences per batch and lets at most 16 wait; a request that finds the queue full
# is refused.
#
# Short chats send prompts of 16 to 64 tokens and get 8 to 32 back. Long prompts (a document to
# summarise) send 256 to 512 tokens and get the same short answers. A curve's **capacity at the TTFT
# target** (marked *knee* in the figure and tables) is the highest load tested before the first that
# does not keep up: at least 0.9 of the offered requests per second served, and the p95 time to first
# token (TTFT) within the target (`ttft_s=2.0` here). It is known to one grid step.
#
# Predict before you run it: at what fraction of the short chats' capacity will the long prompts' be?

# %%
# %matplotlib inline
from kvlab.lessons.common.predict import predict

guess = predict("The long prompts' capacity at the TTFT target, as a fraction of the short chats' (in requests "
                "per second)?", unit="×")
guess

# %%
from kvlab.lessons import verdicts
from kvlab.lessons.l06_under_load.figures import plot_service_curve
from kvlab.experiments.service_curves import scheduler_config, service_curves

curves = service_curves(requests=200, levels=8, scheduler=scheduler_config(max_seqs=16, max_waiting=16))
display(guess.fold(plot_service_curve(curves), what="the figure (it marks each knee)"))
verdicts(curves, "simulator_much_faster_than_real_time", fold=True)

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.experiments.service_curves import knee_ratio

guess.against(curves, knee_ratio, what="on this grid (its steps in the line below) the ratio is")

# %%
# NBVAL_CHECK_OUTPUT
verdicts(curves, "long_traffic_bends_at_lower_rate", "latency_climbs_and_refusals_start_past_the_knee",
         after=guess)

# %% [markdown]
# **Reading the curves.** Top left: the slowest first tokens (thick lines, p95) climb as batches
# fill, before the knee; past it requests queue, and even the median (thin lines) climbs steeply.
# Bottom left: achieved throughput follows the offered load (the diagonal), then flattens.
# Bottom right: a full queue refuses new requests, bounding the wait of those served. A long
# prompt is many times a short chat's work. The knees:

# %%
display(curves[curves["is_knee"]][["profile", "offered_rps", "achieved_rps", "ttft_p50_s", "ttft_p95_s", "ttft_n",
                                   "tpot_p50_s", "tpot_n", "peak_kv_blocks", "goodput_rps"]].round(3))

# %% [markdown]
# ### Going deeper: the simulator, its calibration and a check against the real model
#
# A step's cost is a sum of simple terms:
#
# | term | why it costs |
# |---|---|
# | a fixed cost per step | every weight is read, and every operation started, once per step, whatever the batch |
# | per prompt token | each token is one more row in every matrix product |
# | per decoding sequence | one more row, one more token to sample |
# | per KV slot read by decodes | attention reads the stored keys and values |
# | per query-key pair of a prompt | attention over a prompt grows with its square |
# | per attention call | each sequence attended on its own pays a little setup |
#
# `python -m kvlab calibrate` times the real model on about 40 designed batch shapes and fits these
# coefficients by least squares. The curves above use the fit shipped with kvlab, made on the
# authors' machine (the cell prints which machine, its load and how well the fit predicts shapes it
# left out): an example of a machine, not a fact about yours.

# %%
from kvlab.serving.cost_model import load_calibration

shipped = load_calibration("llama-30m")
print(shipped.describe())
v = shipped.fit["validation"]
print(f"checked on {v['n_shapes']} shapes not used in the fit: median error {v['median_ape']:.0%}")
env = shipped.environment
print(f"measured on the authors' machine: {env['cpu']}, {env['cpu_count']} cores, "
      f"{shipped.settings['threads']} thread(s), torch {env['versions']['torch']}, "
      f"load average {shipped.settings.get('load_average_1m')}")

# %% [markdown]
# A cost model predicts the machine it was measured on. So the next cell calibrates one **here**, for
# llama-3m, the small model of the serving lessons (not the llama-30m fit behind the curves above;
# `budget_s=3` keeps the timing short), then serves the same 30 requests at three loads (0.3, 0.7 and
# 1.2 times its estimated capacity) twice: with the real model on the wall clock, and in the
# simulator. At 1.2 times, the 30 requests are a burst a fraction of a second long, not a sustained
# overload. Solid lines are measured, dashed ones simulated.

# %%
from kvlab.experiments.slowdown import slowdown_config
from kvlab.experiments.service_curves import simulated_vs_real
from kvlab.serving.calibrate import calibrate
from kvlab.serving.sweep import estimate_capacity_rps
from kvlab.workload import make_workload

small = slowdown_config()
my_cost = calibrate(small, budget_s=3)   # times the real model on this machine's batch shapes, fits the terms
print(my_cost.describe())
capacity = estimate_capacity_rps(my_cost, make_workload("short_short", 30, arrival="all_at_once"), max_seqs=16)
rates = [round(f * capacity, 1) for f in (0.3, 0.7, 1.2)]
check = simulated_vs_real(rates, profile="short_short", requests=30, config=small, cost_model=my_cost)
display(check[["source", "offered_rps", "achieved_rps", "ttft_p50_s", "ttft_p95_s", "ttft_n", "tpot_p50_s",
               "tpot_n", "e2e_p95_s", "e2e_n"]].round(4))
plot_service_curve(check, title=f"Real {small.name} (solid) vs the simulator calibrated a moment ago (dashed)")

# %%
verdicts(check, "simulator_throughput_close_to_real", "simulator_medians_within_factor_two",
         "real_and_simulated_rise_with_load", fold=True)

# %% [markdown]
# Throughput is compared at the highest load only: below capacity both runs replay the same
# arrivals and serve what arrives, whatever the cost model says; at the top, the engine's speed
# decides how soon the burst is done. What a simulator calibrated on the
# same machine usually gets right is the **shape**: the typical request waits longer as the load
# grows, in both (the last line checks the medians level by level, not the tails: with 30 requests
# a p95 rests on the slowest two). Where the two are off, look for what the simulator leaves out:
#
# - **the machine changed**: if another program took the CPU between the calibration and the real
#   run, real steps are slower than the fit;
# - **what is not timed**: the engine's bookkeeping between steps, and occasional slow steps (the fit
#   uses each shape's median time);
# - **the fit's own error**: a real batch can have a shape the calibration never timed;
# - **queues amplify small errors**: near capacity a slightly slower step changes which requests are
#   batched together, so the gaps grow at the highest load and in the p95.
#
# Trust the simulator for the shape of the curve and the order of the loads, not for the third
# digit, and recalibrate when the machine changes.

# %% [markdown]
# ### Going deeper: every request counted
#
# A latency quantile is computed over the requests that completed. The others must be counted next to
# it: requests sent, completed, refused (failed), still waiting and still running when the window
# closes. This cell uses a fixed, round-number cost model (no calibration, no timing), so its counts
# are the same on every machine.

# %%
# NBVAL_CHECK_OUTPUT
import kvlab
from kvlab.experiments.service_curves import end_of_window_counts, service_curve
from kvlab.serving.cost_model import CostModel

round_model = CostModel(coefficients=dict(step=0.02, prefill_tokens=1e-3, attention_calls=1e-4, decode_seqs=1e-3,
                                          decode_kv_slots=1e-5, prefill_attention=1e-6),
                        config=kvlab.llama_30m().to_dict(), settings={"block_size": 16})
exact = service_curve("mixture", rates=[1.0, 3.0, 6.0], requests=100, cost_model=round_model,
                      scheduler=scheduler_config(max_seqs=16, max_waiting=16))
for row in end_of_window_counts(exact).itertuples():
    total = row.completed + row.failed + row.waiting + row.running
    print(f"{row.offered_rps:3.0f} req/s: sent {row.sent:3d} = completed {row.completed:3d} + failed {row.failed:2d} "
          f"+ waiting {row.waiting:2d} + running {row.running:2d} ({total == row.sent})")
print("TTFT p95 of the completed requests:", exact["ttft_p95_s"].round(3).tolist())
print("n behind each p95:", exact["ttft_n"].tolist())
verdicts(exact, "quantile_counts_fewer_than_sent", fold=True)

# %% [markdown]
# A p95 without those counts flatters the service. Here the engine serves every admitted request to
# its end after sending stops, so those still waiting or running at the close are in the quantile's
# n; what it leaves out are the refused requests, the users the service treated worst. A measurement
# that stops at the window, like the A/B example below, leaves out the unfinished ones as well.

# %% [markdown]
# ## Explore: your own service curve
#
# Choose the traffic, the scheduling rule, the batch size, the queue limit, the loads (`auto`, or
# requests/s separated by commas) and the TTFT target. **Run** simulates the whole sweep.

# %%
from kvlab.lessons.l06_under_load.panel import service_curve_panel

panel = service_curve_panel()
panel

# %%
result = panel.run(profile="mixture", requests=200)   # the same as pressing Run
result.show()

# %% [markdown]
# ## More throughput, later first token
#
# Same requests, same load, two real scheduling rules of the engine. Both run up to 64 sequences at
# once (not 16 as above) and compute at most 64 tokens per step, prompts cut into chunks to fit:
#
# - **A, prefill first** with a 64-token chunk budget: whenever a prompt is waiting, the next step
#   is spent on prompt chunks, and the running answers pause.
# - **B, decode first**: every running answer gets its next token each step, and prompts share what
#   is left of the 64 tokens. This is stall-free batching
#   (<a href="https://arxiv.org/abs/2403.02310">Sarathi-Serve, §4</a>); vLLM V1 schedules this way: its
#   guide says chunked prefill is "always enabled by default" in V1, with decodes scheduled first
#   (<a href="https://docs.vllm.ai/en/latest/configuration/optimization/#chunked-prefill">optimization guide</a>).
#
# Long documents in, short answers out, for one minute, at two loads. **Overloaded**: the lowest
# load A alone no longer keeps up with. **Below capacity**: half of that. Read output tokens per
# second, TTFT, and time per output token (TPOT), an answer's pace once started.

# %%
from kvlab.lessons.l06_under_load.figures import plot_ab_example
from kvlab.experiments.service_curves import ab_at_two_loads

ab = ab_at_two_loads()   # virtual time on the authors' machine's calibration: the same numbers on every run
display(ab[["load", "policy", "rule", "offered_rps", "sent", "completed", "failed", "waiting", "running",
            "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_n", "ttft_p95_close_s", "ttft_censored",
            "ttft_p95_sent_s", "tpot_p50_s", "tpot_p95_s", "tpot_n", "keeps_up"]].round(3))
plot_ab_example(ab)

# %%
# NBVAL_CHECK_OUTPUT
verdicts(ab, "ab_below_capacity_both_keep_up", "ab_overloaded_more_throughput_later_first_token",
         "ab_overloaded_prefill_first_streams_slower")

# %% [markdown]
# <!-- kvlab:exercise check_ab_reading -->

# %% [markdown]
# Overloaded, the rules part. B keeps every answer moving, and each of
# its steps carries prompt work *and* decodes, so a step's fixed cost is shared: it finishes more
# answers in the minute, and they stream steadily. But B computes a new prompt only from what each
# step leaves after the running answers, so its first token comes later. A computes a waiting prompt
# at once, 64 tokens a step, so its first token comes sooner; each of its prompt-only steps pauses every answer in
# progress, so its answers crawl. Neither rule is "faster": they win on different clocks, and only
# once requests have to wait.

# %% [markdown]
# ### Going deeper: three readings of one p95
#
# The table's `ttft_p95_s` is over the requests that **completed** in the minute (`ttft_n`), and the
# two rules leave different requests unfinished (`waiting`, `running`). A p95 over those survivors
# leaves out the longest waits. So the verdict reads the p95 over **every request sent**, each
# followed to its first token, which the simulator can do because its records run past the window
# (`ttft_p95_sent_s`). A real server's measurement has only the window: there the fair reading counts
# each request still waiting at its wait so far, a lower bound its TTFT can only exceed
# (`ttft_p95_close_s`, with `ttft_censored` such requests). How far the completed-only p95 sits from
# the other two is the size of the bias. A third fair way compares both rules at the same number of
# completed requests.
#
# Does the trade-off hang on the authors' machine's costs? The same two loads on the round-number
# cost model, a machine with quite different costs:

# %%
# NBVAL_CHECK_OUTPUT
verdicts(ab_at_two_loads(round_model), "ab_below_capacity_both_keep_up",
         "ab_overloaded_more_throughput_later_first_token", fold=True)

# %% [markdown]
# ### Try it
#
# - In the panel, switch to *static batches*. Where does the knee move?
# - Set the **queue limit** to *unbounded*: the failures vanish; what does TTFT p95 do instead?
# - Tighten the **SLO** to `0.5`. Which knee moves first, and why?
# - `verdicts(ab_at_two_loads(low_fraction=0.8), "ab_below_capacity_both_keep_up")`: closer to
#   capacity, do both rules still keep up?

# %% [markdown]
# <!-- kvlab:exercise check_knee -->

# %% [markdown]
# ## Summary
#
# - A **service curve** gives, per offered load, the clocks with their sample sizes, achieved vs
#   offered throughput and the refusals. Its **capacity at a TTFT target** (the knee) is the highest
#   load tested before the first that falls behind, known to one grid step.
# - Slow first tokens climb before that load; past it, everyone waits.
# - Long prompts reach it at a fraction of the request rate of short chats.
# - Past capacity, a rule can finish more and stream faster while starting answers later
#   (decode first vs prefill first). Compare services on every clock, counting the requests
#   refused or unfinished, before naming a winner.

# %% [markdown]
# ### Going deeper: the code behind this notebook
#
# `kvlab.serving.cost_model` (`CostModel`, `CostModelExecutor`), `kvlab.serving.calibrate`,
# `kvlab.serving.sweep` (`load_sweep`, `mark_knee`), `kvlab.lessons.l06_under_load` (`load`,
# `figures`, `panel`, `claims`); commands `python -m kvlab calibrate --validate`,
# `python -m kvlab sweep --simulate --json my_curve.json`, `python -m kvlab bench batching`; tests in
# `tests/test_cost_model.py`, `tests/test_sweep.py`, `tests/test_ab_example.py`, `tests/test_claims_06.py`.

# %% [markdown]
# <!-- kvlab:navigation -->
