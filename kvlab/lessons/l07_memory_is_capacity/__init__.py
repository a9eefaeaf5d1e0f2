"""Lesson 07 · Memory is capacity: everything notebooks/07_memory_is_capacity.ipynb runs."""
