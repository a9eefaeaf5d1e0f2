"""Lesson 00 · Start here: everything notebooks/00_start_here.ipynb runs."""
