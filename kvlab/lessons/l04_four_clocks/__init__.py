"""Lesson 04 · The four clocks: everything notebooks/04_four_clocks.ipynb runs."""
