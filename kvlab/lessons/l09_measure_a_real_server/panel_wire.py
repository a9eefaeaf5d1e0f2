"""The panel of lesson 09: a service curve measured at the client of a running server, behind a Run button."""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import pandas as pd

from .wire import DEFAULT_RATES, check_rates, wire_service_curve
from .figures_wire import plot_wire_service_curve
from ...workload import PROFILE_NAMES
from ..common.panel import ExperimentPanel

RATE_CHOICES = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
_STYLE = dict(style={"description_width": "170px"}, layout=widgets.Layout(width="480px"))


def service_table(table: pd.DataFrame) -> pd.DataFrame:
    """`wire_service_curve`'s table with the columns a learner reads first, in milliseconds.

    `sent req/s` is the rate the seeded schedule really sent (requests over the span of their
    scheduled arrivals); `achieved req/s` is completed requests over `window s`, which runs on
    until the last answer ends. `n` counts the completed requests behind TTFT and E2E, `TPOT n`
    those with a second token.
    """
    ms = 1e3
    return pd.DataFrame({
        "offered req/s": table["offered_rps"],
        "requests sent": table["sent"],
        "sent req/s": table["sent_rps"],
        "completed": table["completed"],
        "rejected (429)": table["rejected"],
        "other failures": table["failed_other"],
        "window s": table["window_s"],
        "achieved req/s": table["requests_per_s"],
        "n": table["ttft_n"],
        "TTFT p50 ms": table["ttft_p50_s"] * ms,
        "TTFT p90 ms": table["ttft_p90_s"] * ms,
        "E2E p50 ms": table["e2e_p50_s"] * ms,
        "TPOT n": table["tpot_n"],
        "TPOT p50 ms": table["tpot_p50_s"] * ms,
        "client late, max ms": table["send_delay_max_s"] * ms,
    })


def wire_panel(url: str, rates: Sequence[float] = DEFAULT_RATES, profile: str = "short_short",
               duration_s: float = 2.0, model: str | None = None) -> ExperimentPanel:
    """Offered rates, a request profile and seconds per rate; Run measures `url` at each rate.

    `url` is any OpenAI-compatible server (kvlab's own, vLLM, ...). Each rate sends
    rate × `duration_s` seeded requests (`wire_service_curve`); the figure is
    `plot_wire_service_curve`, the summary `service_table`.
    """
    rates = check_rates(rates)
    missing = [r for r in rates if r not in RATE_CHOICES]
    if missing:
        raise ValueError(f"rates {missing} are not among the panel's choices {list(RATE_CHOICES)}; pick from those")
    controls = {
        "rates": widgets.SelectMultiple(options=RATE_CHOICES, value=rates, rows=5,
                                        description="offered rates (req/s)", **_STYLE),
        "profile": widgets.Dropdown(options=PROFILE_NAMES, value=profile, description="request profile", **_STYLE),
        "duration_s": widgets.FloatSlider(value=duration_s, min=1.0, max=10.0, step=0.5, continuous_update=False,
                                          description="seconds per rate", **_STYLE),
    }

    def run(progress, rates: tuple, profile: str, duration_s: float) -> pd.DataFrame:
        return wire_service_curve(url, sorted(rates), duration_s=duration_s, profile=profile, model=model,
                                  progress=progress)

    return ExperimentPanel(controls, run, figure=lambda t, _p: plot_wire_service_curve(t),
                           summary=lambda t, _p: service_table(t),
                           title=f"The service curve of {url}, measured at the client")
