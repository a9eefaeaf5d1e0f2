"""Predict, then run: a box where the learner writes a number before an experiment, shown beside the measurement.

    guess = predict("Without a cache, how many times as long as token 20 will token 194 take?", unit="×")
    guess                      # a number box; type the prediction, then run the experiment
    result = panel.run()       # an experiment (``@experiment``): the result notes the cell that produced it
    guess.against(result, late_over_early)  # "you predicted 3×; your run measured 2.5× (0.83 times your prediction)"

``against`` notes the cell that asked and the cell that produced the result (:mod:`kvlab.provenance`), so a
notebook whose result came before its question fails its test by construction. The prediction can also be set in
code (``predict(..., value=3)``: the tests, a teacher's projected notebook). Until the learner types a number, the
measurement is folded into a ``<details>`` element (plain HTML: it opens with no kernel and no widget), and the
plain-text form (a terminal, nbval) holds no number at all. ``guess.fold(table)`` folds a table that states it.
"""
from __future__ import annotations

import html
import math
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import ipywidgets as widgets

from matplotlib.figure import Figure

from kvlab.lessons.common.fold import folded
from kvlab.lessons.common.panel import PanelResult, figure_output, output_html
from kvlab.provenance import cell_of, current_cell
from kvlab.lessons.common.session import note_comparison

MEASURED_CLASS = "kvlab-measured"  # the element inside a fold that holds the measured value


@dataclass(frozen=True)
class Comparison:
    """A prediction next to what the run measured (a notebook cell's last expression)."""

    question: str
    predicted: float | None
    measured: float
    unit: str
    what: str
    asked_in: int | None = None  # the number of the cell that asked (kvlab's count, .provenance; None outside a kernel)
    produced_in: int | None = None  # ... of the cell whose experiment produced the result
    compared_in: int | None = None  # ... and of the cell that compared them (where this comparison shows)
    # The numbers the answer is computed from that a run reproduces (counts, bytes, tokens): an earlier output
    # could state them, and the notebook test searches for them. A wall-clock reading is a fresh draw each run,
    # so no earlier output can state it (a match is a coincidence: 11.7 ms and "11.7 MiB of weights"); the
    # cell order (asked_in < produced_in) is what proves it was not seen first, and it is not listed.
    inputs: Mapping[str, float] = field(default_factory=dict)

    @property
    def in_order(self) -> bool | None:
        """True when the result was produced after the question was asked; None where a cell is unknown."""
        return None if self.asked_in is None or self.produced_in is None else self.produced_in > self.asked_in

    def _cells_ago(self, cell: int | None) -> str:
        return "" if cell is None or self.compared_in is None else str(self.compared_in - cell)

    def _provenance(self) -> str:
        """HTML attributes the notebook tests read: how many cells before this one the question was asked and the
        result produced. Counted back from here, they are the same under every runner (nbval's saved-output check
        compares them), wherever the kernel's count began."""
        inputs = html.escape(json.dumps(dict(self.inputs), ensure_ascii=False), quote=True)
        return (f' data-asked-ago="{self._cells_ago(self.asked_in)}"'
                f' data-produced-ago="{self._cells_ago(self.produced_in)}" data-inputs="{inputs}"')

    def _fmt(self, x: float) -> str:
        return f"{x:,.3g}{self.unit}" if self.unit in ("×", "%") else f"{x:,.3g} {self.unit}".rstrip()

    @property
    def hidden(self) -> bool:
        """True while there is no prediction: the measurement is not shown until the learner acts."""
        return self.predicted is None

    def __str__(self) -> str:
        if self.predicted is None:  # hidden; no number here: this is what a saved notebook and nbval hold
            return ("no prediction yet: type your number in the box above and run this cell again "
                    "(the answer stays hidden until then; in a notebook, a click on this line reveals it).")
        ratio = self.measured / self.predicted if self.predicted else math.inf
        return (f"you predicted {self._fmt(self.predicted)}; {self.what} {self._fmt(self.measured)} "
                f"({ratio:,.2g} times your prediction)")

    __repr__ = __str__

    def _repr_html_(self) -> str:
        warn = ('<div style="color:#b00020">⚠ this result was produced before the question was asked: '
                'predict first, then run the experiment again</div>' if self.in_order is False else "")
        if not self.hidden:
            return f'<div class="kvlab-prediction"{self._provenance()}>🎯 {html.escape(str(self))}</div>{warn}'
        summary = (f"🎯 no prediction yet: type your number in the box above and run this cell again — "
                   f"or click here to reveal what {self.what}")
        measured = (f'{html.escape(self.what)}: <b class="{MEASURED_CLASS}">'
                    f'{html.escape(self._fmt(self.measured))}</b>')
        return f'<div class="kvlab-prediction"{self._provenance()}>{folded(summary, measured)}</div>{warn}'


