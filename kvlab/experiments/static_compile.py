"""What a static cache's fixed shapes allow: one decode step compiled once by torch.compile, reused for every token.

``StaticCache.update`` hands back the filled prefix, so the keys attended over grow by one token each step and a
compiler sees a new shape every step. ``FixedShapeStaticCache`` writes the new token into its slot with ``index_copy_``
at a position held in a tensor and attends over all ``max_len`` slots, masking the empty ones: token 1 and token 500 run
with identical shapes, which is what lets ``torch.compile`` (and CUDA graphs) build one program and replay it
(gpt-fast's trick).

Compiling can take from seconds to minutes (inductor writes and builds C++ on CPU; on CUDA a cold context and Triton's
kernels), so the notebook calls ``try_compiled_decode()``: the measurement runs in a child process that is stopped when
the budget (``default_budget_s()``, per device) runs out, and the answer is always a dict with a one-line ``message``,
never a traceback. On CPU it is not started unless asked for with a ``budget_s``: a first compile there outlasts the
notebook. ``python -m kvlab.experiments.static_compile`` runs the measurement and prints the JSON.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

from kvlab.rounds import paired_ratio, rotated
from kvlab.cache.static import FixedShapeStaticCache  # lives beside StaticCache; re-exported here
from kvlab.device import pick_device
from kvlab.generate import encode_prompt, generate, prefill
from kvlab.model.decoder import Decoder
from kvlab.model.matvec import prepare_compile
from kvlab.threads import LESSON_THREADS, set_torch_threads


def _decode_greedy(model: Decoder, prompt_ids: list[int], new_tokens: int, cache: FixedShapeStaticCache,
                   step) -> tuple[list[int], list[float]]:
    """Greedy tokens through ``step(token (1, 1), positions (1, 1)) -> logits (1, 1, V)``; seconds per decode step."""
    cache.reset()
    logits = prefill(model, torch.tensor([prompt_ids], device=model.device), cache)  # (1, V)
    cache.sync()
    tokens, seconds = [int(logits.argmax(-1))], []
    for _ in range(new_tokens - 1):
        token = torch.tensor([[tokens[-1]]], device=model.device)  # (1, 1)
        t0 = time.perf_counter()
        logits = step(token, cache.position.view(1, 1))  # (1, 1, V)
        nxt = int(logits[0, -1].argmax())  # reading the token waits for the step to finish
        seconds.append(time.perf_counter() - t0)
        cache.advance()
        tokens.append(nxt)
    return tokens, seconds


def cuda_graph_reason(device: torch.device | str, mode: str | None, backend) -> str | None:
    """Why no CUDA graph will be captured for this device, mode and backend; None where one may be."""
    if torch.device(device).type != "cuda":
        return f"{torch.device(device).type}: CUDA graphs are CUDA only"
    if backend != "inductor":
        return f"not requested: backend={getattr(backend, '__name__', backend)}"
    from torch._inductor import list_mode_options

    if mode is None or not list_mode_options(mode).get("triton.cudagraphs"):
        return f"not requested: mode={mode}"  # "reduce-overhead" and "max-autotune" ask for them
    return None


def _graphs_recorded(device: torch.device) -> int | None:
    """CUDA graphs recorded so far by torch.compile's CUDA graph trees on ``device`` (None: not found here)."""
    try:
        from torch._inductor import cudagraph_trees

        index = device.index if device.index is not None else torch.cuda.current_device()
        manager = cudagraph_trees.get_manager(index, create_if_none_exists=False)
        nodes = [node for roots in (manager.roots if manager is not None else {}).values() for node in roots]
    except (ImportError, AttributeError, RuntimeError):  # another torch's internals
        return None
    count = 0
    while nodes:  # every recorded graph is a node of the tree: the roots and their children
        node = nodes.pop()
        count += 1
        nodes.extend(child for children in node.children.values() for child in children)
    return count


