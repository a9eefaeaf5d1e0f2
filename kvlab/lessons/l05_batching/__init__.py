"""Lesson 05 · Batching: everything notebooks/05_batching.ipynb runs."""
