"""Exercises of notebook 06 (under load): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from kvlab.lessons.common.exercises import Feedback, check_function, exercise, multiple_choice
from kvlab.serving.knee import KEEPS_UP_RATIO, find_knee, keeps_up


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
    return find_knee(offered, [keeps_up(r, t, slo_ttft_s) for r, t in zip(throughput_ratio, ttft_p95)]).rps


def _knee_06_last_ok(offered, throughput_ratio, ttft_p95, slo_ttft_s):  # a wrong answer: the last level that keeps up
    ok = [x for x, r, t in zip(offered, throughput_ratio, ttft_p95) if r >= KEEPS_UP_RATIO and t <= slo_ttft_s]
    return ok[-1] if ok else None


@exercise("06_under_load.ipynb", kind="function", solution=_knee_06, wrong=_knee_06_last_ok,
          title='find the knee',
          question=f"""Write `knee(offered, throughput_ratio, ttft_p95, slo_ttft_s)`: the lists give one value per load
level, in rising order of load. Return the offered load of the knee as defined above: the highest load
before the first level that does not keep up (a level keeps up when `throughput_ratio >= {KEEPS_UP_RATIO}` and
`ttft_p95 <= slo_ttft_s`). Return `None` when the curve has no knee on its grid: the first level already fails
(capacity below it), or no level fails (capacity at least the highest load).""",
          code="""def knee(offered, throughput_ratio, ttft_p95, slo_ttft_s):
    return None   # your code here

answer = None   # replace None with your function: answer = knee
check_knee(answer)""",
          explanation=f"""Walk up the levels and stop at the first that does not keep up; the knee is the one before it.

```python
def knee(offered, throughput_ratio, ttft_p95, slo_ttft_s):
    last_ok = None
    for load, ratio, p95 in zip(offered, throughput_ratio, ttft_p95):
        if ratio < {KEEPS_UP_RATIO} or p95 > slo_ttft_s:
            return last_ok          # None if the very first level fails
        last_ok = load
    return None                     # never failed: the knee lies beyond the loads tried

answer = knee
```
`kvlab.serving.knee.find_knee` does the same for every knee kvlab prints: the lessons' curves, the HTTP sweeps,
`bench serve` and the room view.""")
def check_knee(answer: Any) -> Feedback:
    """A function knee(offered, throughput_ratio, ttft_p95, slo_ttft_s) -> the knee's offered load, or None."""
    cases = [(c, _knee_06(**c)) for c in EX06_CURVES]

    def explain(kwargs: dict, got: Any, expected: Any) -> str:
        if expected is None and got is not None:
            return ("expected None: either the lowest load already fails (capacity lies below it) or no level "
                    "fails (capacity is at least the highest load: the knee lies beyond the loads tested).")
        if got == _knee_06_last_ok(**kwargs):
            return ("that is the last level that keeps up, but the curve broke earlier: the knee is the level "
                    f"just before the FIRST one that fails ({expected}).")
        return (f"expected {expected}: walk up the loads; a level keeps up when achieved/offered >= {KEEPS_UP_RATIO} and p95 "
                "TTFT <= the SLO; the knee is the level just before the first that does not.")

    return check_function(answer, cases, what="knee", explain=explain)


check_ab_reading = multiple_choice(
    "06_under_load.ipynb", "check_ab_reading",
    title='reading the A/B example',
    stem="""Overloaded, B (decode first, 64 tokens per step) streamed more output tokens per second than A
(prefill first), but its p95 time to first token was higher. Why does B's first token come later?""",
    options={
        "a": ("each B step carries prompt chunks and decodes together, so every step is slower, and a new "
              "prompt waits behind those slower steps;",
              "B's steps are the faster ones for the answers: once started, B produced a token far more often than "
              "A (the TPOT line). Its first tokens come later because of how each step's 64 tokens are shared out."),
        "b": ("B serves the running answers first: a waiting prompt gets only what is left of each step's 64 "
              "tokens, so it takes many steps;", None),
        "c": ("B keeps more answers running at once, so its KV memory fills and a new prompt waits for blocks "
              "to be freed;",
              "B kept far fewer answers running than A when the window closed (the running column), so it held "
              "less KV memory, not more. The delay comes from how each step's 64 tokens are shared out."),
        "d": ("B's p95 counts every request sent, while A's counts only the quick ones it completed, which "
              "flatters A;",
              "the verdict reads both p95s over every request sent (the same n for A and B), each followed to its "
              "first token: a fair comparison. The delay comes from how each step's 64 tokens are shared out."),
    },
    correct="b", wrong_example="d",
    confirm="decode first spends each step's 64-token budget on the running answers' next tokens before any "
            "prompt, so a long document's prompt is computed a few tokens per step and its first token comes "
            "late; prefill first gives a waiting prompt the next steps and pauses every running answer. The "
            "same budget buys B its steady streams and its later starts.",
    code="""answer = None   # "a", "b", "c" or "d"
check_ab_reading(answer)""",
    explanation="""```python
answer = "b"
```
Under B every step first carries one token of each running answer, and prompts share what is left
of the 64-token budget: a long document's prompt is spread over many steps, so its first token
comes late, while the answers already started never pause. Under A a waiting prompt always gets
the next steps: its first token comes soon, and every running answer pauses meanwhile. (a) once
started, B's answers get a token far more often than A's (TPOT), so its steps are not what holds
prompts back; (c) B ends the window with far fewer answers running than A, so it holds less KV
memory, not more; (d) the verdict reads both p95s over every request sent, the same n for A and B.""")
