"""Write notebooks/04_four_clocks.ipynb (and with --execute, run it and save its outputs).

    python scripts/nb_04_four_clocks.py              # write the notebook, no outputs
    python scripts/nb_04_four_clocks.py --execute    # write, run top to bottom, save with outputs
"""
from __future__ import annotations

import sys
from pathlib import Path

from nbformat.v4 import new_code_cell, new_markdown_cell

sys.path.insert(0, str(Path(__file__).parent))
from build_notebooks import write_notebook, SETUP, header, navigation  # noqa: E402

from kvlab.course import lesson  # noqa: E402

FILE = "04_four_clocks.ipynb"


def cells() -> list:
    entry = lesson(FILE)
    return [
        new_markdown_cell(header(entry, "04") + """

A service can answer quickly on average and still leave one person staring at an empty screen.
Whether it is "fast" depends on which clock you look at: when the answer starts, how steadily
it flows, when it is complete, and how much the whole service produces. This notebook follows
one request through a busy serving engine and reads all four clocks off its timeline."""),
        new_code_cell(SETUP),
        new_markdown_cell("""## What you will be able to do

- name the four clocks and say what each one does **not** tell you;
- read a request's journey: arrival, queue, admission, prefill, first token, every later token, finish;
- compute TTFT, TPOT and E2E from a request's timestamps (and predict them from the steps it
  waited for), and say why TPOT divides by *n − 1*;
- tell a cold start from a warm one, and measure both instead of guessing;
- explain why a mean latency can look fine while some requests wait far longer, and report quantiles with their sample size."""),
        new_markdown_cell("""## Four clocks

Every clock here starts when the request was **scheduled to arrive**, the moment its user pressed
enter. Starting later (say, when the server first looked at it) would quietly drop the time it
spent waiting in line.

| clock | the question it answers | what it leaves out |
|---|---|---|
| **TTFT**, time to first token | when does the answer start to appear? | how long the rest takes |
| **time between tokens**: TPOT per request = (E2E − TTFT) / (n − 1); the gaps themselves (ITL) | does the text flow steadily? | the wait before it started |
| **E2E**, end to end | when is the whole answer there? | how much of that is just a long answer |
| **throughput**, output tokens per second of the whole service | how much work gets done? | what any one person waited |

The first three belong to one request; throughput belongs to the service. Most arguments about
"speed" are two people quoting different rows of this table."""),
        new_markdown_cell("""## The engine and the model

The lesson model of notebook 01 (about 3 million parameters, random weights: the timing is that of
a real model of this shape). The engine in `kvlab.serving` batches many requests over one paged
KV cache, the way vLLM does; notebooks 05 and 07 open it up. Here it is a black box that stamps
the time of every event of every request."""),
        new_code_cell('''%matplotlib inline
from kvlab.experiments.serving_run import lesson_model

model = lesson_model()
print(f"{model.config.name}: {model.num_parameters() / 1e6:.1f}M parameters, context of "
      f"{model.config.max_position_embeddings} tokens")'''),
        new_markdown_cell("""## One request's journey

A few long requests arrive first; the engine has only two batch slots (`max_seqs`), so our
request (the *watched* one) arrives just after them and has to wait. Press **Run**, then move the
sliders: more requests ahead, more slots, a longer prompt."""),
        new_code_cell('''from kvlab.widgets.four_clocks import journey_panel

panel = journey_panel(model)
panel'''),
        new_code_cell('''result = panel.run()   # the same as pressing Run
result.show()'''),
        new_markdown_cell("""**Reading the figure.** The grey bar is the queue: the request has arrived (▼) but no slot
is free. When a slot frees it is admitted (●) and its prompt is computed in one step (orange),
which produces the first token (★): TTFT is the whole span from ▼ to ★, and most of it here is
queue, not computation. Then one token per step (blue, each tick a token) until the last (■).
The lower panel shows each gap between tokens: their mean is TPOT. The gaps wobble because the
engine shares each step with the other requests, and because the machine is doing other things.

Who was it waiting behind? The same run as a Gantt chart, one row per request:"""),
        new_code_cell('''from kvlab.plots.gantt import plot_gantt

plot_gantt(result.frame, result.frame.attrs["steps"], title="The journey run: every request")'''),
        new_markdown_cell("""## The same journey, worked out by hand

Real timings change from run to run. To check the arithmetic, the cell below serves the same
requests with a **fixed step-cost executor**: the engine's real scheduler and block manager
decide every step, but each step is priced at exactly 10 ms instead of running the model, on a
virtual clock. Now every timestamp can be predicted by hand: a request that decodes in every
step gets one token per step, so its TPOT must be exactly one step, and its TTFT is the number of
steps that ran before its first token came out, times 10 ms, minus its arrival time."""),
        new_code_cell('''# NBVAL_CHECK_OUTPUT
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
      f"waiting {cut.waiting} + running {cut.running}")'''),
        new_markdown_cell("""The last line is the other half of honest reporting: at any cut-off, every request sent is
either completed, failed, still waiting or still running. A latency figure computed over the
completed ones only says nothing about the others, so the counts go next to it.

### Exercise 1: a slower machine, by hand

Suppose every step cost 20 ms instead of 10 ms, with the same requests and the same schedule.
Using only the numbers printed above, what would the watched request's TTFT and E2E be, in seconds?"""),
        new_code_cell('''from kvlab.exercises import check_step_cost_clocks

my_ttft_s, my_e2e_s = None, None   # replace None with your numbers (seconds)
check_step_cost_clocks(None if my_ttft_s is None else (my_ttft_s, my_e2e_s))'''),
        new_markdown_cell("""<details><summary>Solution</summary>

The schedule does not depend on the step cost, only the clock does. The first token comes out of
step 80 (the 81st step), which now ends at 81 × 20 ms = 1,620 ms; the request arrived at 10 ms, so
TTFT = 1,610 ms = **1.61 s**. Then 23 more tokens, one per step: E2E = 1,610 + 23 × 20 = 2,070 ms =
**2.07 s**. The queue doubled too: it is made of other requests' steps. The checker runs the engine
with a 20 ms step to confirm.
</details>

## Cold start vs warm start

The very first request a service gets after starting can wait for things that have nothing to do
with it: the interpreter starting, libraries importing, weights loading, the KV pool being
allocated, the first forward pass setting things up. This notebook's own process paid those costs
long ago, so measuring them here would be dishonest. The cell below starts a **fresh Python
process**, times each start-up phase, then serves the same single request five times in a row."""),
        new_code_cell('''from kvlab.experiments.four_clocks import cold_vs_warm, cold_warm_summary, startup_phases
from kvlab.plots.startup import plot_cold_warm

cold = cold_vs_warm(repeats=5)
display(startup_phases(cold).round(3))
display(cold_warm_summary(cold).round(3))
plot_cold_warm(cold)'''),
        new_markdown_cell("""**What the measurement says.** Compare the first serving (run 0) with the warm ones: on a CPU the
first forward pass usually costs little extra, and run-to-run noise can be as large as the
difference, so do not read much into a few milliseconds. The big cost of a cold start is
everything *before* the request: starting Python and importing the libraries take seconds, while
a warm request gets its first token in milliseconds. With real weights loaded from disk, and on a
GPU (where the first calls also create the device context and load kernels), those start-up
phases grow further. So a benchmark must say whether it measured a cold or a warm service, and a
service that scales down to zero should expect some users to meet the cold one.

## Why a mean hides the wait

Now thirty requests of mixed lengths (chat turns, long documents, long generations) arrive at
random, six per second on average but in bursts, as real traffic does, with four batch slots.
Most find a slot at once; those arriving in a burst, or behind a long prompt, wait."""),
        new_code_cell('''from kvlab.experiments.four_clocks import mean_vs_tail, run_mixed_load
from kvlab.plots.distribution import plot_clock_distribution

mixed = run_mixed_load(model)
display(mean_vs_tail(mixed.requests).round(3))
plot_clock_distribution(mixed.requests, "ttft_s")'''),
        new_markdown_cell("""**Reading the figure.** The bars pile up on the left, with a thin tail to the right. The mean
sits well above the median because a few long waits pull it up, and yet it is far below what the
slowest requests experienced: p95 is several times the mean. A dashboard showing only the mean
would call this service fine. Always quote a few quantiles (p50, p95, p99), and always with **n**:
with 30 requests, the p99 is decided by a single request, so it is a hint, not a law. (If every
request waited long here, your machine is slower than the lesson assumes and the service is
overloaded: try `run_mixed_load(model, rate=3)`.)

### Exercise 2: how many wait longer than average?

Write a function `share_above_mean(values)` that returns the fraction (between 0 and 1) of the
values strictly above their mean. The checker tries it on a few lists; then apply it to the TTFTs
of the completed requests of `mixed`."""),
        new_code_cell('''from kvlab.exercises import check_share_above_mean

def share_above_mean(values):
    values = list(values)
    return None   # replace None with your expression

display(check_share_above_mean(share_above_mean))
done = mixed.requests[mixed.requests["status"] == "completed"]
print("share of requests waiting longer than the mean TTFT:", share_above_mean(done["ttft_s"]))'''),
        new_markdown_cell("""<details><summary>Solution</summary>

```python
def share_above_mean(values):
    values = list(values)
    mean = sum(values) / len(values)
    return sum(v > mean for v in values) / len(values)
```
With a long tail the mean is pulled above most requests' experience, so the share is usually
well below one half: the mean describes neither the typical request nor the unlucky one.
</details>"""),
        new_markdown_cell("""### Try it

- In the panel, set **batch slots** to 8: the queue disappears. What happens to TTFT, and to TPOT?
- Set **long requests ahead** to 0 and the prompt to 512 tokens: now TTFT is mostly prefill, not queue.
- Run `run_mixed_load(model, rate=12)`: twice the arrival rate. Which grows faster, the p50 or the p95?
- Run `run_mixed_load(model, burstiness=4.0)`: the same rate, evenly spaced. What happens to the tail?
- In the exact run, change `STEP_S` to 0.020 and predict every clock before running the cell.

## Summary

- TTFT, time between tokens, E2E and throughput answer different questions; a single number
  answers one of them at most. Each request clock starts at the scheduled arrival.
- A request's TTFT can be mostly queueing: the model was fast, the line was long.
- TPOT = (E2E − TTFT) / (n − 1): the mean gap after the first token. The largest gap is what a reader notices.
- A cold start pays start-up costs (seconds) before the first request; a warm service answers in
  milliseconds. Say which one a number measured.
- Latency distributions have tails: report p50, p95, p99 with n, and the counts of completed,
  failed, waiting and running requests.
- Behind this notebook: `kvlab.experiments.four_clocks` (`run_journey`, `journey_clocks`,
  `cold_vs_warm`, `run_mixed_load`, `mean_vs_tail`), `kvlab.clocks`, `kvlab.plots.journey`,
  `kvlab.plots.gantt`; tests in `tests/test_experiments_serving.py` and `tests/test_plots_serving.py`."""),
        new_markdown_cell(navigation(entry)),
    ]


def main() -> None:
    write_notebook(FILE, cells, __doc__)


if __name__ == "__main__":
    main()
