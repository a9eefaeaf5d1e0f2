"""ExperimentPanel without a front end: caching by parameters, errors as one line, results handed back."""
from __future__ import annotations

import ipywidgets as widgets
import pandas as pd
from matplotlib.figure import Figure

from kvlab.lessons.common.panel import ExperimentPanel
from kvlab.lessons.l02_kv_cache.panel import cache_memory_panel, kv_calculator_panel
from kvlab.lessons.l01_the_slowdown.panel import slowdown_panel

LESSONS = ("01", "02")  # the lessons these tests belong to: `pytest -m lNN`


class Recorder:
    """A run function that counts its calls, reports progress over n steps, and can be told to fail."""

    def __init__(self, fail: Exception | None = None):
        self.calls: list[dict] = []
        self.fail = fail

    def __call__(self, progress, n: int, shape: str) -> pd.DataFrame:
        self.calls.append(dict(n=n, shape=shape))
        rows = []
        for i in progress(range(n), total=n, desc="steps", unit="step"):
            if self.fail is not None and i == 1:
                raise self.fail
            rows.append(dict(i=i, y=i * i if shape == "square" else i))
        return pd.DataFrame(rows)


def figure(frame: pd.DataFrame, params: dict) -> Figure:
    fig = Figure(figsize=(3, 2))
    fig.subplots().plot(frame["i"], frame["y"])
    return fig


def make_panel(run: Recorder, **kw) -> ExperimentPanel:
    controls = {"n": widgets.IntSlider(value=3, min=2, max=10),
                "shape": widgets.Dropdown(options=["line", "square"], value="line")}
    return ExperimentPanel(controls, run, figure=figure, summary=lambda f, p: f.tail(1), title="test", **kw)


def mimes(panel: ExperimentPanel) -> list[str]:
    return [m for out in panel.output.outputs for m in out["data"]]


def test_run_hands_back_the_frame_the_figure_and_the_summary():
    run = Recorder()
    panel = make_panel(run)
    result = panel.run()
    assert list(result.frame["y"]) == [0, 1, 2]
    assert isinstance(result.figure, Figure)
    assert result.summary["i"].tolist() == [2]
    assert result.params == {"n": 3, "shape": "line"}
    assert panel.result is result and panel.error is None
    assert "image/png" in mimes(panel) and "text/html" in mimes(panel)  # figure and table in the output area
    assert all(out["output_type"] == "display_data" for out in panel.output.outputs)


def test_the_same_parameters_are_not_recomputed():
    run = Recorder()
    panel = make_panel(run)
    first = panel.run()
    again = panel.run()
    assert len(run.calls) == 1 and panel.computed == 1
    assert again.from_cache and again.frame is first.frame
    assert "not recomputed" in panel.status.value


def test_moving_a_control_back_shows_the_earlier_result_without_recomputing():
    run = Recorder()
    panel = make_panel(run)
    panel.run()
    panel.controls["n"].value = 5  # not run yet: the panel asks for the button
    assert len(run.calls) == 1 and "press <b>Run</b>" in panel.status.value
    panel.run()
    assert len(run.calls) == 2 and len(panel.result.frame) == 5
    panel.controls["n"].value = 3  # back to the first settings
    assert len(run.calls) == 2
    assert panel.result.params["n"] == 3 and panel.result.from_cache
    assert "image/png" in mimes(panel)


def test_auto_run_panels_recompute_on_change_but_still_use_the_cache():
    run = Recorder()
    panel = make_panel(run, auto_run=True)
    panel.run()
    panel.controls["shape"].value = "square"
    assert len(run.calls) == 2 and panel.result.frame["y"].tolist() == [0, 1, 4]
    panel.controls["shape"].value = "line"
    assert len(run.calls) == 2


