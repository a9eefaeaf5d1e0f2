"""The panel of lesson 05: static vs continuous batching on the same requests, Gantt charts on one time axis."""
from __future__ import annotations

import ipywidgets as widgets
import pandas as pd

from kvlab.experiments.batching import LESSON_REQUESTS, compare_policies
from kvlab.workload import LENGTHS
from kvlab.experiments.serving_run import runs_frame
from kvlab.model.decoder import Decoder
from kvlab.lessons.common.gantt import plot_gantts
from kvlab.lessons.common.panel import ExperimentPanel

_WIDE = dict(style={"description_width": "150px"}, layout=widgets.Layout(width="480px"))


def policies_for_learners(table: pd.DataFrame) -> pd.DataFrame:
    """A ``runs_table`` in the terms of the lesson: throughput, first-token wait, steps, batch size."""
    return pd.DataFrame({
        "run": table["run"], "output tokens/s": table["output_tokens_per_s"].round(0),
        "TTFT p50 (ms)": (table["ttft_p50_s"] * 1e3).round(0), "TTFT p95 (ms)": (table["ttft_p95_s"] * 1e3).round(0),
        "E2E p95 (ms)": (table["e2e_p95_s"] * 1e3).round(0), "n": table["ttft_n"],
        "steps": table["steps"], "sequences per step": table["mean_batch"].round(2),
    })


def batching_panel(model: Decoder | None = None, lengths: str = "mixed", n: int = LESSON_REQUESTS, max_seqs: int = 4,
                   max_new_tokens: int = 48) -> ExperimentPanel:
    """Pick equal or mixed lengths, the number of requests and the batch slots; Run serves them under both policies."""
    controls = {
        "lengths": widgets.Dropdown(options=list(LENGTHS), value=lengths, description="request lengths", **_WIDE),
        "n": widgets.IntSlider(value=n, min=4, max=24, step=2, continuous_update=False, description="requests",
                               **_WIDE),
        "max_seqs": widgets.IntSlider(value=max_seqs, min=1, max=8, continuous_update=False,
                                      description="batch slots (max_seqs)", **_WIDE),
    }

    def run(progress, lengths: str, n: int, max_seqs: int) -> pd.DataFrame:
        return runs_frame(compare_policies(model, lengths=(lengths,), n=n, max_seqs=max_seqs,
                                           max_new_tokens=max_new_tokens, progress=progress))

    return ExperimentPanel(controls, run, figure=lambda f, _p: plot_gantts(f, f.attrs["steps"]),
                           summary=lambda f, _p: policies_for_learners(f.attrs["runs"]),
                           title="Static vs continuous batching, same requests")


def static_over_continuous_steps(result) -> tuple[float, dict[str, int]]:
    """The answer to notebook 05's prediction: how many times as many steps static batching ran as continuous
    batching on the same requests, with the two step counts it is computed from (what no output before the
    question may show). ``result``: the panel's result (or its frame, or a ``batching_table``)."""
    frame = getattr(result, "frame", result)
    table = frame.attrs["runs"] if "runs" in getattr(frame, "attrs", {}) else frame
    steps = {str(run).split(",")[0]: int(s) for run, s in zip(table["run"], table["steps"])}
    if not {"static", "continuous"} <= set(steps):
        raise ValueError(f"this run has no static and continuous pair to compare; its runs: {list(table['run'])}")
    return steps["static"] / steps["continuous"], {"static steps": steps["static"],
                                                   "continuous steps": steps["continuous"]}
