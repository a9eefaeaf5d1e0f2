"""Exercises of notebook 09 (measure a real server): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any


from kvlab.lessons.common.exercises import Feedback, check_frame_function, exercise, multiple_choice


def _overhead_ms(frame) -> float:
    """The reference answer of exercise 09.1: median over requests of client TTFT (from sending) − engine TTFT, ms."""
    return float(((frame["client_ttft_from_sent_s"] - frame["engine_ttft_s"]) * 1e3).median())


def _overhead_cases() -> list:
    """Hand-made side-by-side frames (seconds) on which each common slip gives its own number."""
    import pandas as pd

    return [
        # differences 1, 18, 3 ms -> median 3; difference of medians 18 - 12 = 6; mean 7.33; from scheduled 5
        pd.DataFrame({"client_ttft_s": [0.012, 0.032, 0.020], "client_ttft_from_sent_s": [0.011, 0.030, 0.018],
                      "engine_ttft_s": [0.010, 0.012, 0.015]}),
        # differences 0.5, 2, 4, 4 ms -> median 3 (mean of the middle two); difference of medians 2; mean 2.625
        pd.DataFrame({"client_ttft_s": [0.0050, 0.0090, 0.0300, 0.0065],
                      "client_ttft_from_sent_s": [0.0045, 0.0080, 0.0250, 0.0060],
                      "engine_ttft_s": [0.0040, 0.0060, 0.0210, 0.0020]}),
    ]


def _overhead_slips(frame) -> list[tuple[float, str]]:
    sent, scheduled, engine = (frame[c] * 1e3 for c in ("client_ttft_from_sent_s", "client_ttft_s", "engine_ttft_s"))
    return [(_overhead_ms(frame) / 1e3, "that looks like seconds; return milliseconds."),
            (float((scheduled - engine).median()), "client_ttft_s starts at the scheduled arrival, so it also holds "
             "the client's own send delay; start the client's clock when the request was sent "
             "(client_ttft_from_sent_s)."),
            (float(sent.median() - engine.median()), "a difference of medians is not the median of the "
             "differences: subtract per request first, then take the median."),
            (float((sent - engine).mean()), "that is the mean of the differences; one slow request pulls it "
             "around. Take the median.")]


@exercise("09_measure_a_real_server.ipynb", kind="function", solution=_overhead_ms,
          wrong=lambda frame: float(frame["client_ttft_from_sent_s"].median() - frame["engine_ttft_s"].median()) * 1e3,
          title='what the wire adds',
          question="""Write a function `overhead_ms(frame)` that takes a side-by-side frame like `side` and returns the
median over requests of *client TTFT from sending − engine TTFT*, in milliseconds. The checker
tries it on frames built so that each common slip gives a different number.""",
          code="""overhead_ms = None   # replace None with your function, e.g.  def overhead_ms(frame): return ...
check_http_overhead(overhead_ms)""",
          explanation="""```python
def overhead_ms(frame):
    return float(((frame["client_ttft_from_sent_s"] - frame["engine_ttft_s"]) * 1e3).median())

overhead_ms(side)
```

Subtract per request, then take the median: the median of the client's times minus the median of
the engine's times pairs up different requests. Starting at `client_ttft_s` would add the client's
own send delay, which is not the wire's doing.""")
def check_http_overhead(answer: Any) -> Feedback:
    """A function overhead_ms(frame): median over requests of client TTFT (from sending) − engine TTFT, in ms."""
    return check_frame_function(
        answer, _overhead_cases(), _overhead_ms, _overhead_slips, what="overhead_ms", unit="a number of milliseconds",
        mismatch="per request client_ttft_from_sent_s − engine_ttft_s, times 1000; then the median.",
        confirm="the median of the per-request differences, in ms, on every test frame. It is always >= 0: "
                "the client sends before the server receives, and reads the token after the engine wrote it.")


def _output_tokens_per_s(frame) -> float:
    """The reference answer of exercise 09.2: output tokens of completed requests / (last event − first arrival)."""
    done = frame[frame["status"] == "completed"]
    return float(done["output_tokens"].sum() / (frame["finished_s"].max() - frame["scheduled_s"].min()))


def _throughput_cases() -> list:
    """Hand-made requests frames (seconds): overlapping requests, a failure, a run that does not start at 0."""
    import pandas as pd

    nan = float("nan")
    return [
        # 30 tokens completed over 0.5 -> 2.0 s = 20 tok/s; the failed request's 3 tokens do not count
        pd.DataFrame({"status": ["completed", "completed", "failed"], "scheduled_s": [0.5, 0.7, 1.0],
                      "finished_s": [1.5, 2.0, 1.2], "output_tokens": [10, 20, 3], "e2e_s": [1.0, 1.3, nan]}),
        # the run lasts until its last event, a timeout at 2.0 s: 24 tokens / 2.0 s = 12 tok/s
        pd.DataFrame({"status": ["completed", "completed", "failed"], "scheduled_s": [0.0, 0.2, 0.4],
                      "finished_s": [1.0, 0.8, 2.0], "output_tokens": [16, 8, 0], "e2e_s": [1.0, 0.6, nan]}),
    ]


