"""ExperimentPanel: input widgets, a Run button, a progress bar and an output area around one experiment.

The behaviour every lesson shares lives here: results are cached by parameters (moving a slider back shows the earlier
result instantly), long runs wait for the button and report progress on a tqdm bar, and a failed run shows one clear
line in the output area, never a traceback. A notebook or a test can call ``panel.run()`` and get the DataFrame and the
figure without clicking. Works without a front end (in pytest), because outputs are written to the Output widget's
``outputs`` directly rather than captured from a kernel.
"""
from __future__ import annotations

import base64
import html
import io
import time
import traceback
import warnings
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

import ipywidgets as widgets
import pandas as pd
from matplotlib.figure import Figure
from tqdm.notebook import tqdm as tqdm_notebook

from kvlab.provenance import cell_of, produced
from kvlab.lessons.common.fold import folded

RunFn = Callable[..., pd.DataFrame]  # run(progress=..., **params) -> frame
FigureFn = Callable[[pd.DataFrame, dict], Figure]  # figure(frame, params)
SummaryFn = Callable[[pd.DataFrame, dict], "pd.DataFrame | str"]  # summary(frame, params)


def _display(data: dict) -> dict:
    """A Jupyter display_data output of ``data`` (mime type -> content)."""
    return {"output_type": "display_data", "metadata": {}, "data": data}


def figure_output(fig: Figure) -> dict:
    """A Jupyter display_data output holding the figure as a PNG (what GitHub shows in a notebook)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")  # works for figures made without pyplot
    w, h = fig.get_size_inches()
    return _display({"image/png": base64.b64encode(buf.getvalue()).decode("ascii"),
                     "text/plain": f"<Figure size {w * 96:.0f}x{h * 96:.0f}>"})


def output_html(output: dict) -> str:
    """One display output as HTML: its table or text, or its PNG as an image."""
    data = output["data"]
    if "image/png" in data:
        return f'<img src="data:image/png;base64,{data["image/png"]}"/>'
    return data.get("text/html") or f"<pre>{html.escape(data.get('text/plain', ''))}</pre>"


def table_output(table: pd.DataFrame | str) -> dict:
    """A display_data output for a summary: an HTML table for a DataFrame, plain text for a string."""
    if isinstance(table, str):
        return _display({"text/plain": table, "text/html": f"<p>{html.escape(table)}</p>"})
    return _display({"text/html": table.to_html(index=False, float_format=lambda x: f"{x:,.2f}"),
                     "text/plain": table.to_string(index=False)})


def message_output(text: str, kind: str = "error") -> dict:
    """One line for the output area; kind "error" is red, "note" grey. Not Jupyter's error type on purpose."""
    color = {"error": "#b00020", "note": "#555"}[kind]
    mark = "⚠ " if kind == "error" else ""
    return _display({"text/plain": f"{mark}{text}",
                     "text/html": f'<div class="kvlab-{kind}" style="color:{color}">{mark}{html.escape(text)}</div>'})


def error_message(exc: BaseException) -> str:
    """One readable line for a failed run.

    kvlab raises ValueError with the bad value and the fix in the message, so that message is shown
    as is; anything else is unexpected and is shown with its type.
    """
    text = " ".join(str(exc).split()) or "no message"
    text = text if len(text) <= 400 else text[:397] + "..."
    return text if isinstance(exc, ValueError) else f"{type(exc).__name__}: {text}"


def widget_bundle(widget: widgets.Widget, text: str) -> dict:
    """What a notebook shows for ``widget``: its view, with ``text`` for a front end without widgets.

    Written out rather than taken from the widget, because ipywidgets 7 (Colab's) and 8 display
    widgets through different methods (``_ipython_display_`` vs ``_repr_mimebundle_``); the view
    they send is the same in both: protocol 2.0, the widget's model id.
    """
    return {"text/plain": text,
            "application/vnd.jupyter.widget-view+json": {"version_major": 2, "version_minor": 0,
                                                         "model_id": widget.model_id}}


