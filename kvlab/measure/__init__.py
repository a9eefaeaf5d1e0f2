"""What benchmarks and experiments both measure with: interleaved rounds with paired ratios and their spread, and bandwidth probes.

``rounds.py``: run every implementation once per round in a rotated order and compare them within a
round (a paired ratio's median with its IQR and min-max), with the machine's load before and after.
``bandwidth.py``: the machine's memory bandwidth, a matrix-vector product's, a decode step's weight
products' (``MatvecProbe``, ``StepProductsProbe``, ``machine_bandwidth``), and the weight bytes a step
streams. ``transformers_steps.py``: transformers' generate timed per step, and the bytes its caches hold.
``kvlab.benchmarks`` and the lessons (``kvlab.lessons``) import them from here.
"""
from __future__ import annotations

from .bandwidth import MatvecProbe, StepProductsProbe, machine_bandwidth, weight_bytes_per_step
from .rounds import format_load, format_spread, load_average, paired_ratio, rotated, spread

__all__ = ["MatvecProbe", "StepProductsProbe", "format_load", "format_spread", "load_average",
           "machine_bandwidth", "paired_ratio", "rotated", "spread", "weight_bytes_per_step"]