def test_a_failing_run_shows_one_clear_line_and_no_traceback():
    run = Recorder(fail=ValueError("n=3 is too small for this; raise n to at least 4"))
    panel = make_panel(run)
    assert panel.run() is None
    assert panel.error == "n=3 is too small for this; raise n to at least 4"
    (out,) = panel.output.outputs
    assert out["output_type"] == "display_data"  # not Jupyter's "error" output with a traceback
    assert out["data"]["text/plain"] == "⚠ n=3 is too small for this; raise n to at least 4"
    assert "Traceback" not in str(panel.output.outputs)
    assert not panel.button.disabled  # the learner can fix the setting and try again
    assert panel.progress_bar.container.children[1].bar_style == "danger"  # the bar stops, red, where it failed
    assert "ValueError" in panel.traceback()
    assert panel.computed == 0 and not panel.cache  # a failure is never cached


def test_an_unexpected_error_is_shown_with_its_type_on_one_line():
    panel = make_panel(Recorder(fail=RuntimeError("out of memory\n  while allocating 4 GiB")))
    assert panel.run() is None
    assert panel.error == "RuntimeError: out of memory while allocating 4 GiB"


def test_a_value_a_control_cannot_show_is_refused_not_silently_clamped():
    run = Recorder()
    panel = make_panel(run)
    assert panel.run(n=1000) is None
    assert "n=1000" in panel.error and "2 to 10" in panel.error
    assert panel.controls["n"].value == 3 and not run.calls
    assert panel.run(shape="cube") is None and "'cube'" in panel.error
    assert panel.run(m=1) is None and "unknown parameter" in panel.error
    assert panel.run(n=7).params["n"] == 7


def test_the_progress_bar_counts_the_experiment_s_steps():
    panel = make_panel(Recorder())
    panel.run(n=6)
    bar = panel.progress_bar
    assert bar.n == bar.total == 6
    assert panel.progress_box.children == (bar.container,)


def test_the_cache_of_results_is_bounded():
    run = Recorder()
    panel = make_panel(run, max_cached=2)
    for n in (2, 3, 4):
        panel.run(n=n)
    panel.run(n=2)  # evicted: computed again
    assert [c["n"] for c in run.calls] == [2, 3, 4, 2]


def test_the_panel_displays_as_its_widget():
    panel = make_panel(Recorder())
    bundle = panel._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


# --- the lesson panels, on tiny models -----------------------------------------------------------

def test_slowdown_panel_runs_both_caches_and_plots_them(model):
    panel = slowdown_panel(model, prompt_tokens=8, max_new_tokens=20)
    result = panel.run()
    assert set(result.frame["cache"]) == {"none", "dynamic"}
    assert len(result.figure.axes) == 2
    assert list(result.summary["cache"]) == ["none", "dynamic"]
    assert panel.progress_bar.n == 2 * 3  # one unit per generation run: 2 caches x 3 repeats


def test_cache_memory_panel_reports_allocated_equal_to_formula_for_dynamic(model):
    result = cache_memory_panel(model, prompt_tokens=4, max_new_tokens=8).run()
    row = result.summary.set_index("cache").loc["dynamic"]
    assert row["note"] == "allocated = formula" and row["allocated bytes"] == row["formula bytes"]


def test_calculator_recomputes_on_change_and_names_what_fits():
    panel = kv_calculator_panel("Llama-3-8B (GQA)", context=8192, batch=8, gpu_gib=80)
    first = panel.run()
    assert "8.00 GiB of KV cache" in first.summary and "fits in 80 GiB" in first.summary
    panel.controls["batch"].value = 256
    assert panel.computed == 2 and "does NOT fit" in panel.result.summary
    panel.controls["batch"].value = 8
    assert panel.computed == 2 and panel.result.from_cache


def test_a_panel_folded_until_a_prediction_shows_its_result_only_after_the_guess():
    from kvlab.lessons.common.predict import predict

    guess = predict("How many?", unit="×")
    panel = make_panel(Recorder()).folded_until(guess)
    panel.run()
    (out,) = panel.output.outputs
    assert 'class="kvlab-reveal"' in out["data"]["text/html"] and "data:image/png" in out["data"]["text/html"]
    assert out["data"]["text/plain"] == "(folded until you predict)"
    guess.box.value = 3.0
    panel.run()
    assert all("kvlab-reveal" not in o["data"].get("text/html", "") for o in panel.output.outputs)
    assert any("image/png" in o["data"] for o in panel.output.outputs)
