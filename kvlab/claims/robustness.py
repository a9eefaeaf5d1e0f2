"""How often each wall-clock claim holds: repeated runs with several seeds, on a quiet machine and under load.

A claim on measured time states a qualitative fact with a margin. Whether that margin is wide
enough is itself a measurement: this module re-runs each claim's example, quiet and with
CPU-bound processes competing for every core, and counts the runs in which the claim held.

    python scripts/claims_robustness.py --runs 5 --json results/claims_robustness.json

Each condition records the machine's load average before and after its runs: on a shared machine
"quiet" means only that this module started no competing processes.
"""
from __future__ import annotations

import inspect
import multiprocessing as mp
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Callable, Iterator

from .framework import CLAIMS, Claim


def _spin(stop_at: float) -> None:  # a CPU-bound competitor: pure Python arithmetic until told to stop
    x = 0
    while time.time() < stop_at:
        for i in range(10_000):
            x += i * i


@contextmanager
def competing_load(processes: int | None = None, max_s: float = 600.0) -> Iterator[int]:
    """CPU-bound processes, one per core by default, busy for the duration of the block (at most ``max_s``)."""
    n = processes or os.cpu_count() or 1
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_spin, args=(time.time() + max_s,), daemon=True) for _ in range(n)]
    for p in procs:
        p.start()
    try:
        yield n
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join(timeout=5)


def _fresh_example(c: Claim, seed: int):
    """Run the claim's example anew (bypassing any lru_cache), with ``seed`` when it takes one."""
    make: Callable = inspect.unwrap(c.example)
    try:
        takes_seed = "seed" in inspect.signature(make).parameters
    except (TypeError, ValueError):
        takes_seed = False
    return make(seed=seed) if takes_seed else make()


@dataclass
class HoldRate:
    claim: str
    notebook: str
    condition: str  # "quiet" or "loaded (N competing processes)"
    runs: int
    held: int
    unreadable: int
    seconds: float  # run time of the example, shared among the claims that read it
    load_before: float = float("nan")  # the machine's 1-minute load average before and after this condition's runs
    load_after: float = float("nan")  # (other users' programs count too: "quiet" is only as quiet as the machine)

    @property
    def rate(self) -> float:
        return self.held / self.runs if self.runs else float("nan")


def hold_rates(names: list[str] | None = None, runs: int = 3, loaded: bool = True,
               progress: Callable[[str], None] | None = None) -> list[HoldRate]:
    """For each wall-clock claim (or ``names``): runs with seeds 0..runs-1, quiet and (``loaded``) under load."""
    claims = ([CLAIMS[n] for n in names] if names
              else [c for c in CLAIMS.values() if c.clock == "wall" and c.asserts])  # observations cannot fail
    missing = [c.name for c in claims if c.example is None]
    if missing:
        raise ValueError(f"claims {missing} have no example to run; give them example=...")
    conditions = [("quiet", None)] + ([("loaded", os.cpu_count() or 1)] if loaded else [])
    by_example: dict = {}  # claims that read the same example share each fresh run of it
    for c in claims:
        by_example.setdefault(c.example, []).append(c)
    out = []
    for label, procs in conditions:
        with (competing_load(procs) if procs else _nothing()) as n:
            condition = f"loaded ({n} competing processes)" if procs else "quiet"
            load_before, first = load_average(), len(out)
            for group in by_example.values():
                start = time.perf_counter()
                held = {c.name: 0 for c in group}
                unreadable = {c.name: 0 for c in group}
                for seed in range(runs):
                    result = _fresh_example(group[0], seed)
                    for c in group:
                        v = c.on(result)
                        held[c.name] += v.holds is True
                        unreadable[c.name] += v.holds is None
                seconds = (time.perf_counter() - start) / len(group)
                for c in group:
                    out.append(HoldRate(c.name, c.notebook, condition, runs, held[c.name], unreadable[c.name],
                                        seconds))
                    if progress:
                        progress(f"{c.name} [{condition}]: held {held[c.name]}/{runs}")
            load_after = load_average()
            for r in out[first:]:
                r.load_before, r.load_after = load_before, load_after
            if progress:
                progress(f"[{condition}] load average {load_before:.2f} before, {load_after:.2f} after")
    return out


def load_average() -> float:
    """The machine's 1-minute load average (runnable processes, all users), NaN where the system has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return float("nan")


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def as_records(rates: list[HoldRate]) -> list[dict]:
    return [dict(asdict(r), rate=r.rate) for r in rates]
