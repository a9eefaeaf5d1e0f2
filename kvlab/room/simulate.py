"""A seeded room of simulated learners, to rehearse the room before the workshop (and to test it).

``simulated_room(30)`` is thirty learners' runs of notebooks 01, 02, 05, 06 and 09 on a workshop's mix
of machines (laptops, Colab CPUs, two Colab GPUs, Binder), as ``LearnerRun`` files a real ``share`` would
send. The numbers are made up but shaped like the course's: 01's late/early ratio near 2-3 on a CPU and
near 1 on a GPU (a tiny model's step there is launch-bound), 02's bytes equal to the formula everywhere,
the room's guesses log-normally spread around the truth, and a few planted misfits (one machine whose late tokens crawl,
one file from another kvlab version, one learner who ran 01 twice). Notebook 09's requests come from one
shared server simulated as 6 slots serving FIFO: the learners join one every 1.5 s, so the offered rate
climbs past what the server serves and the knee shows in the pooled service curve.
"""
from __future__ import annotations

import uuid

import numpy as np

from kvlab.room.record import LearnerRun

NAMES = ("Ada", "Alan", "Barbara", "Claude", "Dana", "Edsger", "Frances", "Grace", "Hedy", "Ivan", "Joan", "Ken",
         "Lynn", "Margaret", "Niklaus", "Olga", "Peter", "Quinn", "Radia", "Sophie", "Tim", "Ursula", "Vint",
         "Whitfield", "Xiao", "Yukihiro", "Zoe", "Anita", "Bjarne", "Carol")
# (device class, device, runtime, threads, cpu_count, speed: how fast a step runs relative to a laptop)
MACHINES = (
    ("cpu", "Apple M2", "local", 4, 8, 1.6), ("cpu", "Intel(R) Core(TM) i7-1165G7 @ 2.80GHz", "local", 4, 8, 1.0),
    ("cpu", "AMD Ryzen 7 5800U with Radeon Graphics", "local", 8, 16, 1.3),
    ("cpu", "Intel(R) Xeon(R) CPU @ 2.20GHz", "colab", 2, 2, 0.5),
    ("cpu", "Intel(R) Xeon(R) Gold 6248 CPU @ 2.50GHz", "binder", 1, 1, 0.35),
)
GPU = ("cuda", "Tesla T4", "colab", 2, 2, 3.0)
NOTEBOOKS = ("01_the_slowdown.ipynb", "02_kv_cache.ipynb", "05_batching.ipynb", "06_under_load.ipynb",
             "09_measure_a_real_server.ipynb")
T0 = 1_767_000_000.0  # the workshop's first request, unix seconds (fixed: the sample is deterministic)
QUESTIONS = {
    "01_the_slowdown.ipynb": ("Without a cache, how many times as long as the step of an early token will the step "
                              "of a late token take?", "×"),
    "02_kv_cache.ipynb": ("How many GiB of KV cache does Llama-2-7B (MHA) hold for one conversation of 4,096 tokens "
                          "in fp16?", "GiB"),
    "05_batching.ipynb": ("Mixed lengths: static batching needs how many times as many steps as continuous "
                          "batching?", "×"),
    "06_under_load.ipynb": ("The long prompts' knee, as a fraction of the short chats' knee (in requests per "
                            "second)?", "×"),
    "09_measure_a_real_server.ipynb": ("On loopback, the median of client TTFT (from sending) minus engine TTFT, "
                                       "request by request?", "ms"),
}


def _machine(i: int, rng) -> tuple:
    if i in (7, 21):
        return GPU
    return MACHINES[int(rng.integers(len(MACHINES)))] if i % 3 else MACHINES[i % 2]


def shared_server_requests(n_learners: int, seed: int = 0, rate: float = 0.8, duration_s: float = 25.0,
                           join_every_s: float = 1.5, slots: int = 6, max_waiting: int = 48,
                           output_tokens: int = 16) -> list[list]:
    """Per learner, (scheduled_s, admitted_s, first_token_s, finished_s, status, fail_reason), learner i
    joining at ``i * join_every_s`` after T0; one server of ``slots`` FIFO slots, a decode step slower the
    fuller it is, 429 beyond ``max_waiting`` waiting."""
    rng = np.random.default_rng([seed, 9])
    arrivals = []  # (absolute arrival s from T0, learner, scheduled_s)
    for i in range(n_learners):
        t = float(rng.exponential(1 / rate))
        while t < duration_s:
            arrivals.append((i * join_every_s + t, i, t))
            t += float(rng.exponential(1 / rate))
    arrivals.sort()
    free_at = [0.0] * slots  # when each slot frees up
    ends: list[float] = []  # finish times of admitted requests (to count waiting and running)
    out: list[list] = [[] for _ in range(n_learners)]
    for at, learner, scheduled in arrivals:
        running = sum(1 for f in free_at if f > at)
        waiting = sum(1 for s in ends if s > at) - running
        if waiting >= max_waiting:
            out[learner].append((scheduled, None, None, scheduled + 0.002, "failed", "http_429:queue_full"))
            continue
        k = int(np.argmin(free_at))
        start = max(at, free_at[k])
        busy = min(slots, 1 + sum(1 for f in free_at if f > start))
        tpot = 0.02 * (1 + 0.15 * busy)
        first = start + 0.06 + 0.01 * busy
        finish = first + (output_tokens - 1) * tpot
        free_at[k] = finish
        ends.append(finish)
        shift = scheduled - at
        out[learner].append((scheduled, start + shift, first + shift, finish + shift, "completed", None))
    return out


