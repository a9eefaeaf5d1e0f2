"""Lesson 09 · Measure a real server: everything notebooks/09_measure_a_real_server.ipynb runs."""
