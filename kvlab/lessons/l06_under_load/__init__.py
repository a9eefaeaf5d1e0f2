"""Lesson 06 · Under load: everything notebooks/06_under_load.ipynb runs."""
