"""What a static cache's fixed shapes allow: one decode step compiled once by torch.compile, reused for every token.

``StaticCache.update`` hands back the filled prefix, so the keys attended over grow by one token
each step and a compiler sees a new shape every step. ``FixedShapeStaticCache`` writes the new
token into its slot with ``index_copy_`` at a position held in a tensor and attends over all
``max_len`` slots, masking the empty ones: token 1 and token 500 run with identical shapes, which
is what lets ``torch.compile`` (and CUDA graphs) build one program and replay it (gpt-fast's trick).

Compiling can take from seconds to minutes (inductor writes and builds C++ on CPU), so the
notebook calls ``try_compiled_decode(budget_s=...)``: the measurement runs in a child process that
is stopped when the budget runs out, and the answer is always a dict with a one-line ``message``,
never a traceback. ``python -m kvlab.experiments.static_compile`` runs the measurement and prints
the JSON.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import torch

from ..benchmarks.rounds import paired_ratio, rotated
from ..cache.static import FixedShapeStaticCache  # lives beside StaticCache; re-exported here
from ..generate import encode_prompt, generate, prefill
from ..model.decoder import Decoder
from ..model.matvec import prepare_compile
from ..threads import set_torch_threads


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


@torch.inference_mode()
def compiled_decode(model: Decoder, prompt: str | list[int], new_tokens: int = 32, mode: str | None = None,
                    backend: str = "inductor", rounds: int = 5) -> dict:
    """Greedy decoding three ways on the same prompt: dynamic cache (the reference), the fixed-shape
    static step run eagerly, and the same step compiled once by ``torch.compile``.

    After the compiling call, eager and compiled decode the prompt once per round, for ``rounds``
    rounds in alternating order (kvlab/benchmarks/rounds.py). ``speedup`` is the median over rounds of eager / compiled median
    step time *within* a round, with its min-max (``speedup_min``, ``speedup_max``): a busy spell
    slows both runs of a round alike. Returns the tokens' agreement, the median ms per decode step of
    each over all rounds, and the seconds the first compiled call took (tracing + code generation +
    building). Raises whatever torch.compile raises.
    ``backend="eager"`` traces the step without generating code (seconds, not minutes; no speed-up):
    the tests use it to check this function's bookkeeping.
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
    t0 = time.perf_counter()
    _decode_greedy(model, prompt_ids, 3, cache, compiled)  # the first call compiles
    compile_s = time.perf_counter() - t0
    steps = {"eager": step, "compiled": compiled}
    runs: dict[str, list[tuple[list[int], list[float]]]] = {name: [] for name in steps}  # (tokens, step seconds)
    for r in range(rounds):
        for name in rotated(list(steps), r):
            runs[name].append(_decode_greedy(model, prompt_ids, new_tokens, cache, steps[name]))
    ratio = paired_ratio([np.median(s) for _, s in runs["eager"]], [np.median(s) for _, s in runs["compiled"]])
    eager_ms = 1e3 * float(np.median([t for _, s in runs["eager"] for t in s]))
    compiled_ms = 1e3 * float(np.median([t for _, s in runs["compiled"] for t in s]))
    same = all(tokens == reference.tokens for name in runs for tokens, _ in runs[name])
    speedup, lo, hi = ratio["median"], ratio["min"], ratio["max"]
    return dict(status="compiled", new_tokens=new_tokens, prompt_tokens=len(prompt_ids), max_len=max_len,
                dynamic_tokens=reference.tokens, eager_tokens=runs["eager"][0][0],
                compiled_tokens=runs["compiled"][0][0], same_tokens=same,
                dynamic_ms=1e3 * float(np.median(reference.timeline.step_s[1:])),
                eager_ms=eager_ms, compiled_ms=compiled_ms, speedup=speedup, speedup_min=lo, speedup_max=hi,
                speedup_per_round=ratio["values"], rounds=rounds,
                compile_s=compile_s, backend=backend, torch=torch.__version__, device=str(model.device),
                threads=torch.get_num_threads(),
                message=f"compiled in {compile_s:.1f} s; one decode step: {eager_ms:.2f} ms eager, "
                        f"{compiled_ms:.2f} ms compiled; eager / compiled {speedup:.2f}x "
                        f"[min-max {lo:.2f}-{hi:.2f} over {rounds} paired rounds]")


def try_compiled_decode(budget_s: float = 30.0, pairs: int = 8, new_tokens: int = 32, threads: int = 1) -> dict:
    """``compiled_decode`` on the shipped recall model, in a child process stopped after ``budget_s``.

    Never raises: a compiler that is missing, fails or is too slow here comes back as
    ``{"status": "timeout" | "failed", "message": ...}``. ``threads`` torch threads in the child.
    """
    if budget_s <= 0:
        raise ValueError(f"budget_s must be positive (seconds the compile may take), got {budget_s!r}")
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1",  # no pool of compile workers left behind
               OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, "-m", "kvlab.experiments.static_compile", "--pairs", str(pairs),
           "--new", str(new_tokens), "--threads", str(threads)]
    start = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                             start_new_session=True)  # its own process group: stopped as one on timeout
    try:
        out, err = child.communicate(timeout=budget_s)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        child.communicate()
        return dict(status="timeout", seconds=time.perf_counter() - start,
                    message=f"torch.compile did not finish within the {budget_s:.0f} s budget on this machine "
                            "(on CPU, inductor generates and builds C++ code, which takes long on a few busy "
                            "cores); skipped. Raise budget_s, or try it on a GPU machine.")
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

    from ..tasks.recall import load_recall_model, make_examples

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


__all__ = ["FixedShapeStaticCache", "compiled_decode", "try_compiled_decode"]
