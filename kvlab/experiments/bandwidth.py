"""Memory bandwidth, measured the way a decode step reads memory: the machine's, a matrix-vector product's, a step's products'.

A decode step of one sequence streams every weight once (the K/V it attends over as well), so its speed is read against
bandwidth: ``achieved_GBps`` = bytes a step must read / its time, next to what this machine reaches.
``machine_bandwidth`` measures that once (a sum, a copy, a matvec); ``MatvecProbe`` is cheap enough to measure again in
every round of a benchmark, since on a shared machine the bandwidth moves from minute to minute; ``StepProductsProbe``
times a step's weight products alone, so a step's time splits into streaming the weights and everything else. ``bench
decode``, ``bench step`` and the batch-scaling experiment all use them.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlab.device import now
from kvlab.model.decoder import Decoder
from kvlab.model.matvec import matvec


def weight_bytes_per_step(model: Decoder) -> int:
    """Weight bytes one decode step streams: all of them except tables it only looks a row up in."""
    looked_up = {"pos_embed"} | ({"embed"} if model.lm_head is not None else set())  # tied: embed is the lm_head
    return sum(p.nbytes for name, p in model.named_parameters() if name not in looked_up)


def best_seconds(fn, device: torch.device, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn``, after one untimed warm-up call."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = now(device)
        fn()
        times.append(now(device) - t0)
    return min(times)


class MatvecProbe:
    """The machine's matrix-vector bandwidth from memory, cheap enough to measure once per round (best of a few).

    The matrix is 256 MB, several times any CPU's last-level cache (and a GPU's L2), as the decoder's weights are: a
    decode step streams them all before it reads the first again (a 64 MB matrix came in part from a 32 MB L3, reading
    41-45 GB/s where 256 MB read 25-34). On a shared machine the bandwidth moves from minute to minute (33-56 GB/s for
    the same sum over an afternoon): hence once per round.
    """

    def __init__(self, device: torch.device, n: int = 8192) -> None:
        self.device = device
        # 256 MB stored [in, out], as the decoder stores its weights; ones fill it faster than randn, and a
        # product's speed does not depend on the values (no zeros skipped, no denormals)
        self.W = torch.ones(n, n, device=device)
        self.v = torch.randn(1, n, device=device)

    def measure(self, repeats: int = 5) -> dict:
        plain = self.W.nbytes / best_seconds(lambda: self.v @ self.W, self.device, repeats) / 1e9
        split = self.W.nbytes / best_seconds(lambda: matvec(self.v, self.W), self.device, repeats) / 1e9
        return {"matvec_GBps": max(plain, split), "matvec_plain_GBps": plain, "matvec_split_GBps": split}


class StepProductsProbe:
    """A decode step's weight products alone: the same matrices, one row each, in forward order, back to back.

    What a step made of nothing but its weight stream would take, with kvlab's own product (``kvlab.model.matvec``; a
    tied head through ``F.linear`` as the decoder does). Next to ``MatvecProbe`` it says how much of the machine's
    matvec bandwidth products of these smaller shapes reach.
    """

    def __init__(self, model: Decoder) -> None:
        tied = model.lm_head is None
        self.weights = [p for name, p in model.named_parameters()
                        if p.dim() == 2 and name not in ("embed", "pos_embed")]  # [in, out] matrices
        self.rows = [torch.randn(1, 1, w.shape[0], device=w.device, dtype=w.dtype) for w in self.weights]
        self.head = model.embed if tied else None  # (V, C), applied as F.linear like the decoder's tied head
        self.head_row = torch.randn(1, 1, model.config.hidden_size, device=model.device, dtype=model.dtype)
        self.nbytes = weight_bytes_per_step(model)
        self.device = model.device

    def _products(self) -> None:
        for x, w in zip(self.rows, self.weights):
            matvec(x, w)
        if self.head is not None:
            F.linear(self.head_row, self.head)

    def measure(self, repeats: int = 5) -> dict:
        with torch.inference_mode():
            seconds = best_seconds(self._products, self.device, repeats)
        return {"products_ms": seconds * 1e3, "products_GBps": self.nbytes / seconds / 1e9}


def machine_bandwidth(device: torch.device, megabytes: int = 512, repeats: int = 5) -> dict:
    """The machine's own memory bandwidth in GB/s (best of ``repeats``), measured the way decode reads memory."""
    n = megabytes * 2**20 // 4
    x = torch.rand(n, device=device)  # (n,) fp32, every page touched
    y = torch.zeros_like(x)
    nbytes = x.nbytes
    out: dict[str, float | str] = {"tensor_MB": megabytes,
           "sum_read_GBps": nbytes / best_seconds(lambda: x.sum(), device, repeats) / 1e9,
           "copy_GBps": 2 * nbytes / best_seconds(lambda: y.copy_(x), device, repeats) / 1e9}  # read + write
    del x, y  # free the 2 x 512 MB before the matvec matrix
    out.update(MatvecProbe(device).measure(repeats))
    out["note"] = ("sum: bytes read / time; copy: (read + write) / time into a preallocated tensor; "
                   "matvec: a (1, 8192) row times a 256 MB [in, out] matrix (several times the last-level "
                   "cache), bytes of the matrix / time, the faster of the plain product and the K-split one "
                   "kvlab's decoder uses (kvlab.model.matvec)")
    return out


__all__ = ["MatvecProbe", "StepProductsProbe", "best_seconds", "machine_bandwidth", "weight_bytes_per_step"]
