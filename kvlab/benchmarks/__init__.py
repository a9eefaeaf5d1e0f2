"""Benchmarks run from the command line (``python -m kvlab bench ...``); each writes JSON with its environment."""
from __future__ import annotations

# Each module is one command (kvlab/cli.py's COMMANDS): import the one you run, nothing here.
__all__: list[str] = []
