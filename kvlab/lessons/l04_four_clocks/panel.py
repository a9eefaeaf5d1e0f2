"""The panel of lesson 04: one request's journey through a busy engine, with its four clocks."""
from __future__ import annotations

import ipywidgets as widgets
import pandas as pd

from kvlab.experiments.four_clocks import journey_clocks, run_journey
from kvlab.experiments.serving_run import runs_frame
from kvlab.model.decoder import Decoder
from kvlab.lessons.l04_four_clocks.claims import watched_row
from kvlab.lessons.l04_four_clocks.figures import plot_request_journey
from kvlab.lessons.common.panel import ExperimentPanel

_SLIDER = dict(continuous_update=False, style={"description_width": "170px"}, layout=widgets.Layout(width="480px"))


def clocks_for_learners(table: pd.DataFrame) -> pd.DataFrame:
    """``journey_clocks`` with milliseconds and plain column names."""
    return pd.DataFrame({"clock": table["clock"], "from": table["start"], "to": table["end"],
                         "how it is computed": table["how"],
                         "ms": [f"{v * 1e3:,.1f}" if pd.notna(v) else "" for v in table["seconds"]]})


def journey_panel(model: Decoder | None = None, n_ahead: int = 4, max_seqs: int = 2, prompt_tokens: int = 64,
                  max_new_tokens: int = 24) -> ExperimentPanel:
    """Sliders for the requests ahead, batch slots and the watched request's lengths; Run serves them all.

    The figure is the watched request's journey (``plot_request_journey``), the summary its clocks.
    """
    controls = {
        "n_ahead": widgets.IntSlider(value=n_ahead, min=0, max=8, description="long requests ahead", **_SLIDER),
        "max_seqs": widgets.IntSlider(value=max_seqs, min=1, max=8, description="batch slots (max_seqs)", **_SLIDER),
        "prompt_tokens": widgets.IntSlider(value=prompt_tokens, min=16, max=512, step=16,
                                           description="its prompt tokens", **_SLIDER),
        "max_new_tokens": widgets.IntSlider(value=max_new_tokens, min=8, max=128, step=8,
                                            description="its tokens to generate", **_SLIDER),
    }

    def run(progress, n_ahead: int, max_seqs: int, prompt_tokens: int, max_new_tokens: int) -> pd.DataFrame:
        return runs_frame([run_journey(model, n_ahead=n_ahead, max_seqs=max_seqs, prompt_tokens=prompt_tokens,
                                       max_new_tokens=max_new_tokens, progress=progress)])

    return ExperimentPanel(controls, run,
                           figure=lambda f, _p: plot_request_journey(watched_row(f), f.attrs["steps"]),
                           summary=lambda f, _p: clocks_for_learners(journey_clocks(f)),
                           title="One request's journey: queued behind others, then served")
