"""ipywidgets panels: the shared ExperimentPanel and one builder per lesson."""
from __future__ import annotations

from .memory import cache_memory_panel, kv_calculator_panel
from .panel import ExperimentPanel, PanelResult, error_message, figure_png
from .predict import Prediction, predict
from .slowdown import slowdown_panel

__all__ = ["ExperimentPanel", "PanelResult", "cache_memory_panel", "error_message", "figure_png",
           "kv_calculator_panel", "predict", "Prediction", "slowdown_panel"]