@dataclass
class PanelResult:
    """One run of a panel: its parameters, the data, the figure, the summary and how long it took."""

    params: dict
    frame: pd.DataFrame
    figure: Figure | None = None
    summary: pd.DataFrame | str | None = None
    seconds: float = 0.0  # wall time of the run that computed it
    warnings: list[str] = field(default_factory=list)
    from_cache: bool = False

    def outputs(self) -> list[dict]:
        """Jupyter outputs: warnings (one line each), the summary, the figure."""
        outs = [message_output(w, "note") for w in self.warnings]
        if self.summary is not None:
            outs.append(table_output(self.summary))
        if self.figure is not None:
            outs.append(figure_output(self.figure))
        return outs

    def folded_html(self) -> str:
        """Summary and figure as one HTML body for a fold; the figure is marked as drawn inside it."""
        if self.figure is not None:
            setattr(self.figure, "kvlab_folded", True)  # tests/figure_text.py: not shown before the learner clicks
        return "".join(output_html(o) for o in self.outputs())

    def show(self) -> None:
        """Display the summary and the figure in a notebook cell (the figure as a PNG)."""
        from IPython.display import display

        for out in self.outputs():
            display(out["data"], raw=True)

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return figure_output(self.figure)["data"] if self.figure is not None else {"text/plain": repr(self.frame)}


