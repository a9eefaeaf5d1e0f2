"""Benchmarks run from the command line (``python -m kvlab bench ...``); each writes JSON with its environment."""