class Folded:
    """A table or text that gives a prediction's answer away, folded like the comparison until the learner acts.

    Only what a reader sees is folded (the HTML a notebook shows): the plain text stays whole, so nbval
    still checks a deterministic table and a terminal still prints it.
    """

    def __init__(self, shown: object, prediction: "Prediction", what: str) -> None:
        self.shown, self.prediction, self.what = shown, prediction, what

    def _body_html(self) -> str:
        shown = self.shown
        if isinstance(shown, Figure):
            setattr(shown, "kvlab_folded", True)  # tests/figure_text.py leaves a figure inside a fold out of what shows
            return output_html(figure_output(shown))
        if isinstance(shown, PanelResult):  # its summary and its figure
            return shown.folded_html()
        to_html = getattr(shown, "_repr_html_", None)
        page = to_html() if callable(to_html) else None
        return page if page is not None else f"<pre>{html.escape(str(shown))}</pre>"

    def __repr__(self) -> str:
        if isinstance(self.shown, (Figure, PanelResult)):
            return f"({self.what}: folded in the notebook until you predict)"
        return self.shown if isinstance(self.shown, str) else repr(self.shown)

    def _repr_html_(self) -> str:
        if self.prediction.value is not None:
            return self._body_html()
        return folded(f"🎯 {self.what} holds the answer to your prediction: type your number in the box above and "
                      f"run this cell again, or click here to show it", self._body_html())


class Prediction:
    """A labelled number box for one prediction; ``against(measured)`` puts the two side by side."""

    def __init__(self, question: str, unit: str = "", value: float | None = None) -> None:
        self.question, self.unit = question, unit
        self.box = widgets.FloatText(value=value if value is not None else 0.0, description="my prediction",
                                     style={"description_width": "initial"},
                                     layout=widgets.Layout(width="220px"))
        self._set = value is not None
        self.asked_in = current_cell()  # the cell that asked: its experiment must run after it
        self.box.observe(self._mark_set, names="value")
        self.widget = widgets.VBox([widgets.HTML(f"<b>Predict first.</b> {html.escape(question)}"
                                                 + (f" (in {html.escape(unit)})" if unit else "")), self.box],
                                   layout=widgets.Layout(border="1px solid #ddd", padding="4px"))
        self.widget.add_class("kvlab-predict")

    def _mark_set(self, _change) -> None:
        self._set = True

    @property
    def value(self) -> float | None:
        """The learner's number, or None while the box was never filled."""
        return float(self.box.value) if self._set else None

    def against(self, result: Any, measure: Callable[[Any], Any] | None = None,
                what: str = "your run measured") -> Comparison:
        """The prediction beside the answer ``measure(result)`` reads from the experiment's ``result``.

        ``measure`` returns the number, or ``(number, {name: input})`` with the numbers it is computed from.
        Without ``measure``, ``result`` is the number itself (a script or a test: no provenance is checked).
        Hides the answer while there is no prediction."""
        inputs: Mapping[str, float] = {}
        if measure is None:
            measured, produced_in = result, None
        else:
            measured = measure(result)
            produced_in = cell_of(result)
            if isinstance(measured, tuple):
                measured, inputs = measured
        comparison = Comparison(self.question, self.value, float(measured), self.unit, what,
                                self.asked_in, produced_in, current_cell(), dict(inputs))
        note_comparison(comparison)  # for the room (session.share_run)
        return comparison

    def fold(self, shown: object, what: str = "this table") -> "Folded":
        """``shown`` (a DataFrame, a text, a figure, a panel's result) folded away while there is no prediction,
        because it states the answer (a figure's legend or title can)."""
        return Folded(shown, self, what)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


def predict(question: str, unit: str = "", value: float | None = None) -> Prediction:
    """A box for the learner's prediction of a number the next experiment measures."""
    return Prediction(question, unit, value)
