"""transformers' side of `bench decode`: its caches as modes, its generate timed per step, its compiled fast path.

The same weights as kvlab's decoder (``to_transformers``), timed the way kvlab's timeline times kvlab: a forward
pre-hook stamps the start of the prefill and a LogitsProcessor stamps the time each step's logits arrive. Its documented
fast path (``generation_config.cache_implementation = "static"`` and ``model.forward = torch.compile(model.forward,
...)``) is compiled the way kvlab's decode step is.
"""
from __future__ import annotations

import torch

from kvlab.experiments.transformers_steps import installed, timed_generate, transformers_cache_bytes
from kvlab.model.decoder import Decoder
from kvlab.model.loading import to_transformers
from kvlab.benchmarks.decode_runs import Mode, Run, kv_tokens_read

TRANSFORMERS_CACHES = ("dynamic", "static", "quantized", "offloaded")


def transformers_modes(device: torch.device, names: list[str], compile_: bool) -> list[Mode]:
    modes = []
    for name in (n for n in TRANSFORMERS_CACHES if n in names):
        options, reason = {}, None
        if name == "quantized":
            backend = "quanto" if installed("optimum.quanto") else "HQQ" if installed("hqq") else None
            if backend is None:
                reason = "transformers' quantized cache needs optimum-quanto or hqq; neither is installed"
            options = {"backend": backend, "nbits": 4}
        if name == "offloaded" and device.type != "cuda":
            reason = ("transformers' offloaded cache needs CUDA (it copies on CUDA streams); "
                      f"this run is on {device.type}")
        modes.append(Mode("transformers", name, options, reason))
    if compile_ and "static" in names:
        modes.append(Mode("transformers", "static", {}, None, compiled=True))
    return modes


def compiled_transformers(model: Decoder, backend: str):
    """transformers' documented fast path on the same weights: a static cache and a compiled forward."""
    hf = to_transformers(model).to(model.device).eval()
    hf.generation_config.cache_implementation = "static"
    hf.forward = torch.compile(hf.forward, backend=backend, dynamic=False)  # as kvlab's step: fixed shapes
    return hf


def run_transformers(hf, prompt: list[int], mode: Mode, new: int, device: torch.device, kv_per_token: int) -> Run:
    # timed as kvlab's timeline times kvlab (kvlab.experiments.transformers_steps)
    config = dict(mode.options) if mode.cache == "quantized" else None
    run = timed_generate(hf, prompt, new, device, cache_implementation=mode.cache, cache_config=config)
    return Run(run.wall_s, run.step_s, run.tokens, transformers_cache_bytes(run.cache),
               kv_per_token * kv_tokens_read(mode, len(prompt), new))


__all__ = ["TRANSFORMERS_CACHES", "compiled_transformers", "installed", "run_transformers", "transformers_cache_bytes", "transformers_modes"]
