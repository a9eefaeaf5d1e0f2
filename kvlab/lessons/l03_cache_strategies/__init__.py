"""Lesson 03 · Cache strategies: everything notebooks/03_cache_strategies.ipynb runs."""
