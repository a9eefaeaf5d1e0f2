# %% [markdown]
# <!-- kvlab:header -->
# A demo with one user says little about a service. What matters is how it behaves as more people
# use it at once: up to what load do answers start quickly and flow steadily, how many requests are
# refused, and how much memory it takes. This notebook draws that picture, the **service curve**,
# for several kinds of traffic, and then shows two real scheduling rules that do the same below
# capacity, but once overloaded, the one that gets more work done computes new prompts from what its
# steps leave over, which can delay first tokens; comparing first-token times then needs every
# request counted, not only the finished ones.

# %%
# kvlab:setup

# %% [markdown]
# ## What you will be able to do
#
# - read a service curve: the four clocks, achieved vs offered throughput and failures as the load rises;
# - find the **knee** of a curve, and say which rule defines it;
# - explain how a simulator calibrated on your machine can sweep thousands of requests far faster
#   than real time, and check it against the real model: what it gets right, and where it is off;
# - reproduce "more throughput, later first token" with two real scheduling policies, see that it
#   appears only past capacity, read time per output token beside time to first token, count
#   what was sent, completed, failed and still waiting when the measurement window closed, and say
#   why a quantile over the completed requests alone cannot settle which rule starts answers sooner.

# %% [markdown]
# ## Why a simulator
#
# A service curve needs many load levels with hundreds of requests each. The real model serves in
# real time: 500 requests offered at 2 per second take over four minutes just to arrive, and a curve
# has ten such levels for each kind of traffic. So kvlab also has a
# **cost-model executor**: the same engine, the same scheduler and block manager, but each step's
# duration is *predicted* from its shape instead of measured, and the engine's clock jumps by that
# prediction (virtual time). A step's cost is a sum of simple terms:
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
# coefficients by least squares. kvlab ships a calibration of the 30M model made on the authors'
# machine (the cell prints which machine, its load and how well the fit predicts shapes it left out):
# read it as an example of a machine, not a fact about yours. `python -m kvlab calibrate` makes
# one for your machine.

# %%
# %matplotlib inline
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
# ### Is the simulator honest? Check it against the real model
#
# A cost model predicts the machine it was measured on. So first calibrate one **here**, for the
# small model of the serving lessons (3M parameters; `budget_s=3` keeps the timing short), then
# serve the same requests at three loads (0.3, 0.7 and 1.2 times its estimated capacity) twice:
# once with the real model on the wall clock, once in the simulator.

# %%
from kvlab.lessons.l06_under_load.load import simulated_vs_real
from kvlab.lessons.l01_the_slowdown.slowdown import slowdown_config
from kvlab.lessons.l06_under_load.figures import plot_service_curve
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

# %% [markdown]
# Solid lines are measured, dashed ones simulated. How close are they on your run? The lines below
# give the ratio real ÷ simulated for each clock at each load, with the number of requests behind
# each quantile.

# %%
from kvlab.lessons import verdicts

verdicts(check, "simulator_throughput_close_to_real", "simulator_medians_within_factor_two",
         "real_and_simulated_rise_with_load")

# %% [markdown]
# What a simulator calibrated on the same machine usually gets right is the **shape**: throughput
# follows the offered load the same way, and the typical request waits longer as the load grows,
# in both. The last verdict above checks that on your run for the **medians** (TTFT, TPOT, E2E),
# level by level, not only from the first load to the last; it does not claim it for the tails.
# With a few dozen requests per level a p95 rests on the slowest two or three, so a p95 curve can
# wobble between neighbouring loads (the table shows it). Where the two are off, look for what the
# simulator leaves out:
#
# - **the machine changed**: the calibration and the real run are moments apart; if another
#   program (another notebook, a browser tab) took the CPU in between, the real steps are slower
#   than the ones the cost model was fit on;
# - **what is not timed**: the calibration times the model's steps; the scheduling and bookkeeping
#   the engine does between steps are not in the cost model, and it uses each shape's median time,
#   so occasional slow steps are missing from its tails;
# - **the fit's own error**: `describe()` prints its median error over the shapes it was fit on;
#   a real batch can have a shape it never timed;
# - **queues amplify small errors**: near capacity a slightly slower step changes which requests
#   are batched together, so the gaps grow at the highest load and in the p95 (which, over a few
#   dozen requests, rests on the slowest two or three).
#
# Trust the simulator for the shape of the curve and the order of the loads, not for the third
# digit; and recalibrate when the machine changes.
#
# ## The service curve of each kind of traffic
#
# Four workloads, each swept over eight loads from a tenth of the estimated capacity to one and a
# half times it, simulated on the calibration of the 30M model shipped with kvlab, so the times are
# those of the authors' machine (16 sequences per batch, at most 16 requests waiting: a request
# arriving to a full queue is refused).
#
# Predict before you run it. Short chats send prompts of 16 to 64 tokens and get 8 to 32 back; long
# prompts (a document to summarise) send 256 to 512 tokens and get the same short answers. Each
# curve's **knee** is the highest load, in requests per second, that the service still keeps up with.
# At what fraction of the short chats' knee will the long prompts' knee be (1 = the same load)?

