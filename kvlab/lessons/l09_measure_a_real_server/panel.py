"""Notebook 09's panels, each behind a Run button: a service curve measured at the client of a running server, and
kvlab serve beside transformers serve (and vLLM, where it is set up) on the same weights and workload."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import ipywidgets as widgets
import pandas as pd

from kvlab.experiments.three_engines import (
    NOTEBOOK_RATES,
    VLLM,
    available_engines,
    measure_engine,
    same_greedy_tokens,
    vllm_folder,
)
from kvlab.experiments.two_engines import (
    LOW_RATE,
    SWEEP_DURATION_S,
    SWEEP_RATES,
    EnginesRun,
    Protocol,
    clocks_table,
    compare_engines,
    lesson_checkpoint,
    make_server,
    start_together,
)
from kvlab.experiments.wire import DEFAULT_RATES, check_rates, wire_service_curve
from kvlab.http.client_priority import realtime_client
from kvlab.http.peer import BEST_SPEC, transformers_serve_available
from kvlab.lessons.common.panel import ExperimentPanel
from kvlab.lessons.l09_measure_a_real_server.figures import plot_two_engines, plot_wire_service_curve
from kvlab.workload import PROFILE_NAMES

RATE_CHOICES = (2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0)
_STYLE = dict(style={"description_width": "170px"}, layout=widgets.Layout(width="480px"))


def service_table(table: pd.DataFrame) -> pd.DataFrame:
    """`wire_service_curve`'s table with the columns a learner reads first, in milliseconds.

    `sent req/s` is the rate the seeded schedule really sent (requests over the span of their scheduled arrivals);
    `achieved req/s` is completed requests over `window s`, which runs on until the last answer ends. `n` counts the
    completed requests behind TTFT and E2E, `TPOT n` those with a second token.
    """
    ms = 1e3
    return pd.DataFrame({
        "offered req/s": table["offered_rps"], "requests sent": table["sent"], "sent req/s": table["sent_rps"],
        "completed": table["completed"], "rejected (429)": table["rejected"], "other failures": table["failed_other"],
        "window s": table["window_s"], "achieved req/s": table["requests_per_s"], "n": table["ttft_n"],
        "TTFT p50 ms": table["ttft_p50_s"] * ms, "TTFT p90 ms": table["ttft_p90_s"] * ms,
        "E2E p50 ms": table["e2e_p50_s"] * ms, "TPOT n": table["tpot_n"], "TPOT p50 ms": table["tpot_p50_s"] * ms,
        "client late, max ms": table["send_delay_max_s"] * ms,
    })


def wire_panel(url: str, rates: Sequence[float] = DEFAULT_RATES, profile: str = "short_short",
               duration_s: float = 2.0, model: str | None = None) -> ExperimentPanel:
    """Offered rates, a request profile and seconds per rate; Run measures `url` at each rate.

    `url` is any OpenAI-compatible server (kvlab's own, vLLM, ...). Each rate sends rate × `duration_s` seeded requests
    (`wire_service_curve`); the figure is `plot_wire_service_curve`, the summary `service_table`.
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


SWEEP_RATE_CHOICES = (2.0, 4.0, 8.0, 16.0, 24.0, 32.0, 48.0, 64.0)


def two_engines_panel(folder=None, rates: Sequence[float] = SWEEP_RATES, low_rate: float = LOW_RATE,
                      duration_s: float = SWEEP_DURATION_S, slo_ttft_s: float = 1.0) -> ExperimentPanel:
    """Sweep rates, seconds per rate and the knee's TTFT bound; Run starts both servers and measures each in turn.

    `compare_engines` behind it: cold, warm at `low_rate`, then the mixture sweep to each
    engine's knee. The summary is `clocks_table` (plus the one line saying why transformers serve
    was left out, when it was); the figure `plot_two_engines`.
    """
    missing = [r for r in rates if r not in SWEEP_RATE_CHOICES]
    if missing:
        raise ValueError(f"rates {missing} are not among the panel's choices {list(SWEEP_RATE_CHOICES)}; pick from those")
    controls = {
        "rates": widgets.SelectMultiple(options=SWEEP_RATE_CHOICES, value=tuple(rates), rows=4,
                                        description="sweep rates (req/s)", **_STYLE),
        "duration_s": widgets.FloatSlider(value=duration_s, min=1.0, max=10.0, step=0.5, continuous_update=False,
                                          description="seconds per rate", **_STYLE),
        "slo_ttft_s": widgets.FloatSlider(value=slo_ttft_s, min=0.1, max=5.0, step=0.1, continuous_update=False,
                                          description="knee: TTFT p95 within (s)", **_STYLE),
    }

    def run(progress, rates: tuple, duration_s: float, slo_ttft_s: float) -> pd.DataFrame:
        protocol = Protocol(low_rate=low_rate, duration_s=duration_s, slo_ttft_s=slo_ttft_s)
        return compare_engines(folder, sorted(rates), protocol, progress=progress).frame

    ok, why = transformers_serve_available()
    title = "kvlab serve and transformers serve: same weights, same workload, same client"
    return ExperimentPanel(controls, run, figure=lambda f, p: plot_two_engines(f, p["slo_ttft_s"]),
                           summary=lambda f, _p: clocks_table(f).round(2),
                           title=title if ok else f"{title} (transformers serve unavailable: {why})")


# -- what notebook 09 calls ------------------------------------------------------------------------------
@dataclass
class ThreeEngines:
    """`three_engines`' answer: the run, its table and figure, or only `message` (why vLLM was not measured)."""

    message: str
    run: EnginesRun | None = None
    table: pd.DataFrame | None = None
    figure: object = None
    usage: list = field(default_factory=list)

    def show(self) -> None:
        """Print the message; display the table and the figure when there are any."""
        from IPython.display import display

        print(self.message)
        if self.table is not None:
            display(self.table)
            display(self.figure)


def three_engines(folder: str | Path | None = None, rates: Sequence[float] = NOTEBOOK_RATES,
                  duration_s: float = SWEEP_DURATION_S, low_rate: float = LOW_RATE, slo_ttft_s: float = 1.0,
                  bisect: int = 0, seed: int = 0, log: Callable[[str], None] = lambda _m: None) -> ThreeEngines:
    """Is vLLM set up? Then start it beside kvlab serve and transformers serve on the lesson checkpoint, check their
    greedy answers agree, measure each in turn with the same client (cold, warm, the sweep to its knee), stop
    all three, and return one table (`clocks_table` plus where each ran) and one figure (`plot_two_engines`).
    Otherwise `ThreeEngines.message` says in one line how to set it up, and nothing is started."""
    protocol = Protocol(low_rate=low_rate, duration_s=duration_s, slo_ttft_s=slo_ttft_s, bisect=bisect, seed=seed)
    engines, left_out = available_engines()
    if VLLM in left_out:
        return ThreeEngines(left_out[VLLM])
    folder = lesson_checkpoint(folder) if folder is not None else vllm_folder()
    log(f"starting {', '.join(engines)} (vLLM: 50-100 s) ...")
    # kvlab serve as bench serve runs it (BEST_SPEC: compiled at start while vLLM compiles its own)
    servers = start_together([make_server(e, folder, spec=BEST_SPEC) if e == "kvlab serve" else make_server(e, folder)
                              for e in engines])
    rows: list[dict] = []
    usage: list[dict] = []
    try:
        greedy = same_greedy_tokens(servers)
        with realtime_client() as priority:  # as bench serve: no server's busy core leaves the client waiting
            for server in servers:
                r, u = measure_engine(server, rates, protocol, cold=True, log=log)
                rows, usage = rows + r, usage + [u]
        described = {s.name: s.describe() for s in servers}
    finally:
        for server in servers:
            server.stop()
    frame = pd.DataFrame(rows)
    settings = {"folder": str(folder), "rates": list(rates), **dataclasses.asdict(protocol),
                "client_priority": str(priority)}
    frame.attrs.update(servers=described, greedy=greedy, settings=settings, unavailable=left_out or None, usage=usage)
    run = EnginesRun(frame, described, greedy["answers"], settings, "; ".join(left_out.values()) or None)
    message = (f"same greedy text on {greedy['prompts'] - len(greedy['differ'])} of {greedy['prompts']} prompts; "
               + "; ".join(f"{e}: knee {k}, {u['processes']} processes, {u['cores_busy']} cores busy"
                           for (e, k), u in zip(run.knees().items(), usage)))
    return ThreeEngines(message, run, clocks_table(frame).round(2), plot_two_engines(frame, slo_ttft_s), usage)


__all__ = ["ThreeEngines", "three_engines", "two_engines_panel"]
