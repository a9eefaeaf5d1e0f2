"""Lesson 08 · Preemption, prefixes and chunks: everything notebooks/08_prefix_and_chunks.ipynb runs."""