class ExperimentPanel:
    """Controls + Run button + tqdm progress bar + output area for one experiment.

    ``controls`` maps parameter names to ipywidgets (sliders, dropdowns); ``run(progress=..., **params)`` returns a
    DataFrame; ``figure(frame, params)`` and ``summary(frame, params)`` turn it into what the learner sees. Results are
    cached by parameters, so moving a control back to earlier settings shows the earlier result without recomputing.
    With ``auto_run`` a change of any control runs at once (for instant calculators); otherwise the Run button does.
    Display the panel with ``display(panel)`` or by ending a cell with it.
    """

    def __init__(self, controls: Mapping[str, widgets.ValueWidget], run: RunFn,
                 figure: FigureFn | None = None, summary: SummaryFn | None = None, *, title: str = "",
                 button_label: str = "Run", auto_run: bool = False, max_cached: int = 32) -> None:
        if not controls:
            raise ValueError("an ExperimentPanel needs at least one control (a dict name -> widget)")
        self.controls = dict(controls)
        self._run_fn, self._figure_fn, self._summary_fn = run, figure, summary
        self.auto_run, self.max_cached = auto_run, max_cached
        self.cache: OrderedDict[tuple, PanelResult] = OrderedDict()
        self.result: PanelResult | None = None  # the result on display
        self.error: str | None = None  # the one-line message of the last failed run
        self.last_exception: BaseException | None = None  # for the curious: full traceback via .traceback()
        self.computed = 0  # runs that really computed (cache misses)
        self.progress_bar: tqdm_notebook | None = None
        self.until: Any = None  # a prediction whose answer the result shows: folded while it is not made

        self.button = widgets.Button(description=button_label, button_style="primary", icon="play",
                                     tooltip="run the experiment with these settings")
        self.status = widgets.HTML(value="")
        self.progress_box = widgets.Box(layout=widgets.Layout(min_height="28px"))
        self.output = widgets.Output(layout=widgets.Layout(min_height="40px"))
        header = [widgets.HTML(f"<b>{html.escape(title)}</b>")] if title else []
        self.widget = widgets.VBox([*header, widgets.VBox(list(self.controls.values())),
                                    widgets.HBox([self.button, self.status]), self.progress_box, self.output])
        # CSS classes a stylesheet or a browser test can find (tests/test_browser.py presses .kvlab-run)
        self.widget.add_class("kvlab-panel")
        self.button.add_class("kvlab-run")
        self.status.add_class("kvlab-status")
        self.output.add_class("kvlab-output")
        self.button.on_click(lambda _: self.run())
        self._quiet = False  # True while run() sets controls itself
        for w in self.controls.values():
            w.observe(self._on_change, names="value")

    # --- parameters and cache -------------------------------------------------------------
    def params(self) -> dict:
        """The current value of every control."""
        return {name: w.value for name, w in self.controls.items()}

    @staticmethod
    def key(params: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, repr(v)) for k, v in params.items()))

    def _set_controls(self, values: Mapping[str, Any]) -> None:
        """Set controls by name, refusing values a control would silently change (a slider clamps)."""
        unknown = sorted(set(values) - set(self.controls))
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown}; this panel has {', '.join(self.controls)}")
        before = self.params()
        self._quiet = True
        try:
            for name, value in values.items():
                w = self.controls[name]
                try:
                    w.value = value
                except Exception:  # a Dropdown refuses a value outside its options with a TraitError
                    w.value = before[name]
                    raise ValueError(f"{name}={value!r} is not one of this control's options "
                                     f"{list(getattr(w, 'options', []))}; pick one of them") from None
                if w.value != value:
                    w.value = before[name]
                    lo, hi = getattr(w, "min", None), getattr(w, "max", None)
                    limits = f" ({lo} to {hi}" + (f" in steps of {w.step})" if hasattr(w, "step") else ")")
                    raise ValueError(f"{name}={value!r} is outside what this control allows"
                                     f"{limits if lo is not None else ''}; pick a value it can show")
        except ValueError:
            for name, value in before.items():
                self.controls[name].value = value
            raise
        finally:
            self._quiet = False

    def _on_change(self, _change) -> None:
        if self._quiet:
            return
        cached = self.cache.get(self.key(self.params()))
        if cached is not None:
            self._show(replace(cached, from_cache=True))
        elif self.auto_run:
            self.run()
        else:
            self._set_status("settings changed: press <b>Run</b> to measure them")

    # --- running --------------------------------------------------------------------------
    def _progress(self, iterable: Iterable, *, total: int | None = None, desc: str | None = None,
                  unit: str = "it") -> Iterable:
        self.progress_bar = bar = tqdm_notebook(iterable, total=total, desc=desc, unit=unit, display=False, leave=True)
        self.progress_box.children = (bar.container,)
        return bar

    def run(self, **values: Any) -> PanelResult | None:
        """Run with the current controls (after setting any given as keyword arguments).

        Returns the PanelResult (from the cache when these parameters ran before), or None when the
        run failed; then ``panel.error`` holds the one-line message shown in the output area.
        """
        try:
            self._set_controls(values)
        except ValueError as exc:
            self._fail(exc)
            return None
        params = self.params()
        k = self.key(params)
        if k in self.cache:
            self.cache.move_to_end(k)
            result = produced(replace(self.cache[k], from_cache=True), cell_of(self.cache[k]))  # made back then
            self._show(result)
            return result
        self.button.disabled = True
        self.progress_box.children = ()
        self.progress_bar = None
        self._set_status("running…")
        start = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                frame = self._run_fn(progress=self._progress, **params)
                fig = self._figure_fn(frame, params) if self._figure_fn else None
                summary = self._summary_fn(frame, params) if self._summary_fn else None
        except Exception as exc:  # shown as one line; the traceback stays in last_exception
            if self.progress_bar is not None and self.progress_bar.n < (self.progress_bar.total or 0):
                self.progress_bar.close()  # turns the bar red where it stopped
            self._fail(exc)
            return None
        except KeyboardInterrupt:  # Kernel > Interrupt: say so in the panel, then stop the caller as usual
            if self.progress_bar is not None:
                self.progress_bar.close()
            self._fail(KeyboardInterrupt("stopped by Kernel > Interrupt before it finished; nothing was kept, "
                                         "press Run to start again"))
            raise
        finally:
            self.button.disabled = False
        notes = sorted({f"{w.category.__name__}: {w.message}" for w in caught})
        result = produced(PanelResult(params=params, frame=frame, figure=fig, summary=summary,
                                      seconds=time.perf_counter() - start, warnings=notes))
        self.computed += 1
        self.cache[k] = result
        while len(self.cache) > self.max_cached:
            self.cache.popitem(last=False)
        self._show(result)
        return result

    def _fail(self, exc: BaseException) -> None:
        self.error, self.last_exception = error_message(exc), exc
        self.result = None
        self.output.outputs = (message_output(self.error, "error"),)
        self._set_status("failed: see the message below")

    def traceback(self) -> str:
        """The full traceback of the last failed run (for debugging; the panel shows one line)."""
        return "".join(traceback.format_exception(self.last_exception)) if self.last_exception else ""

    # --- display --------------------------------------------------------------------------
    def _set_status(self, text_html: str) -> None:
        self.status.value = f'<span style="color:#555">{text_html}</span>'

    def folded_until(self, prediction: Any) -> "ExperimentPanel":
        """Fold every result this panel shows while ``prediction`` (a ``predict(...)`` box) has no value: the
        panel's figure and table state its answer. Returns the panel, so a notebook writes it in one line."""
        if not hasattr(prediction, "value"):
            raise TypeError(f"folded_until takes the prediction box (guess = predict(...)), not "
                            f"{type(prediction).__name__}")
        self.until = prediction
        return self

    def _show(self, result: PanelResult) -> None:
        self.result, self.error = result, None
        if self.until is not None and self.until.value is None:
            body = result.folded_html()
            page = folded("🎯 this result holds the answer to your prediction: type your number in the box above "
                          "and press Run again, or click here to show it", body)
            self.output.outputs = (_display({"text/html": page, "text/plain": "(folded until you predict)"}),)
        else:
            self.output.outputs = tuple(result.outputs())
        self._set_status(f"same settings as an earlier run: shown from the cache, not recomputed (that run took "
                         f"{result.seconds:.1f} s)" if result.from_cache else f"done in {result.seconds:.1f} s")

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return widget_bundle(self.widget, "ExperimentPanel: " + ", ".join(self.controls))
