"""The panel of lesson 06: a simulated service curve for a chosen profile, policy, loads and SLO."""
from __future__ import annotations

import ipywidgets as widgets
import pandas as pd

from kvlab.clocks import SLO
from kvlab.experiments.service_curves import DEFAULT_SLO, scheduler_config, service_curve
from kvlab.lessons.l06_under_load.figures import plot_service_curve
from kvlab.serving.cost_model import CostModel
from kvlab.serving.scheduler import Policy, Priority
from kvlab.workload import PROFILE_NAMES
from kvlab.lessons.common.panel import ExperimentPanel

_WIDE = dict(style={"description_width": "150px"}, layout=widgets.Layout(width="480px"))
POLICIES: dict[str, tuple[Policy, Priority]] = {"continuous, decode first": ("continuous", "decode_first"),
                                                "continuous, prefill first": ("continuous", "prefill_first"),
                                                "static batches": ("static", "decode_first")}
QUEUE_LIMITS = {"64 waiting": 64, "16 waiting": 16, "256 waiting": 256, "unbounded": None}


def parse_rates(text: str) -> list[float] | None:
    """"auto" (or empty) -> None; "0.5, 1, 2" -> [0.5, 1.0, 2.0], with a clear error otherwise."""
    text = text.strip().lower()
    if text in ("", "auto"):
        return None
    try:
        return [float(x) for x in text.replace(";", ",").split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"rates {text!r}: write 'auto' or rising numbers of requests/s separated by commas, "
                         "e.g. 0.5, 1, 2, 3") from None


def curve_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """The levels a learner reads: load, the clocks with their n (completed requests), throughput, failures,
    the backlog, the knee."""
    return pd.DataFrame({
        "offered req/s": frame["offered_rps"], "achieved req/s": frame["achieved_rps"],
        "TTFT p50 s": frame["ttft_p50_s"], "TTFT p95 s": frame["ttft_p95_s"], "TTFT n": frame["ttft_n"],
        "TPOT p50 s": frame["tpot_p50_s"], "TPOT n": frame["tpot_n"], "failed %": 100 * frame["failure_rate"],
        "waiting at window end": frame["window_waiting"], "goodput req/s": frame.get("goodput_rps"),
        "knee": frame["is_knee"].map({True: "◀ knee", False: ""}),
    })


def service_curve_panel(cost_model: CostModel | None = None, profile: str = "mixture", requests: int = 300,
                        title: str = "Service curve (simulated on the calibrated cost model)") -> ExperimentPanel:
    """Dropdowns for profile, scheduling policy and queue limit, sliders for max_seqs, requests and SLO, a rates box.

    Run simulates the sweep in virtual time (``service_curve``); the figure is
    ``plot_service_curve``, the summary one row per load level with its sample size.
    """
    controls = {
        "profile": widgets.Dropdown(options=list(PROFILE_NAMES), value=profile, description="profile", **_WIDE),
        "policy": widgets.Dropdown(options=list(POLICIES), value="continuous, decode first",
                                   description="scheduling", **_WIDE),
        "max_seqs": widgets.IntSlider(value=16, min=1, max=64, description="max batch (seqs)",
                                      continuous_update=False, **_WIDE),
        "queue": widgets.Dropdown(options=list(QUEUE_LIMITS), value="64 waiting", description="queue limit", **_WIDE),
        "rates": widgets.Text(value="auto", description="loads (req/s)", **_WIDE),
        "requests": widgets.IntSlider(value=requests, min=50, max=1000, step=50, description="requests per level",
                                      continuous_update=False, **_WIDE),
        "slo_ttft_s": widgets.FloatSlider(value=DEFAULT_SLO.ttft_s, min=0.25, max=10.0, step=0.25,
                                          description="SLO: TTFT p95 (s)", continuous_update=False, **_WIDE),
    }

    def run(progress, profile: str, policy: str, max_seqs: int, queue: str, rates: str, requests: int,
            slo_ttft_s: float) -> pd.DataFrame:
        kind, priority = POLICIES[policy]
        sched = scheduler_config(kind, priority, max_seqs=max_seqs, max_batch_tokens=max(512, max_seqs),
                                 max_waiting=QUEUE_LIMITS[queue])
        return service_curve(profile, parse_rates(rates), requests, sched, SLO(ttft_s=slo_ttft_s,
                             tpot_s=DEFAULT_SLO.tpot_s), cost_model, progress=progress)

    return ExperimentPanel(controls, run, figure=lambda frame, _p: plot_service_curve(frame),
                           summary=lambda frame, _p: curve_summary(frame), title=title)


__all__ = ["curve_summary", "parse_rates", "service_curve_panel"]
