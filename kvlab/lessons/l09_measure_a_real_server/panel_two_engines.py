"""The panel of lesson 09's second engine: kvlab serve and transformers serve, same weights and workload, behind a Run button."""
from __future__ import annotations

from typing import Sequence

import ipywidgets as widgets
import pandas as pd

from .two_engines import LOW_RATE, SWEEP_DURATION_S, SWEEP_RATES, clocks_table, compare_engines
from ...http.peer import transformers_serve_available
from .figures_two_engines import plot_two_engines
from ..common.panel import ExperimentPanel

RATE_CHOICES = (2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0)
_STYLE = dict(style={"description_width": "170px"}, layout=widgets.Layout(width="480px"))


def two_engines_panel(folder=None, rates: Sequence[float] = SWEEP_RATES, low_rate: float = LOW_RATE,
                      duration_s: float = SWEEP_DURATION_S, slo_ttft_s: float = 1.0) -> ExperimentPanel:
    """Sweep rates, seconds per rate and the knee's TTFT bound; Run starts both servers and measures each in turn.

    `compare_engines` behind it: cold, warm at `low_rate`, then the mixture sweep to each
    engine's knee. The summary is `clocks_table` (plus the one line saying why transformers serve
    was left out, when it was); the figure `plot_two_engines`.
    """
    missing = [r for r in rates if r not in RATE_CHOICES]
    if missing:
        raise ValueError(f"rates {missing} are not among the panel's choices {list(RATE_CHOICES)}; pick from those")
    controls = {
        "rates": widgets.SelectMultiple(options=RATE_CHOICES, value=tuple(rates), rows=4,
                                        description="sweep rates (req/s)", **_STYLE),
        "duration_s": widgets.FloatSlider(value=duration_s, min=1.0, max=10.0, step=0.5, continuous_update=False,
                                          description="seconds per rate", **_STYLE),
        "slo_ttft_s": widgets.FloatSlider(value=slo_ttft_s, min=0.1, max=5.0, step=0.1, continuous_update=False,
                                          description="knee: TTFT p95 within (s)", **_STYLE),
    }

    def run(progress, rates: tuple, duration_s: float, slo_ttft_s: float) -> pd.DataFrame:
        return compare_engines(folder, low_rate=low_rate, rates=sorted(rates), duration_s=duration_s,
                               slo_ttft_s=slo_ttft_s, progress=progress).frame

    def summary(frame: pd.DataFrame, _params) -> pd.DataFrame:
        return clocks_table(frame).round(2)

    ok, why = transformers_serve_available()
    title = "kvlab serve and transformers serve: same weights, same workload, same client"
    return ExperimentPanel(controls, run, figure=lambda f, p: plot_two_engines(f, p["slo_ttft_s"]), summary=summary,
                           title=title if ok else f"{title} (transformers serve unavailable: {why})")


__all__ = ["two_engines_panel"]