def _throughput_slips(frame) -> list[tuple[float, str]]:
    done = frame[frame["status"] == "completed"]
    tokens, span = done["output_tokens"].sum(), frame["finished_s"].max() - frame["scheduled_s"].min()
    return [(frame["output_tokens"].sum() / span, "only completed requests count: a failed request delivered "
             "no answer, whatever it streamed before failing."),
            (tokens / done["e2e_s"].sum(), "the requests overlap in time: divide by the run's duration, not by "
             "the sum of their E2E times."),
            (tokens / frame["finished_s"].max(), "the run's clock starts at the first scheduled arrival, not at 0; "
             "subtract it."),
            ((done["output_tokens"] / done["e2e_s"]).mean(), "that averages each request's own pace; throughput "
             "is the service's total over the run's duration."),
            (tokens / (done["finished_s"].max() - frame["scheduled_s"].min()), "the run lasts until its last "
             "event, a failure included: take the last finished_s of every request.")]


@exercise("09_measure_a_real_server.ipynb", kind="function", solution=_output_tokens_per_s,
          wrong=lambda frame: float(frame.loc[frame["status"] == "completed", "output_tokens"].sum()
                                    / frame.loc[frame["status"] == "completed", "e2e_s"].sum()),
          title='throughput, as the service sees it',
          question="""Write `throughput(frame)`: the output tokens per second of a run, from its requests frame
(`result.frame()`), counted as
<a href="https://github.com/vllm-project/vllm/blob/main/vllm/benchmarks/serve.py">vLLM's benchmark</a>
does: output tokens of the **completed** requests
divided by the run's duration, from the first scheduled arrival to its last event.""",
          code="""throughput = None   # replace None with your function, e.g.  def throughput(frame): return ...
check_output_tokens_per_s(throughput)""",
          explanation="""```python
def throughput(frame):
    done = frame[frame["status"] == "completed"]
    return done["output_tokens"].sum() / (frame["finished_s"].max() - frame["scheduled_s"].min())

print(throughput(result.frame()), "vs kvlab's summary:", result.summary().output_tokens_per_s)
```

The requests overlap in time, so dividing by the sum of their E2E times undercounts; averaging each
request's own pace answers a different question (what one person saw).""")
def check_output_tokens_per_s(answer: Any) -> Feedback:
    """A function throughput(frame): output tokens per second of a run from its requests frame, as vLLM counts it."""
    return check_frame_function(
        answer, _throughput_cases(), _output_tokens_per_s, _throughput_slips, what="throughput",
        unit="tokens per second",
        mismatch="output tokens of completed requests / (last finished_s − first scheduled_s).",
        confirm="completed output tokens over the run's duration, on every test frame: what the service "
                "delivered. What one person saw is another clock (TTFT, TPOT, E2E).")


check_rejections_and_quantiles = multiple_choice(
    "09_measure_a_real_server.ipynb", "check_rejections_and_quantiles",
    title='fewer answers, better numbers?',
    stem="""A colleague runs this panel and reports: "TTFT p90 stays under a second even at 256 requests
per second." The table shows that a large share of the requests at that rate were rejected
with 429. What follows?""",
    options={
        "a": ("The server handles 256 requests per second with a good TTFT; a 429 only asks the client to "
              "retry, so those requests can be left out of the report.",
              "the server answered only part of that load; the rest got 429 and no answer at all. A report that "
              "leaves them out describes a server that does not exist."),
        "b": ("The p90 is pulled up by the rejections: sending every 429 takes the server time, which delays "
              "the requests that got in.",
              "the server answers 429 at once, when its queue is full: a rejection costs it little. Rejections "
              "do not pull the p90 up; their absence from it is what flatters it."),
        "c": ("It is a p90 of the requests that got in: the rejected ones belong beside it, as a count.", None),
        "d": ("A rejected request enters the quantiles with a TTFT of zero, which pulls the p90 down.",
              "a rejected request has no first token, so it has no TTFT at all: it is left out of the quantiles, "
              "not counted as zero. Its absence is what flatters the p90."),
    },
    correct="c", wrong_example="d",
    confirm="latency quantiles are computed over completed requests only. A rejected user got no answer at "
            "all, so the counts (completed, rejected, failed) belong next to every quantile, and goodput "
            "(requests/s that met a target) is the number to compare across loads.",
    code='check_rejections_and_quantiles(None)   # replace None with "a", "b", "c" or "d"',
    explanation="""**c.** A rejected user got no answer at all, so there is no TTFT to put in a quantile: the p90
describes only the requests that got in. The load generator keeps a record of every request (a
rejection has `fail_reason` `http_429:queue_full`), which is how the counts above could be checked
against the server's own. To compare loads with one number, count the requests that completed *and*
met a target (goodput: `result.summary(slo=kvlab.clocks.SLO(ttft_s=0.5))`). (a) leaves out the
users who got no answer; (b) a 429 is sent at once and costs the server little; (d) a rejection
has no TTFT: it is left out of the quantiles, not counted as zero.""")
