"""Write notebooks/06_under_load.ipynb (and with --execute, run it and save its outputs).

    python scripts/nb_06_under_load.py              # write the notebook, no outputs
    python scripts/nb_06_under_load.py --execute    # write, run top to bottom, save with outputs
"""
from __future__ import annotations

import sys
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

sys.path.insert(0, str(Path(__file__).parent))
from build_notebooks import write_notebook, SETUP, header, navigation  # noqa: E402

from kvlab.course import lesson  # noqa: E402

FILE = "06_under_load.ipynb"


def cells() -> list:
    entry = lesson(FILE)
    return [
        new_markdown_cell(header(entry, "06") + """

A demo with one user says little about a service. What matters is how it behaves as more people
use it at once: up to what load do answers start quickly and flow steadily, how many requests are
refused, and how much memory it takes. This notebook draws that picture, the **service curve**,
for several kinds of traffic, and then shows two real scheduling rules where the one that gets
more work done is also the one that makes people wait longer for the first word."""),
        new_code_cell(SETUP),
        new_markdown_cell("""## What you will be able to do

- read a service curve: the four clocks, achieved vs offered throughput and failures as the load rises;
- find the **knee** of a curve, and say which rule defines it;
- explain how a simulator calibrated on your machine can sweep thousands of requests in seconds,
  and check it against the real model;
- reproduce "more throughput, later first token" with two real scheduling policies, and count
  what was sent, completed, failed and still waiting when the measurement window closed."""),
        new_markdown_cell("""## Why a simulator

A service curve needs many load levels with hundreds of requests each. On the real 30M-parameter
model with two CPU cores, one level of 500 requests would take many minutes. So kvlab also has a
**cost-model executor**: the same engine, the same scheduler and block manager, but each step's
duration is *predicted* from its shape instead of measured, and the engine's clock jumps by that
prediction (virtual time). A step's cost is a sum of simple terms:

| term | why it costs |
|---|---|
| a fixed cost per step | every weight is read once per step, whatever the batch |
| per prompt token | each token is one more row in every matrix product |
| per decoding sequence | one more row, one more token to sample |
| per KV slot read by decodes | attention reads the stored keys and values |
| per query-key pair of a prompt | attention over a prompt grows with its square |
| per attention call | each sequence attended on its own pays a little setup |

`python -m kvlab calibrate` times the real model on about 40 designed batch shapes and fits these
coefficients by least squares. kvlab ships a calibration made on the maintainers' machine: read it
as an example of a machine, not a fact about yours."""),
        new_code_cell('''%matplotlib inline
from kvlab.serving.cost_model import load_calibration

shipped = load_calibration("llama-30m")
print(shipped.describe())
v = shipped.fit["validation"]
print(f"checked on {v['n_shapes']} shapes not used in the fit: median error {v['median_ape']:.0%}")
env = shipped.environment
print(f"measured on: {env['cpu']}, {env['cpu_count']} cores, {shipped.settings['threads']} thread(s), "
      f"torch {env['versions']['torch']}, load average {shipped.settings.get('load_average_1m')}")'''),
        new_markdown_cell("""### Is the simulator honest? Check it against the real model

A cost model predicts the machine it was measured on. So first calibrate one **here**, for the
small model of the serving lessons (3M parameters; a few seconds), then serve the same requests at
three loads twice: once with the real model on the wall clock, once in the simulator."""),
        new_code_cell('''from kvlab.experiments.load import simulated_vs_real
from kvlab.experiments.slowdown import slowdown_config
from kvlab.plots.load import plot_service_curve
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
               "e2e_p95_s"]].round(4))
plot_service_curve(check, title=f"Real {small.name} (solid) vs the simulator calibrated a moment ago (dashed)")'''),
        new_markdown_cell("""Solid lines are measured, dashed ones simulated. They should agree on throughput and lie
within tens of percent on the latencies. Where they part, the simulator leaves something out: other
programs taking the CPU in the middle of a step, steps of shapes it never timed, and how a
slightly slower step changes who gets batched with whom (the real run forms different batches).
Trust the simulator for the **shape** of the curve and where its knee lies on your machine, not
for the third digit.

## The service curve of each kind of traffic

Four workloads, each swept over eight loads from a tenth of the estimated capacity to one and a
half times it (simulated on the shipped calibration of the 30M model, 16 sequences per batch, at
most 16 requests waiting: a request arriving to a full queue is refused)."""),
        new_code_cell('''from kvlab.experiments.load import scheduler_config, service_curves

curves = service_curves(requests=200, levels=8, scheduler=scheduler_config(max_seqs=16, max_waiting=16))
plot_service_curve(curves)'''),
        new_markdown_cell("""**Reading the curves.** Top left: TTFT stays flat while the service keeps up, then shoots
up: requests queue. Top right: time per output token rises more gently, as batches fill.
Bottom left: achieved throughput follows the offered load (the dashed diagonal) up to a point,
then flattens: that is capacity. Bottom right: once the queue is full, requests are refused, and
that is also why TTFT stops growing at the highest loads: the queue cannot get longer, so the
requests that *are* served wait a bounded time while the others get no answer at all.

The **knee** (dotted line) is the highest load that still *keeps up*: at least 90% of the offered
load is served and p95 TTFT is within the SLO (2 s here). Past it, waiting, not work, decides
what users see. Long prompts (`long_short`) and long answers (`long_gen`) bend at a much lower
request rate than short chats. A table of the knees, with the sample size behind each quantile:"""),
        new_code_cell('''knees = curves[curves["is_knee"]]
display(knees[["profile", "offered_rps", "achieved_rps", "ttft_p50_s", "ttft_p95_s", "ttft_n", "tpot_p50_s",
               "peak_kv_blocks", "peak_kv_bytes", "goodput_rps"]].round(3))'''),
        new_markdown_cell("""### Every request counted

A latency quantile is computed over the requests that completed. The others must be counted
next to it: requests sent, completed, refused (failed), still waiting and still running when the
window closes. The cell below uses a fixed, round-number cost model (no calibration, no timing),
so its output is the same on every machine: its counts are checked."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
import kvlab
from kvlab.experiments.load import end_of_window_counts, service_curve
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
print("n behind each p95:", exact["ttft_n"].tolist())'''),
        new_markdown_cell("""At 6 requests/s the quantile is computed over fewer requests than were sent: some were
refused, and at the end of the window many were still queued. A p95 without those counts would flatter
the service.

## Explore: your own service curve

Choose the traffic, the scheduling rule, the batch size, the queue limit, the loads (`auto`, or
numbers of requests/s separated by commas) and the TTFT target. **Run** simulates the whole sweep."""),
        new_code_cell('''from kvlab.widgets.load import service_curve_panel

panel = service_curve_panel()
panel'''),
        new_code_cell('''result = panel.run(profile="mixture", requests=200)   # the same as pressing Run
result.show()'''),
        new_markdown_cell("""## More throughput, later first token

Same requests, same load, two real scheduling rules of the engine (only `priority` differs):

- **A, prefill first** (vLLM's original rule): whenever a prompt is waiting, the next step is
  spent on prompts; the running answers pause.
- **B, decode first** with a budget of 64 tokens per step (stall-free batching, as in
  Sarathi-Serve): every running answer gets its next token each step; prompts use what is left of
  the budget.

The traffic is long documents in, short answers out (32 tokens each), for one minute, counted
when the minute ends. The load is the lowest at which A alone no longer keeps up (a sweep of A
finds it; the choice looks at A's throughput only, not at any first-token time, nor at B)."""),
        new_code_cell('''from kvlab.experiments.load import ab_example
from kvlab.plots.load import plot_ab_example

ab = ab_example()   # virtual time on the shipped calibration: the same numbers on every run
display(ab[["policy", "rule", "offered_rps", "sent", "completed", "failed", "waiting", "running",
            "output_tokens_per_s", "ttft_p50_s", "ttft_p95_s", "ttft_n", "tpot_p50_s"]].round(3))
plot_ab_example(ab)'''),
        new_markdown_cell("""B completes more answers in the minute: it keeps every answer moving, and each of its steps
carries prompt work *and* decodes, so the fixed cost of a step is shared. A starts answers
sooner: a waiting document always goes next. But each of A's prompt-only steps pauses every
answer in progress and pays the step's fixed cost alone, so answers finish later and fewer fit
in the minute. Neither is "faster": they win on different clocks.

The same comparison on the round-number cost model, so the verdict is checked:"""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
from kvlab.experiments.load import ab_holds

exact_ab = ab_example(round_model)
for row in exact_ab.itertuples():
    print(f"{row.policy} ({row.rule}): sent {row.sent}, completed {row.completed}, waiting {row.waiting}, "
          f"running {row.running}; TTFT p95 {row.ttft_p95_s:.2f} s (n={row.ttft_n})")
verdict = ab_holds(exact_ab)
print(f"{verdict['higher_throughput']} has {verdict['throughput_ratio']:.2f}x the throughput and "
      f"{verdict['ttft_p95_ratio']:.2f}x the p95 TTFT: trade-off present = {verdict['holds']}")'''),
        new_markdown_cell("""### Try it

- In the panel, switch the **scheduling** to *static batches*. Where does the knee move, and what
  happens to TTFT below it?
- Set the **queue limit** to *unbounded* and rerun the mixture. The failures vanish; what happens
  to TTFT p95 past the knee instead?
- Tighten the **SLO** to 0.5 s. For which traffic does the knee move, and why the long prompts first?
- Run `ab_example(rate=0.3)`. Is there still a trade-off when nobody has to wait?
- Recalibrate for your machine: `python -m kvlab calibrate --validate` (about two minutes), then
  `python -m kvlab sweep --simulate --json my_curve.json`.

### Exercise 1: find the knee

Write `knee(offered, throughput_ratio, ttft_p95, slo_ttft_s)`: the lists give one value per load
level, in rising order of load. Return the offered load of the knee as defined above (a level
keeps up when `throughput_ratio >= 0.9` and `ttft_p95 <= slo_ttft_s`), or `None` when the first
level already fails or no level fails."""),
        new_code_cell('''from kvlab.exercises import check_knee

def knee(offered, throughput_ratio, ttft_p95, slo_ttft_s):
    return None   # your code here

answer = None   # replace None with your function: answer = knee
check_knee(answer)'''),
        new_markdown_cell("""<details><summary>Solution</summary>

Walk up the levels and stop at the first that does not keep up; the knee is the one before it.

```python
def knee(offered, throughput_ratio, ttft_p95, slo_ttft_s):
    last_ok = None
    for load, ratio, p95 in zip(offered, throughput_ratio, ttft_p95):
        if ratio < 0.9 or p95 > slo_ttft_s:
            return last_ok          # None if the very first level fails
        last_ok = load
    return None                     # never failed: the knee lies beyond the loads tried

answer = knee
```
`kvlab.serving.sweep.find_knee` and `mark_knee` do the same on a sweep's table.
</details>"""),
        new_markdown_cell("""### Exercise 2: reading the A/B example

In the one-minute window, B completed more requests than A, and B's p95 time to first token was
higher. Which statement is right?

- **a** B is the better service: it completed more requests in the same minute.
- **b** B serves more people per minute, but a person using it waits longer for the first word;
  which is better depends on the targets (SLOs) set for each clock.
- **c** A's first tokens come sooner, so A must also complete more requests once the window is longer.
- **d** The difference is noise: run it again and it may reverse."""),
        new_code_cell('''from kvlab.exercises import check_ab_reading

answer = None   # "a", "b", "c" or "d"
check_ab_reading(answer)'''),
        new_markdown_cell("""<details><summary>Solution</summary>

```python
answer = "b"
```
Throughput and TTFT are different clocks, and the two rules trade one for the other. (c) A's
prompt-only steps pause the answers in progress, which is why it completes fewer; (d) the run is
in virtual time on a cost model: the same numbers every time.
</details>

## Summary

- A **service curve** reports, per offered load: the four clocks with their sample sizes,
  achieved vs offered throughput, failures, the backlog at the end of the window and the memory
  used. Its **knee** is the highest load that still keeps up (here: >= 90% served and p95 TTFT
  within the SLO).
- Different traffic bends at very different loads: long prompts and long answers reach the knee
  at a fraction of the request rate of short chats.
- A simulator whose step cost is **calibrated on your machine** sweeps thousands of requests in
  seconds; check it against the real model before trusting it, and recalibrate on a new machine.
- A rule can raise throughput and delay first tokens at the same time (prefill-first vs
  decode-first): compare services on every clock, with quantiles, their n, and the counts of
  requests refused or still waiting.
- Behind this notebook: `kvlab.serving.cost_model` (`CostModel`, `CostModelExecutor`),
  `kvlab.serving.calibrate`, `kvlab.serving.sweep` (`load_sweep`, `mark_knee`),
  `kvlab.experiments.load`, `kvlab.plots.load`, `kvlab.widgets.load`; commands
  `python -m kvlab calibrate`, `python -m kvlab sweep`, `python -m kvlab bench batching`; tests in
  `tests/test_cost_model.py`, `tests/test_sweep.py`, `tests/test_ab_example.py`."""),
        new_markdown_cell(navigation(entry)),
    ]


def main() -> None:
    write_notebook(FILE, cells, __doc__)


if __name__ == "__main__":
    main()