# %%
from kvlab.lessons.common.predict import predict

guess = predict("The long prompts' knee, as a fraction of the short chats' knee (in requests per second)?",
                unit="×")
guess

# %%
from kvlab.lessons.l06_under_load.load import scheduler_config, service_curves

curves = service_curves(requests=200, levels=8, scheduler=scheduler_config(max_seqs=16, max_waiting=16))
display(plot_service_curve(curves))
verdicts(curves, "simulator_much_faster_than_real_time")

# %% [markdown]
# **Reading the curves.** Top left: time to first token. While the service keeps up it stays
# low; past the knee requests queue and it climbs. Top right: time per output token, which rises
# as batches fill and prompts share steps with decodes. Bottom left: achieved throughput follows
# the offered load (the dashed diagonal) up to a point, then flattens: that is capacity. Bottom
# right: once the queue is full, new requests are refused. The queue cannot grow, which bounds the
# wait of the requests that *are* served, while the refused ones get no answer at all.
#
# The **knee** (dotted line) is the highest load that still *keeps up*: achieved throughput is at
# least `0.9` of the offered load and p95 TTFT is within the SLO (`ttft_s=2.0` here). Past it,
# waiting, not work, decides what users see. These curves run in virtual time, so the lines below
# are the same on every machine:

# %%
# NBVAL_CHECK_OUTPUT
verdicts(curves, "long_traffic_bends_at_lower_rate", "latency_climbs_and_refusals_start_past_the_knee",
         after=guess)

# %% [markdown]
# A table of the knees, with the sample size behind each quantile:

# %%
knees = curves[curves["is_knee"]]
display(guess.fold(knees[["profile", "offered_rps", "achieved_rps", "ttft_p50_s", "ttft_p95_s", "ttft_n",
                          "tpot_p50_s", "tpot_n", "peak_kv_blocks", "peak_kv_bytes", "goodput_rps"]].round(3),
                   what="the table of knees"))

# %% [markdown]
# Your prediction beside the sweep (long prompts' knee ÷ short chats' knee, both from the table):

# %%
# NBVAL_CHECK_OUTPUT
from kvlab.lessons.l06_under_load.load import knee_rps

guess.against(knee_rps(curves, "long_short") / knee_rps(curves, "short_short"))

# %% [markdown]
# ### Every request counted
#
# A latency quantile is computed over the requests that completed. The others must be counted
# next to it: requests sent, completed, refused (failed), still waiting and still running when the
# window closes. The cell below uses a fixed, round-number cost model (no calibration, no timing),
# so its output is the same on every machine: its counts are checked.

# %%
# NBVAL_CHECK_OUTPUT
import kvlab
from kvlab.lessons.l06_under_load.load import end_of_window_counts, service_curve
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
verdicts(exact, "quantile_counts_fewer_than_sent")

# %% [markdown]
# A p95 without those counts would flatter the service. In this sweep the engine serves every
# admitted request to its end after sending stops, so the ones still waiting or running when the
# window closed are in the quantile's n; what it leaves out are the refused requests, turned away
# because the queue was full: the users the service treated worst. A measurement that stops at
# the window, like the A/B example below, leaves out the unfinished ones as well.
#
# ## Explore: your own service curve
#
# Choose the traffic, the scheduling rule, the batch size, the queue limit, the loads (`auto`, or
# numbers of requests/s separated by commas) and the TTFT target. **Run** simulates the whole sweep.

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
# Same requests, same load, two real scheduling rules of the engine (only `priority` differs):
#
# - **A, prefill first** (the rule of vLLM's original V0 scheduler without chunked prefill):
#   whenever a prompt is waiting, the next step is spent on prompts; the running answers pause.
# - **B, decode first** with a budget of 64 tokens per step (stall-free batching, as in
#   Sarathi-Serve): every running answer gets its next token each step; prompts use what is left of
#   the budget. vLLM's V1 scheduler works this way by default (running requests first, chunked
#   prefill always on).
#
# The traffic is long documents in, short answers out (32 tokens each), for one minute, counted
# when the minute ends, at two loads. **Overloaded**: the lowest load at which A alone no longer
# keeps up (a sweep of A finds it; the choice looks at A's throughput only, not at any first-token
# time, nor at B). **Below capacity**: half of that. Each rule is read on three clocks: output
# tokens per second, time to first token (TTFT) and time per output token (TPOT), the pace at
# which an answer streams once it has started.

