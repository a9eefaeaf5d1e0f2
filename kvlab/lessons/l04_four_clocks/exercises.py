"""Exercises of notebook 04 (the four clocks): checkers, their questions and folded solutions."""
from __future__ import annotations

import functools
import math
from typing import Any

from kvlab.lessons.common.exercises import Feedback, exercise, check_function, right, wrong, _is_number


@functools.lru_cache(maxsize=4)
def _journey_clocks_at(step_s: float) -> tuple[float, float]:
    """(TTFT, E2E) of lesson 04's watched request when every engine step costs ``step_s`` (virtual clock)."""
    from kvlab.experiments.four_clocks import journey_workload
    from kvlab.experiments.serving_run import FixedStepCostExecutor, serve
    from kvlab.serving.config import EngineSpec
    from kvlab.serving.scheduler import SchedulerConfig
    from kvlab.model.lessons import lesson_config

    config = lesson_config()
    requests = journey_workload(config.vocab_size)
    scheduler = SchedulerConfig(max_seqs=2, max_batch_tokens=256)  # run_journey's defaults
    run = serve(config, requests, EngineSpec(scheduler=scheduler), clock="virtual",
                executor=FixedStepCostExecutor(step_s), threads=None)
    c = run.record(requests[-1].request_id).clocks()
    return c["ttft_s"], c["e2e_s"]


@exercise("04_four_clocks.ipynb", solution=_journey_clocks_at(0.020), wrong=_journey_clocks_at(0.010),
          title='a slower machine, by hand',
          question="""Suppose every step cost twice as much (`STEP_S = 0.020` instead of `0.010`), with the same requests
and the same schedule. Using only the numbers printed above, what would the watched request's TTFT and
E2E be, in seconds?""",
          code="""my_ttft_s, my_e2e_s = None, None   # replace None with your numbers (seconds)
check_step_cost_clocks(None if my_ttft_s is None else (my_ttft_s, my_e2e_s))""",
          explanation="""The schedule does not depend on the step cost, only the clock does (these are exact: a virtual
clock). The first token comes out of step 80 (the 81st step), which now ends at `81 × 20 ms = 1,620 ms`;
the request arrived at `10 ms`, so `TTFT = 1,620 − 10 = 1,610 ms` = **`1.61 s`**. Then 23 more tokens,
one per step: `E2E = 1,610 + 23 × 20 = 2,070 ms` = **`2.07 s`**. The queue doubled too: it is made of
other requests' steps. The checker runs the engine with `step_s=0.020` to confirm.""")
def check_step_cost_clocks(answer: Any) -> Feedback:
    """(TTFT, E2E) in seconds of the watched request of lesson 04's exact run if every step cost 20 ms."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(_is_number(a) for a in answer)):
        return wrong(f"answer with two numbers in seconds, (ttft, e2e), got {answer!r}.")
    ttft, e2e = _journey_clocks_at(0.020)
    at10 = _journey_clocks_at(0.010)
    arrival = 0.010
    a_ttft, a_e2e = (float(a) for a in answer)
    steps_to_first = round((ttft + arrival) / 0.020)
    tokens = round((e2e - ttft) / 0.020) + 1
    if math.isclose(a_ttft, ttft, rel_tol=1e-3) and math.isclose(a_e2e, e2e, rel_tol=1e-3):
        return right(f"TTFT = {steps_to_first} steps × 20 ms − 10 ms = {ttft:.3f} s and E2E = TTFT + {tokens - 1} × "
                     f"20 ms = {e2e:.3f} s; the engine agrees. Twice the step cost doubles the time spent "
                     "computing, and here the queue too, since the queue is made of other requests' steps.")
    if math.isclose(a_ttft, at10[0], rel_tol=1e-3):
        return wrong("those are the 10 ms values printed above; every step now costs 20 ms.")
    if math.isclose(a_ttft, ttft + arrival, rel_tol=1e-3):
        return wrong("the clock starts at the request's arrival (10 ms), not at 0: subtract it.")
    if math.isclose(a_ttft, ttft, rel_tol=1e-3) and math.isclose(a_e2e, e2e + 0.020, rel_tol=1e-3):
        return wrong(f"after the first token come {tokens - 1} more tokens, one per step, not {tokens}.")
    if math.isclose(a_ttft, ttft, rel_tol=1e-3):
        return wrong("TTFT is right; E2E = TTFT + (n − 1) steps, with n the number of output tokens.")
    return wrong(f"count the steps up to its first token (it comes from step {steps_to_first - 1}, counting from "
                 "0), multiply by 20 ms and subtract its arrival (10 ms); then one more step per further token.")


def _share_above_mean_wrong(values):
    """A plausible slip for the tests: the share above the median."""
    v = sorted(values)
    return sum(x > v[len(v) // 2] for x in v) / len(v)


def _share_above_mean(values):
    """The solution, for the tests."""
    mean = sum(values) / len(values)
    return sum(v > mean for v in values) / len(values)


@exercise("04_four_clocks.ipynb", kind="function", solution=_share_above_mean, wrong=_share_above_mean_wrong,
          title='how many wait longer than average?',
          question="""Write a function `share_above_mean(values)` that returns the fraction (between 0 and 1) of the
values strictly above their mean. The checker tries it on a few lists; then apply it to the TTFTs
of the completed requests of `mixed`.""",
          code="""def share_above_mean(values):
    values = list(values)
    return None   # replace None with your expression

display(check_share_above_mean(share_above_mean))
done = mixed.requests[mixed.requests["status"] == "completed"]
print(f"share of the {len(done)} completed requests waiting longer than the mean TTFT:",
      share_above_mean(done["ttft_s"]))""",
          explanation="""```python
def share_above_mean(values):
    values = list(values)
    mean = sum(values) / len(values)
    return sum(v > mean for v in values) / len(values)
```
With a long tail, a few slow requests pull the mean above the median, so fewer than half the requests
wait longer than the mean; how many fewer changes from run to run, and with a few dozen requests
one request moves the share by a few points. The line under the figure gives the share on your
run with its n; without a tail (almost nobody queued, or nearly everybody did) it is near one half. Either way the mean describes neither the typical request nor the unlucky one.""")
def check_share_above_mean(answer: Any) -> Feedback:
    """A function share_above_mean(values) -> the fraction of values strictly above their mean."""
    cases = [({"values": [10, 11, 12, 13, 400]}, 0.2), ({"values": [1, 2, 3, 4]}, 0.5),
             ({"values": [5, 5, 5, 5]}, 0.0), ({"values": [12, 15, 14, 13, 16, 11, 14, 250, 13, 15]}, 0.1)]

    def explain(kwargs, got, expected):
        values = kwargs["values"]
        median_share = _share_above_mean_wrong(values)
        if (isinstance(got, (int, float)) and math.isclose(got, median_share)
                and not math.isclose(expected, median_share)):
            return f"expected {expected}: that is the share above the median; compare with the mean."
        if isinstance(got, (int, float)) and 1 < got <= 100:
            return f"expected {expected}: give a fraction between 0 and 1, not a percentage or a count."
        return f"expected {expected} (values strictly above mean = {sum(values) / len(values):g}, over {len(values)})."

    return check_function(answer, cases, what="share_above_mean", explain=explain)