class _Messages(logging.Handler):
    """Keeps what a logger warns (here: inductor's reasons for skipping a CUDA graph)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class CudaGraphWatch:
    """Over a block of compiled calls: did torch.compile record a CUDA graph, and if not, why not.

    Skipping is silent unless one looks: inductor logs it on its "cudagraphs" logger and counts it in
    ``counters["inductor"]["cudagraph_skips"]``. ``result`` is "captured" or a short reason.
    """

    def __init__(self, device: torch.device | str, mode: str | None, backend) -> None:
        self.device, self.reason = torch.device(device), cuda_graph_reason(device, mode, backend)
        self.result = self.reason

    def __enter__(self) -> "CudaGraphWatch":
        if self.reason is None:
            from torch._dynamo.utils import counters
            from torch._inductor.cudagraph_utils import cudagraphs_log

            self._log, self._heard = cudagraphs_log, _Messages()
            self._log.addHandler(self._heard)
            self._counters = counters["inductor"]
            self._skips, self._graphs = self._counters["cudagraph_skips"], _graphs_recorded(self.device)
        return self

    def __exit__(self, *exc) -> None:
        if self.reason is not None:
            return
        self._log.removeHandler(self._heard)
        graphs, heard = _graphs_recorded(self.device), self._heard.messages
        if self._counters["cudagraph_skips"] > self._skips:
            self.result = f"skipped: {heard[0].splitlines()[0][:200] if heard else 'see torch cudagraphs log'}"
        elif graphs is None or self._graphs is None:
            self.result = f"unknown: no CUDA graph tree manager found in torch {torch.__version__}"
        elif graphs > self._graphs:
            self.result = "captured"
        else:
            self.result = "skipped: no CUDA graph was recorded (and torch logged no reason)"


@torch.inference_mode()
def compiled_decode(model: Decoder, prompt: str | list[int], new_tokens: int = 32, mode: str | None = None,
                    backend: str = "inductor", rounds: int = 5) -> dict:
    """Greedy decoding three ways on the same prompt: dynamic cache (the reference), the fixed-shape
    static step run eagerly, and the same step compiled once by ``torch.compile``.

    After the compiling call, eager and compiled decode the prompt once per round, for ``rounds`` rounds in alternating
    order (kvlab/rounds.py). ``speedup`` is the median over rounds of eager / compiled median step time *within* a round
    (a busy spell slows both runs of a round alike), with its min-max. ``compile_s``: the first compiled call (tracing +
    code generation + building); ``cuda_graph``: "captured" when a CUDA graph was recorded, else why not.
    ``backend="eager"`` traces the step without generating code (seconds, not minutes).
    """
    prompt_ids = encode_prompt(model, prompt)
    if new_tokens < 3:
        raise ValueError(f"new_tokens must be >= 3 to time decode steps after the compiling one, got {new_tokens}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1 (paired eager/compiled runs), got {rounds}")
    cfg = model.config
    max_len = len(prompt_ids) + new_tokens
    if max_len > cfg.max_position_embeddings:
        raise ValueError(f"prompt ({len(prompt_ids)}) + new_tokens ({new_tokens}) exceed the model's context of "
                         f"{cfg.max_position_embeddings}; use a shorter prompt or fewer new tokens")
    reference = generate(model, prompt_ids, cache="dynamic", max_new_tokens=new_tokens)
    cache = FixedShapeStaticCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, dtype=model.dtype,
                                  device=model.device, max_len=max_len)

    def step(token: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return model(token, cache, positions=positions, last_only=True)  # (1, 1, V)

    prepare_compile()  # the thread count is a constant of the program (kvlab/model/matvec.py)
    compiled = torch.compile(step, mode=mode, backend=backend, dynamic=False, fullgraph=False)
    with CudaGraphWatch(model.device, mode, backend) as graphs:
        t0 = time.perf_counter()
        _decode_greedy(model, prompt_ids, 3, cache, compiled)  # the first call compiles
        compile_s = time.perf_counter() - t0
        steps = {"eager": step, "compiled": compiled}
        runs: dict[str, list[tuple[list[int], list[float]]]] = {name: [] for name in steps}  # (tokens, step s)
        for r in range(rounds):
            for name in rotated(list(steps), r):
                runs[name].append(_decode_greedy(model, prompt_ids, new_tokens, cache, steps[name]))
    ratio = paired_ratio([np.median(s) for _, s in runs["eager"]], [np.median(s) for _, s in runs["compiled"]])
    eager_ms, compiled_ms = (1e3 * float(np.median([t for _, s in runs[name] for t in s])) for name in steps)
    same = all(tokens == reference.tokens for name in runs for tokens, _ in runs[name])
    speedup, lo, hi = ratio["median"], ratio["min"], ratio["max"]
    return dict(status="compiled", new_tokens=new_tokens, prompt_tokens=len(prompt_ids), max_len=max_len,
                dynamic_tokens=reference.tokens, eager_tokens=runs["eager"][0][0],
                compiled_tokens=runs["compiled"][0][0], same_tokens=same,
                dynamic_ms=1e3 * float(np.median(reference.timeline.step_s[1:])),
                eager_ms=eager_ms, compiled_ms=compiled_ms, speedup=speedup, speedup_min=lo, speedup_max=hi,
                speedup_per_round=ratio["values"], rounds=rounds,
                compile_s=compile_s, backend=backend, mode=mode, cuda_graph=graphs.result,
                torch=torch.__version__, device=str(model.device), threads=torch.get_num_threads(),
                message=f"compiled in {compile_s:.1f} s; one decode step: {eager_ms:.2f} ms eager, "
                        f"{compiled_ms:.2f} ms compiled; eager / compiled {speedup:.2f}x "
                        f"[min-max {lo:.2f}-{hi:.2f} over {rounds} paired rounds]")


COMPILE_BUDGET_S = {"cpu": None, "cuda": 120.0}  # seconds a first compile may take by default; None: not started


def default_budget_s(device: torch.device | str | None = None) -> float | None:
    """The compile budget for ``device`` (default: ``pick_device()``): 120 s on CUDA, where a cold CUDA context
    and Triton compiling its kernels take a while; None on CPU, where the compile starts only when asked for
    with a budget (inductor's C++ build on a few cores takes longer than the notebook's whole Run All)."""
    return COMPILE_BUDGET_S["cuda" if pick_device(device).type == "cuda" else "cpu"]


def not_started_message() -> str:
    """The one line ``try_compiled_decode()`` answers on CPU without a budget: why nothing ran, how to run it."""
    return ("torch.compile is not started on CPU in Run All: inductor generates and builds C++ code, and a first "
            "compile on a few cores takes longer than this whole notebook. Try it with "
            "try_compiled_decode(budget_s=120); a second run reuses the compile cache.")


def timeout_message(budget_s: float, device: torch.device | str | None = None) -> str:
    """The one line a compile that ran out of budget comes back with, naming what is slow on this device."""
    if pick_device(device).type == "cuda":
        why = ("on CUDA, the first compile starts the CUDA context and has Triton generate and build GPU "
               "kernels, which can take minutes on a small or shared GPU")
        hint = "Raise budget_s (a second run reuses the compile cache and is much faster)."
    else:
        why = "on CPU, inductor generates and builds C++ code, which takes long on a few busy cores"
        hint = "Raise budget_s, or try it on a GPU machine."
    return (f"torch.compile did not finish within the {budget_s:.0f} s budget on this machine ({why}); "
            f"skipped. {hint}")


def child_env(threads: int, device: torch.device | str | None = None) -> dict[str, str]:
    """The environment of the compiling child: ``threads`` OpenMP threads, and on CPU one compile thread (no
    pool of compile workers left behind). On CUDA inductor keeps its default: Triton's kernels compile in
    parallel worker processes."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if pick_device(device).type != "cuda":
        env["TORCHINDUCTOR_COMPILE_THREADS"] = "1"
    return env