# %%
from kvlab.lessons.l06_under_load.load import ab_at_two_loads
from kvlab.lessons.l06_under_load.figures import plot_ab_example

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
# Below capacity both rules keep up (the first line above): the same requests are served, within
# the TTFT target. Overloaded they part (the next two lines). B keeps every answer moving, and each of its steps carries prompt
# work *and* decodes, so the fixed cost of a step is shared: it completes more answers in the
# minute, and they stream steadily. Once a document is admitted, A computes its prompt in
# consecutive prompt-only steps, so its first token follows soon; B computes it from what each step
# leaves after the running answers, so its first token comes later. But each of A's prompt-only
# steps pauses every answer in progress and pays the step's fixed cost alone, so its answers crawl
# once started and fewer finish in the minute.
#
# Read the first-token line with care. The table's TTFT columns, like every clock of a summary, are
# over the requests that **completed** in the minute (`ttft_n`), and the two rules leave different
# requests unfinished (the `waiting` and `running` columns): comparing completed-only p95s compares
# survivors, the bias *Every request counted* warns about: the requests still waiting at the close,
# among the longest waits, are left out. So the line decides on **every request sent**: the
# simulator's records run on past the window, so each request is followed to its first token
# (`ttft_p95_sent_s`). A measurement of a real server has only the window; there the fair reading
# counts each request still waiting at its wait so far, a censored value its TTFT can only exceed
# (`ttft_p95_close_s`, a lower bound; `kvlab.clocks.ttft_censored`). The line gives all three
# readings side by side: how far the completed-only p95 sits from the other two is the size of the
# bias. A third fair way compares both rules at the same number of completed
# requests. Neither rule is "faster": they win on different clocks, and
# only once requests have to wait; both are behind at the end of the overloaded minute.
#
# Does the trade-off hang on the authors' machine's costs? The same two loads on the round-number
# cost model, a machine with quite different costs:

# %%
# NBVAL_CHECK_OUTPUT
verdicts(ab_at_two_loads(round_model), "ab_below_capacity_both_keep_up",
         "ab_overloaded_more_throughput_later_first_token")

# %% [markdown]
# ### Try it
#
# - In the panel, switch the **scheduling** to *static batches*. Where does the knee move, and what
#   happens to TTFT below it?
# - Set the **queue limit** to *unbounded* and rerun the mixture. The failures vanish; what happens
#   to TTFT p95 past the knee instead?
# - Tighten the **SLO** (`0.5` on the slider). For which traffic does the knee move, and why the long
#   prompts first?
# - Run `verdicts(ab_at_two_loads(low_fraction=0.8), "ab_below_capacity_both_keep_up")`. Closer to
#   capacity, do both rules still keep up? Look at B's first tokens and A's time per output token.
# - Recalibrate for your machine: `python -m kvlab calibrate --validate`, then
#   `python -m kvlab sweep --simulate --json my_curve.json`.

# %% [markdown]
# <!-- kvlab:exercise check_knee -->

# %% [markdown]
# <!-- kvlab:exercise check_ab_reading -->

# %% [markdown]
# ## Summary
#
# - A **service curve** reports, per offered load: the four clocks with their sample sizes,
#   achieved vs offered throughput, failures, the backlog at the end of the window and the memory
#   used. Its **knee** is the highest load that still keeps up (here: achieved at least `0.9` of
#   offered, and p95 TTFT within the SLO).
# - Different traffic bends at very different loads: on the authors' machine's costs, long prompts
#   and long answers reach the knee at a fraction of the request rate of short chats.
# - A simulator whose step cost is **calibrated on your machine** sweeps thousands of requests far
#   faster than real time. Checked against the real model, it gets the shape of the curve; its
#   numbers drift with the machine's load, the steps it never timed and the tails: recalibrate on a
#   new machine (`python -m kvlab calibrate`).
# - Below capacity, two rules can do the same work; past it, one can raise throughput and stream
#   answers faster while computing new prompts from each step's leftovers, which can delay first
#   tokens (decode-first vs prefill-first).
#   Compare services on every clock, with quantiles, their n, and the counts of requests refused,
#   still waiting or still running; a quantile over completed requests alone compares survivors, so
#   count the unfinished ones (censored at the window's close) before naming a winner.
# - Behind this notebook: `kvlab.serving.cost_model` (`CostModel`, `CostModelExecutor`),
#   `kvlab.serving.calibrate`, `kvlab.serving.sweep` (`load_sweep`, `mark_knee`),
#   `kvlab.lessons.l06_under_load.load`, `kvlab.lessons.l06_under_load.figures`, `kvlab.lessons.l06_under_load.panel`; commands
#   `python -m kvlab calibrate`, `python -m kvlab sweep`, `python -m kvlab bench batching`; tests in
#   `tests/test_cost_model.py`, `tests/test_sweep.py`, `tests/test_ab_example.py`; the claims checked on
#   your run in `kvlab/lessons/l06_under_load/claims.py` (`tests/test_claims_06.py`).

# %% [markdown]
# <!-- kvlab:navigation -->
