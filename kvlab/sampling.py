"""Token sampling: the next token from a step's logits, greedy or seeded with temperature, top-k and top-p.

One function, shared by single-sequence generation (``kvlab/generate.py``) and the serving
engine's executor (``kvlab/serving/executor.py``), so both pick tokens by the same rule.
"""
from __future__ import annotations

import torch


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Refuse sampling settings ``sample`` cannot use, naming the bad value (generate's and the engine's one check)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token from logits (B, V): greedy when temperature is 0, else seeded sampling. -> (B,)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[..., -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)  # (B, V)
        drop_sorted = cum - sorted_logits.softmax(dim=-1) >= top_p  # keep the smallest set reaching top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


__all__ = ["check_sampling", "sample"]