def stop_process_tree(child: subprocess.Popen) -> None:
    """Stop the child and what it started: its process group where the OS has them (POSIX), else the child
    itself (``terminate`` where there is no SIGKILL, which on Windows is the same TerminateProcess); reap it."""
    killpg, sigkill = getattr(os, "killpg", None), getattr(signal, "SIGKILL", None)
    try:
        if killpg is not None and sigkill is not None:
            killpg(child.pid, sigkill)
        elif sigkill is not None:
            child.kill()
        else:
            child.terminate()
    except (ProcessLookupError, PermissionError):  # it ended on its own meanwhile
        pass
    try:
        child.communicate(timeout=30)
    except subprocess.TimeoutExpired:  # never hang the notebook on a child that will not stop
        pass


def try_compiled_decode(budget_s: float | None = None, pairs: int = 8, new_tokens: int = 32,
                        threads: int = LESSON_THREADS) -> dict:
    """``compiled_decode`` on the shipped recall model, in a child process stopped after ``budget_s``
    (default: ``default_budget_s()``).

    Never raises: a compiler that is missing, fails or is too slow here comes back as ``{"status": "timeout" | "failed"
    | "not started", "message": ...}``.
    """
    if budget_s is None:
        budget_s = default_budget_s()
        if budget_s is None:
            return dict(status="not started", seconds=0.0, message=not_started_message())
    if budget_s <= 0:
        raise ValueError(f"budget_s must be positive (seconds the compile may take), got {budget_s!r}")
    cmd = [sys.executable, "-m", "kvlab.experiments.static_compile", "--pairs", str(pairs),
           "--new", str(new_tokens), "--threads", str(threads)]
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env(threads),
                             start_new_session=hasattr(os, "killpg"))  # its own process group: stopped as one
    try:
        out, err = child.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        stop_process_tree(child)
        return dict(status="timeout", seconds=time.perf_counter() - start, message=timeout_message(budget_s))
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if child.returncode != 0 or not lines:
        last = next((line for line in reversed(err.strip().splitlines()) if line.strip()), "no message")
        return dict(status="failed", seconds=time.perf_counter() - start,
                    message=f"torch.compile does not work here ({last.strip()[:300]}); skipped. The eager "
                            "static cache works the same, only without the compiled step.")
    result = json.loads(lines[-1])
    result["seconds"] = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> int:
    import argparse

    from kvlab.experiments.recall import load_recall_model, make_examples

    parser = argparse.ArgumentParser(description="Compile a fixed-shape static-cache decode step; print JSON.")
    parser.add_argument("--pairs", type=int, default=8, help="recall pairs in the prompt (8 x pairs + 5 tokens)")
    parser.add_argument("--new", type=int, default=32, help="tokens to generate")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--mode", default=None, help="torch.compile mode (default: its default)")
    args = parser.parse_args(argv)
    set_torch_threads(args.threads)
    model = load_recall_model()
    prompt = make_examples(1, args.pairs, seed=0)[0].prompt_ids
    print(json.dumps(compiled_decode(model, prompt, new_tokens=args.new, mode=args.mode)))
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["COMPILE_BUDGET_S", "CudaGraphWatch", "FixedShapeStaticCache", "child_env", "compiled_decode",
           "cuda_graph_reason", "default_budget_s", "not_started_message", "stop_process_tree", "timeout_message",
           "try_compiled_decode"]
