"""kvlab's version: the one place it is written (the package root, env and the command line read it here)."""
from __future__ import annotations

__version__ = "0.1.0"
