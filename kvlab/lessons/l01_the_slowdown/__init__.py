"""Lesson 01 · The slowdown: everything notebooks/01_the_slowdown.ipynb runs."""