def simulated_room(n: int = 30, seed: int = 0) -> list[LearnerRun]:
    """``n`` learners (at most len(NAMES)) x five notebooks, plus one learner's second run of 01."""
    if not 1 <= n <= len(NAMES):
        raise ValueError(f"n={n}: the simulated room has 1 to {len(NAMES)} learners")
    rng = np.random.default_rng(seed)
    requests = shared_server_requests(n, seed)
    runs = []
    for i, name in enumerate(NAMES[:n]):
        device_class, device, runtime, threads, cpus, speed = _machine(i, rng)
        machine = {"device": device, "device_class": device_class, "cpu": device if device_class == "cpu"
                   else "Intel(R) Xeon(R) CPU @ 2.20GHz", "cpu_count": cpus, "torch_threads": threads,
                   "cuda_device": device if device_class == "cuda" else None, "machine": "arm64" if "Apple" in device
                   else "x86_64", "python": "3.11.9", "system": "Darwin" if "Apple" in device else "Linux",
                   "runtime": runtime, "versions": {"kvlab": "0.1.0", "torch": "2.4.1", "transformers": "4.46.0",
                                                    "numpy": "1.26.4", "pandas": "2.2.2"}}
        version = "0.2.0" if name == "Zoe" else "0.1.0"
        machine["versions"]["kvlab"] = version
        for j, notebook in enumerate(NOTEBOOKS):
            run = LearnerRun(name, notebook, machine=dict(machine), kvlab_version=version,
                             submission_id=uuid.UUID(bytes=rng.bytes(16)).hex,
                             created=f"2026-01-29T10:{10 * j + i // 6:02d}:{(7 * i) % 60:02d}+00:00")
            _fill(run, notebook, device_class, threads, speed, name, rng, requests[i], i)
            runs.append(run)
    if n >= 2:  # Alan runs 01 again, later: his second run supersedes the first in the view
        again = LearnerRun(NAMES[1], NOTEBOOKS[0], machine=dict(runs[5].machine), submission_id=uuid.UUID(
            bytes=rng.bytes(16)).hex, created="2026-01-29T11:30:00+00:00")
        _fill(again, NOTEBOOKS[0], "cpu", runs[5].machine["torch_threads"], 1.0, NAMES[1], rng, [], 1)
        runs.append(again)
    return runs


def _guess(truth: float, rng, spread: float = 0.8) -> float:
    return float(np.round(truth * np.exp(rng.normal(0.35, spread)), 2))  # the room guesses high, widely


def _fill(run: LearnerRun, notebook: str, device_class: str, threads: int, speed: float, name: str, rng,
          requests: list, i: int) -> None:
    question, unit = QUESTIONS[notebook]
    noise = float(np.exp(rng.normal(0, 0.08)))
    if notebook.startswith("01"):
        ratio = (1.05 if device_class == "cuda" else 2.6 * noise) * (3.0 if name == "Quinn" else 1.0)
        run.add_prediction(_guess(2.6, rng), round(ratio, 3), question=question, unit=unit)
        run.add_verdicts([{"claim": "uncached_tokens_slow_down", "holds": ratio > 1.2},
                          {"claim": "cached_steps_stay_flat", "holds": name != "Quinn"}])
        run.add_figure("late_early_ratio", round(ratio, 3))
    elif notebook.startswith("02"):
        run.add_prediction(_guess(2.0, rng, 1.2), 2.0, question=question, unit=unit)
        run.add_verdicts([{"claim": "dynamic_cache_allocates_the_formula", "holds": True},
                          {"claim": "cached_and_uncached_write_the_same_tokens", "holds": True}])
        run.add_figure("kv_bytes_measured", 196608.0).add_figure("kv_bytes_formula", 196608.0)
    elif notebook.startswith("05"):
        run.add_prediction(_guess(1.6, rng, 0.5), 1.6, question=question, unit=unit)
        gain = (1.2 + 0.25 * min(threads, 4)) * noise
        run.add_verdicts([{"claim": "exact_mixed_lengths_continuous_fewer_steps", "holds": True},
                          {"claim": "a_batched_step_costs_less_than_separate_steps", "holds": threads > 1 or i % 2}])
        run.add_figure("continuous_static_ratio", round(gain, 3))
    elif notebook.startswith("06"):
        fraction = 0.4 * noise
        run.add_prediction(_guess(0.4, rng, 0.6), round(fraction, 3), question=question, unit=unit)
        run.add_verdicts([{"claim": "long_traffic_bends_at_lower_rate", "holds": fraction < 0.8},
                          {"claim": "latency_climbs_and_refusals_start_past_the_knee", "holds": threads > 1}])
        run.add_figure("knee_short_rps", round(4.0 * speed * noise, 3))
        run.add_figure("knee_long_prompts_rps", round(4.0 * speed * fraction * noise, 3))
    else:
        diff_ms = 1.5 * noise / max(speed, 0.3) ** 0.5
        run.add_prediction(_guess(1.5, rng, 1.0), round(diff_ms, 3), question=question, unit=unit)
        run.add_verdicts([{"claim": "every_request_accounted_for", "holds": True}])
        run.add_figure("client_minus_engine_ttft_ms", round(diff_ms, 3))
        run.requests = [{"request_id": str(k), "prompt_tokens": 64, "max_new_tokens": 16,
                         "scheduled_s": round(s, 4), "sent_s": round(s + 0.001, 4),
                         "admitted_s": None if a is None else round(a, 4),
                         "first_token_s": None if f is None else round(f, 4), "finished_s": round(e, 4),
                         "status": status, "fail_reason": reason, "output_tokens": 16 if f is not None else 0}
                        for k, (s, a, f, e, status, reason) in enumerate(requests)]
        run.load = {"started_at": T0 + i * 1.5, "rate": 0.8, "profile": "short_short"}
