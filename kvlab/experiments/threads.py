"""CPU threads for an experiment: ``torch_threads``, which lives in :mod:`kvlab.threads` (shared with serving).

Kept so lessons can write ``from kvlab.experiments.threads import torch_threads``; see
kvlab/threads.py for why the lessons default to one thread.
"""
from __future__ import annotations

from ..threads import torch_threads

__all__ = ["torch_threads"]
