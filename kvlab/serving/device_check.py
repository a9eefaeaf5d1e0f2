"""The start-up check of a GPU: does the device compute what the CPU computes, for every cache and the engine?

A lesson trusts the device ``kvlab.device.pick_device`` chose. When that is a GPU nobody has tried
kvlab on (a learner's Colab T4), the notebook's setup cell runs ``device_check`` first: a few greedy
tokens of one small seeded model for each cache mode, and one batch of the paged engine, on the
device and on the CPU. Any difference, or any error, and the course falls back to the CPU with one
line that says why (``kvlab.course.setup_report``), instead of teaching from wrong numbers.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field

import torch

from kvlab.generate import generate
from kvlab.model.config import tiny_llama
from kvlab.model.decoder import build_model
from kvlab.workload import make_workload
from kvlab.serving.config import EngineSpec
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import SchedulerConfig

# cache mode -> options: every strategy a lesson uses, with the sizes of this check
CHECK_MODES: dict[str, dict] = {
    "none": {}, "dynamic": {}, "static": {"max_len": 64}, "quantized": {"bits": 4, "residual": 4},
    "offloaded": {"max_len": 64},
}


@dataclass
class DeviceCheck:
    """What the check found: ``ok`` when every run matched the CPU's, else one line per problem."""

    device: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def line(self) -> str:
        """One line for the setup report."""
        if self.ok:
            return (f"checked {self.device} against the CPU ({len(CHECK_MODES)} caches and the paged engine "
                    f"gave the same tokens, {self.seconds:.1f} s)")
        return f"{self.device} did not compute what the CPU computes: {self.problems[0]}"


def _engine_tokens(model, requests) -> dict[int, list[int]]:
    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=64, max_model_len=128)))
    engine.run(requests, clock="wall")
    return {r.request_id: engine.sequences[r.request_id].output_token_ids for r in requests}


def device_check(device: torch.device | str, new_tokens: int = 8) -> DeviceCheck:
    """Greedy tokens per cache mode and one paged-engine batch on ``device``, compared with the CPU's.

    Never raises: an error on the device is a problem of the check (named with its type).
    """
    start = time.perf_counter()
    device = torch.device(device)
    problems: list[str] = []
    reference = build_model(tiny_llama(), seed=0, device="cpu")
    prompt = list(range(3, 19))  # 16 tokens
    requests = make_workload("short_short", 4, arrival="all_at_once", vocab_size=reference.config.vocab_size,
                             seed=1, max_context=96)
    try:
        model = copy.deepcopy(reference).to(device)  # the same weights, on the device
        for mode, options in CHECK_MODES.items():
            want = generate(reference, prompt, cache=mode, max_new_tokens=new_tokens, **options).tokens
            got = generate(model, prompt, cache=mode, max_new_tokens=new_tokens, **options).tokens
            if got != want:
                problems.append(f"the {mode} cache generated {got} on {device}, {want} on the CPU")
        want_by_id, got_by_id = _engine_tokens(reference, requests), _engine_tokens(model, requests)
        if got_by_id != want_by_id:
            differ = sorted(rid for rid in want_by_id if got_by_id.get(rid) != want_by_id[rid])
            problems.append(f"the paged engine's batch gave other tokens on {device} for requests {differ}")
    except Exception as exc:  # whatever the device raises is what the learner would have met in a lesson
        problems.append(f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    return DeviceCheck(str(device), not problems, problems, time.perf_counter() - start)
