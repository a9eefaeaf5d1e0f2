"""Token sampling: the next token from a step's logits, greedy or seeded with temperature, top-k and top-p.

One function, shared by single-sequence generation (``kvlab/generate.py``) and the serving
engine's executor (``kvlab/serving/executor.py``), so both pick tokens by the same rule.

A temperature above 0 but below ``MIN_TEMPERATURE`` is raised to it, as vLLM does (its ``_MAX_TEMP = 1e-2`` in
``vllm/sampling_params.py``, with a warning): ``logits / 1e-38`` overflows to inf, softmax turns inf - inf into NaN,
and ``torch.multinomial`` raises. At 0.01 the distribution is already all but greedy. A row whose logits are not finite
cannot be sampled at all: ``sample`` refuses it with ``NonFiniteLogits``, naming the row, so a server can fail that one
request and go on with the rest of its batch.
"""
from __future__ import annotations

import torch

MIN_TEMPERATURE = 1e-2  # vLLM's floor (_MAX_TEMP): below it, dividing float logits by the temperature overflows


class NonFiniteLogits(ValueError):
    """Logits (or the probabilities made from them) hold NaN or inf; ``rows`` are the bad rows of the batch."""

    def __init__(self, rows: list[int], what: str = "logits") -> None:
        super().__init__(f"the model's {what} are not finite (NaN or inf) in row(s) {rows}; no token can be "
                         "sampled from them")
        self.rows = rows


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Refuse sampling settings ``sample`` cannot use, naming the bad value (generate's and the engine's one check)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def effective_temperature(temperature: float) -> float:
    """The temperature ``sample`` divides by: 0 stays 0 (greedy), (0, MIN_TEMPERATURE) is raised to the floor."""
    return temperature if temperature == 0.0 else max(temperature, MIN_TEMPERATURE)


def nonfinite_rows(x: torch.Tensor) -> list[int]:
    """Indices of the rows of ``x`` (B, V) holding a NaN or an inf (one device sync)."""
    return (~torch.isfinite(x).all(dim=-1)).nonzero().flatten().tolist()


def sample(logits: torch.Tensor, temperature: float = 0.0, top_k: int | None = None,
           top_p: float | None = None, generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token from logits (B, V): greedy when temperature is 0, else seeded sampling. -> (B,).

    Sampling raises ``NonFiniteLogits`` for a row whose probabilities hold NaN or inf (NaN or
    inf logits): nothing can be drawn from it. Greedy rows are not checked here (argmax needs no
    sync); the engine's executor checks every row of its batch at once.
    """
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    logits = logits.float() / effective_temperature(temperature)
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
    bad = nonfinite_rows(probs)
    if bad:
        raise NonFiniteLogits(bad, "probabilities (NaN or inf logits)")
    return torch.multinomial(probs.cpu(), 1, generator=generator).squeeze(-1).to(logits.device)


__all__ = ["MIN_TEMPERATURE", "NonFiniteLogits", "check_sampling", "effective_temperature", "nonfinite_rows",
           "sample"]
