"""Exercises of notebook 06 (under load): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from .framework import Feedback, check_function, exercise, multiple_choice


EX06_CURVES = (  # (offered req/s, achieved / offered, p95 TTFT s, TTFT SLO s): synthetic service curves
    dict(offered=[1, 2, 3, 4, 5], throughput_ratio=[1.0, 0.99, 0.97, 0.8, 0.6], ttft_p95=[0.1, 0.2, 0.9, 5, 9],
         slo_ttft_s=2.0),
    dict(offered=[1, 2, 3, 4, 5], throughput_ratio=[1.0, 0.99, 0.97, 0.8, 0.6], ttft_p95=[0.1, 0.2, 0.9, 5, 9],
         slo_ttft_s=0.5),
    dict(offered=[0.5, 1, 2], throughput_ratio=[0.95, 0.94, 0.93], ttft_p95=[3.0, 4.0, 5.0], slo_ttft_s=1.0),
    dict(offered=[0.5, 1, 2], throughput_ratio=[1.0, 1.0, 0.99], ttft_p95=[0.1, 0.1, 0.2], slo_ttft_s=1.0),
    dict(offered=[1, 2, 3, 4], throughput_ratio=[1.0, 0.85, 0.95, 0.95], ttft_p95=[0.1, 0.2, 0.2, 0.2],
         slo_ttft_s=1.0),
)


def _knee_06(offered, throughput_ratio, ttft_p95, slo_ttft_s):
    from ..serving.sweep import find_knee

    keeps = [r >= 0.9 and t <= slo_ttft_s for r, t in zip(throughput_ratio, ttft_p95)]
    i = find_knee(offered, keeps)
    return None if i is None else offered[i]


def _knee_06_last_ok(offered, throughput_ratio, ttft_p95, slo_ttft_s):  # a wrong answer: the last level that keeps up
    ok = [x for x, r, t in zip(offered, throughput_ratio, ttft_p95) if r >= 0.9 and t <= slo_ttft_s]
    return ok[-1] if ok else None


@exercise("06_under_load.ipynb", solution=_knee_06, wrong=_knee_06_last_ok,
          title='find the knee',
          question="""Write `knee(offered, throughput_ratio, ttft_p95, slo_ttft_s)`: the lists give one value per load
level, in rising order of load. Return the offered load of the knee as defined above (a level
keeps up when `throughput_ratio >= 0.9` and `ttft_p95 <= slo_ttft_s`), or `None` when the first
level already fails or no level fails.""",
          code="""def knee(offered, throughput_ratio, ttft_p95, slo_ttft_s):
    return None   # your code here

answer = None   # replace None with your function: answer = knee
check_knee(answer)""",
          explanation="""Walk up the levels and stop at the first that does not keep up; the knee is the one before it.

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
`kvlab.serving.sweep.find_knee` and `mark_knee` do the same on a sweep's table.""")
def check_knee(answer: Any) -> Feedback:
    """A function knee(offered, throughput_ratio, ttft_p95, slo_ttft_s) -> the knee's offered load, or None."""
    cases = [(c, _knee_06(**c)) for c in EX06_CURVES]

    def explain(kwargs: dict, got: Any, expected: Any) -> str:
        if expected is None and got is not None:
            return ("expected None: either the lowest load already fails (no load is safe) or no level fails "
                    "(the knee lies beyond the loads tried).")
        if got == _knee_06_last_ok(**kwargs):
            return ("that is the last level that keeps up, but the curve broke earlier: the knee is the level "
                    f"just before the FIRST one that fails ({expected}).")
        return (f"expected {expected}: walk up the loads; a level keeps up when achieved/offered >= 0.9 and p95 "
                "TTFT <= the SLO; the knee is the level just before the first that does not.")

    return check_function(answer, cases, what="knee", explain=explain)


check_ab_reading = multiple_choice(
    "06_under_load.ipynb", "check_ab_reading",
    title='reading the A/B example',
    stem="""The A/B example ran both rules at two loads. Below capacity, both kept up. Overloaded, B
streamed more output tokens per second and, once an answer had started, produced its tokens far
faster than A; but B's p95 time to first token was higher. Which statement is right?""",
    options={
        "a": ("B is the better service at every load and for every user: it wins on throughput and on time\n"
              "  per output token, and a later first token only changes when the answer starts to appear.",
              "B wins on throughput and on time per output token, but a person waiting for an answer sees the "
              "first token first, and B's p95 TTFT is the worse one. Whether that matters depends on the TTFT "
              "target; below capacity the two rules hardly differ at all."),
        "b": ("The gap is noise: run the cell again and the order may reverse.",
              "the run is in virtual time on a cost model: the same arguments give the same numbers every time "
              "(a test checks it). The difference comes from the two scheduling rules."),
        "c": ("Past capacity, B trades later first tokens for throughput; which is better depends on the SLOs.",
              None),
        "d": ("A is the better service: its first tokens come sooner, and below capacity it also completes\n"
              "  more requests in the window.",
              "below capacity both rules completed the same requests in the window (both kept up); overloaded, A "
              "completed fewer, because its prompt-only steps pause every running answer."),
    },
    correct="c",
    confirm="throughput, time to first token and time per output token are different clocks. Past capacity "
            "B finishes more answers per minute and streams them faster, A starts each answer sooner. "
            "Which is better depends on the targets (the SLOs) you set for each clock.",
    code="""answer = None   # "a", "b", "c" or "d"
check_ab_reading(answer)""",
    explanation="""```python
answer = "c"
```
Throughput, time to first token and time per output token are different clocks; overloaded, the
two rules trade one for the others, and an SLO on each clock decides which trade is acceptable.
(a) a person waiting for an answer sees the first token first: B's p95 TTFT is the worse one;
(b) the run is in virtual time on a cost model: the same numbers every time; (d) below capacity
both rules completed the same requests, and overloaded A completed fewer.""")
