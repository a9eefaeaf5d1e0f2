"""Tasks with exactly checkable answers, so a cache's effect on quality can be measured."""
from __future__ import annotations

from .recall import RecallExample, RecallScore, load_recall_model, make_examples, score, training_batch

__all__ = ["RecallExample", "RecallScore", "load_recall_model", "make_examples", "score", "training_batch"]
