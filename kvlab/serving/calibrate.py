"""Calibrate the cost model on this machine: time the real model executor on designed batch shapes, fit, validate.

``python -m kvlab calibrate [--config llama-30m|tiny] [--out PATH] [--repeats N] [--threads N] [--validate]``

Each designed shape (prompt chunks of several sizes, decode batches of several sizes over short and long contexts, and
mixes of both) is built as real ``Sequence``s with block tables in a paged pool and run through
``ModelExecutor.execute``, exactly as the engine runs a step. Shapes are timed in passes (one warm-up pass, then
``repeats`` passes: by default as many as fit in ``--budget`` seconds; median per shape), each pass in a new random
order, so a moment of contention on a shared machine lands on random shapes rather than always on the same ones. The fit
(``cost_model.fit_coefficients``) is saved as JSON with the config, settings, machine and per-shape residuals.

``--validate`` also times ``validation_shapes``, none used for the fit, in the same passes, and reports the median
absolute percentage error of the predictions for them.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from kvlab.clocks import RequestRecord
from kvlab.model.config import PRESETS, ModelConfig, preset
from kvlab.model.decoder import Decoder, build_model
from kvlab.results_io import write_json
from kvlab.threads import LESSON_THREADS, torch_threads
from kvlab.serving.cost_model import FEATURES, CostModel, calibration_path, features, fit_coefficients, median_ape
from kvlab.serving.config import SERVE_SPEC, EngineSpec
from kvlab.serving.block_manager import BlockManager
from kvlab.serving.executor import ModelExecutor
from kvlab.serving.scheduler import SchedulerOutput
from kvlab.serving.sequence import SamplingParams, Sequence

MIN_REPEATS, MAX_REPEATS = 3, 50


@dataclass(frozen=True)
class BatchShape:
    """One step to time: prompt chunks ``(new tokens, context after the chunk)`` and decodes (context after)."""

    prefill: tuple[tuple[int, int], ...] = ()
    decode: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.prefill and not self.decode:
            raise ValueError("a BatchShape needs at least one prompt chunk or one decode")
        for n, ctx in self.prefill:
            if not 1 <= n <= ctx:
                raise ValueError(f"prompt chunk of {n} tokens ending at context {ctx}: need 1 <= tokens <= context")
        if any(ctx < 2 for ctx in self.decode):
            raise ValueError(f"a decode needs a context of >= 2 tokens (a prompt and one output), got {self.decode}")

    def rows(self) -> list[tuple[int, int, bool]]:
        return [(n, ctx, False) for n, ctx in self.prefill] + [(1, ctx, True) for ctx in self.decode]

    @property
    def label(self) -> str:
        parts = [f"prefill {n}@{ctx}" for n, ctx in self.prefill]
        if self.decode:
            lo, hi = min(self.decode), max(self.decode)
            parts.append(f"decode {len(self.decode)}x@{lo}" + (f"-{hi}" if hi != lo else ""))
        return " + ".join(parts)


def _uneven(batch: int, lo: int, hi: int, seed: int) -> tuple[int, ...]:
    return tuple(int(x) for x in np.random.default_rng(seed).integers(lo, hi + 1, size=batch))


def design_shapes(max_context: int = 1024) -> list[BatchShape]:
    """The calibration set: whole prompts, continued chunks, decode batches, and mixes of both.

    Sizes span what the engine schedules with its defaults (chunks up to 512 tokens, up to 32
    sequences, contexts up to ``max_context``).
    """
    L = max_context
    shapes = [BatchShape(prefill=((n, n),)) for n in (8, 32, 128, 256, 512) if n <= L]
    shapes += [BatchShape(prefill=((n, ctx),)) for n, ctx in ((128, L // 2), (256, L * 3 // 4), (64, L))]
    shapes += [BatchShape(prefill=((64, 64),) * 4), BatchShape(prefill=((256, 256),) * 2),
               BatchShape(prefill=((16, 16),) * 8)]
    for batch in (1, 2, 4, 8, 16, 32):
        for ctx in (32, L // 4, L // 2, L):
            if batch * ctx <= 16 * L:
                shapes.append(BatchShape(decode=(ctx,) * batch))
    shapes += [BatchShape(prefill=((n, ctx),), decode=(L // 4,) * b)
               for b, (n, ctx) in ((4, (128, 128)), (16, (128, 128)), (4, (256, L // 2)), (16, (256, L // 2)))]
    shapes.append(BatchShape(decode=_uneven(16, 16, L, seed=1)))
    return shapes


def validation_shapes(max_context: int = 1024) -> list[BatchShape]:
    """Shapes none of which is in ``design_shapes``: other sizes, other contexts, uneven mixes."""
    L = max_context
    shapes = [BatchShape(decode=(ctx,) * b) for b in (3, 6, 12, 24) for ctx in (L // 8, L * 5 // 8)
              if b * ctx <= 16 * L]
    shapes += [BatchShape(prefill=((96, 96),)), BatchShape(prefill=((384, 384),)),
               BatchShape(prefill=((200, L * 3 // 4),)), BatchShape(prefill=((100, 100),) * 3)]
    shapes += [BatchShape(prefill=((192, 192),), decode=(L * 3 // 8,) * 6),
               BatchShape(prefill=((64, L // 4),), decode=_uneven(12, 50, L * 7 // 8, seed=2)),
               BatchShape(prefill=((32, 32),), decode=(L // 10,) * 24),
               BatchShape(decode=_uneven(8, 16, L * 7 // 8, seed=3)),
               BatchShape(prefill=((300, 300), (40, 40)), decode=(L // 3,) * 10)]
    return shapes


def _scheduler_output(shape: BatchShape, spec: EngineSpec, free_blocks: list[int], vocab: int) -> SchedulerOutput:
    """Real Sequences with block tables in ``spec``'s blocks for ``shape``: what the scheduler hands the executor."""
    out = SchedulerOutput(step=0)
    sampling = SamplingParams()
    for i, (n, ctx, is_decode) in enumerate(shape.rows()):
        prompt_len = ctx - 1 if is_decode else ctx
        prompt = [(7 * i + 13 * j) % vocab for j in range(prompt_len)]
        seq = Sequence(i, prompt, max_new_tokens=1 << 20, sampling=sampling,
                       record=RequestRecord(i, prompt_len, 1 << 20, scheduled_s=0.0), arrival_s=0.0)
        if is_decode:
            seq.append_token(1)  # one output token so far: the next step decodes it
        seq.num_computed_tokens = ctx - n
        need = -(-ctx // spec.block_size)
        if need > len(free_blocks):
            raise ValueError(f"shape {shape.label} needs {need} more blocks than the pool has; make the pool larger")
        seq.block_table = [free_blocks.pop() for _ in range(need)]
        out.seqs.append(seq)
        out.num_new_tokens.append(n)
        out.do_sample.append(True)
    return out


def measure_step_times(model: Decoder, shapes: list[BatchShape], repeats: int | None = None,
                       spec: EngineSpec = SERVE_SPEC, threads: int | None = LESSON_THREADS, seed: int = 0,
                       budget_s: float = 20.0, progress=None) -> pd.DataFrame:
    """Time ``ModelExecutor.execute`` on every shape, over ``spec``'s blocks: one row per shape with its features
    and median time.

    Blocks are drawn in a seeded random order from a pool big enough for the largest shape, so sequences are scattered
    through memory as in a running engine. Columns: shape, every feature of FEATURES, measured_s (median of
    ``repeats``), min_s, max_s, repeats. With ``repeats=None`` the passes are as many as fit in about ``budget_s``
    seconds (between MIN_REPEATS and MAX_REPEATS): a tiny model's millisecond steps need many samples to see through a
    busy machine, a larger model's need few.
    """
    if repeats is not None and (not isinstance(repeats, int) or repeats < 1):
        raise ValueError(f"repeats must be an integer >= 1 or None (as many as fit in budget_s), got {repeats!r}")
    if not shapes:
        raise ValueError("no shapes to measure")
    context = model.config.max_position_embeddings
    too_long = [s.label for s in shapes if max(ctx for _, ctx, _ in s.rows()) > context]
    if too_long:
        raise ValueError(f"shapes {too_long} exceed the model's context of {context} positions")
    block_size = spec.block_size
    num_blocks = max(sum(-(-ctx // block_size) for _, ctx, _ in s.rows()) for s in shapes)
    executor = ModelExecutor(model)
    executor.initialize_cache(BlockManager(num_blocks, block_size))
    rng = np.random.default_rng(seed)
    outs = [_scheduler_output(s, spec, rng.permutation(num_blocks).tolist(), model.config.vocab_size)
            for s in shapes]
    times: list[list[float]] = [[] for _ in shapes]
    with torch_threads(threads):
        t0 = time.perf_counter()
        for out in outs:  # a warm-up pass (allocator, caches), not recorded; it also sizes `repeats`
            executor.execute(out)
        if repeats is None:
            repeats = int(min(MAX_REPEATS, max(MIN_REPEATS, budget_s // max(time.perf_counter() - t0, 1e-9))))
        passes = range(repeats)
        passes = progress(passes, total=repeats, desc="timing shapes", unit="pass") if progress else passes
        for _ in passes:  # each pass in a fresh seeded order: a busy spell on the machine lands on random shapes
            for i in rng.permutation(len(outs)):
                times[i].append(executor.execute(outs[i]).duration_s)
    return pd.DataFrame([{"shape": shape.label, **dict(zip(FEATURES, features(shape.rows(), block_size))),
                          "measured_s": float(np.median(ts)), "min_s": min(ts), "max_s": max(ts), "repeats": len(ts)}
                         for shape, ts in zip(shapes, times)])


def fit_cost_model(measured: pd.DataFrame, model: Decoder, settings: dict) -> CostModel:
    """Fit the coefficients to ``measure_step_times``'s frame; keep the residuals and the machine."""
    from kvlab.env import environment

    X = measured[list(FEATURES)].to_numpy(dtype=float)
    y = measured["measured_s"].to_numpy(dtype=float)
    coef = fit_coefficients(X, y)
    predicted = X @ coef
    residuals = [{"shape": s, "measured_s": float(m), "predicted_s": float(p), "error": float((p - m) / m)}
                 for s, m, p in zip(measured["shape"], y, predicted)]
    weights = model.weight_bytes()
    fit = {"method": "least squares on relative error, coefficients >= 0", "n_shapes": len(y),
           "median_ape": median_ape(y, predicted), "max_ape": float(np.max(np.abs(predicted - y) / y)),
           "weight_bytes": weights,
           # if the per-step cost were all weight streaming, this would be the bandwidth reached:
           "step_cost_as_weight_GBps": weights / coef[0] / 1e9 if coef[0] > 0 else None,
           "residuals": residuals}
    return CostModel(coefficients=dict(zip(FEATURES, map(float, coef))), config=model.config.to_dict(),
                     settings=settings, environment=environment(), fit=fit)


def _model_for(config: ModelConfig | Decoder | str, seed: int = 0) -> Decoder:
    if isinstance(config, Decoder):
        return config
    if isinstance(config, str):
        config = preset(config)  # raises for an unknown name, naming the presets
    if not isinstance(config, ModelConfig):
        raise TypeError(f"calibrate takes a Decoder, a ModelConfig or a config name, got {type(config).__name__}")
    return build_model(config, seed=seed)  # random weights: a step's time does not depend on their values


def calibrate(model: Decoder | ModelConfig | str = "llama-30m", repeats: int | None = None, threads: int | None = LESSON_THREADS,
              spec: EngineSpec = SERVE_SPEC, shapes: list[BatchShape] | None = None, budget_s: float = 20.0,
              validate: bool = False, progress=None) -> CostModel:
    """Measure ``model``'s executor on ``design_shapes`` over ``spec``'s blocks and fit a CostModel (not saved:
    call ``.save``).

    With ``validate`` the ``validation_shapes`` are timed in the same round-robin passes (so a
    change of load on the machine hits both sets alike), left out of the fit, and their
    measured vs predicted times stored in ``cost_model.fit["validation"]``.
    """
    model = _model_for(model)
    max_context = min(model.config.max_position_embeddings, 1024)
    shapes = design_shapes(max_context) if shapes is None else shapes
    held_out = validation_shapes(max_context) if validate else []
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with torch_threads(threads) as used:
        measured = measure_step_times(model, shapes + held_out, repeats, spec, threads=None,
                                      budget_s=budget_s, progress=progress)
        settings = {"block_size": spec.block_size, "threads": used, "repeats": int(measured["repeats"].min()),
                    "dtype": str(model.dtype), "device": str(model.device), "max_context": max_context,
                    "executor": "ModelExecutor",
                    # other programs on the machine slow every step: the 1-minute load average, before and after
                    "load_average_1m": [load_before, os.getloadavg()[0] if hasattr(os, "getloadavg") else None]}
        cm = fit_cost_model(measured.iloc[:len(shapes)], model, settings)
    if validate:
        frame = measured.iloc[len(shapes):].reset_index(drop=True)
        frame["predicted_s"] = [cm.predict_rows(s.rows()) for s in held_out]
        frame["error"] = (frame["predicted_s"] - frame["measured_s"]) / frame["measured_s"]
        cm.fit["validation"] = {"median_ape": float(frame["error"].abs().median()), "n_shapes": len(frame),
                                "timed": "in the same passes as the calibration shapes",
                                "rows": frame[["shape", "measured_s", "predicted_s", "error"]].to_dict("records")}
    return cm


def validate_cost_model(cost_model: CostModel, model: Decoder | None = None, shapes: list[BatchShape] | None = None,
                        repeats: int | None = None, threads: int | None = None, budget_s: float = 20.0,
                        progress=None) -> pd.DataFrame:
    """Measured vs predicted step times on shapes the fit never saw: one row per shape.

    ``model`` defaults to a fresh model of the cost model's config; ``threads`` to the count it
    was calibrated with. Columns: shape, features, measured_s, predicted_s, error (signed,
    relative), ape (absolute). ``frame.attrs["median_ape"]`` is the headline figure.
    """
    if model is None:
        model = build_model(ModelConfig(**cost_model.config), seed=0)
    if model.config.name != cost_model.config_name:
        raise ValueError(f"the cost model was fitted on {cost_model.config_name!r} but the model is "
                         f"{model.config.name!r}; calibrate this model first")
    threads = cost_model.settings.get("threads") if threads is None else threads
    max_context = min(model.config.max_position_embeddings, 1024)
    shapes = validation_shapes(max_context) if shapes is None else shapes
    frame = measure_step_times(model, shapes, repeats, SERVE_SPEC.replace(block_size=cost_model.block_size), threads,
                               seed=1, budget_s=budget_s, progress=progress)
    frame["predicted_s"] = [cost_model.predict_rows(s.rows()) for s in shapes]
    frame["error"] = (frame["predicted_s"] - frame["measured_s"]) / frame["measured_s"]
    frame["ape"] = frame["error"].abs()
    frame.attrs.update(median_ape=float(frame["ape"].median()), config=cost_model.config_name, threads=threads,
                       repeats=int(frame["repeats"].min()))
    return frame


# -- the command line --------------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", choices=sorted(PRESETS), default="llama-30m",
                        help="model config to calibrate (default llama-30m)")
    parser.add_argument("--out", type=Path, metavar="PATH",
                        help="where to save the fit (default: the calibration shipped inside kvlab, kvlab/data/calibration/<config name>.json, which load_calibration reads)")
    parser.add_argument("--repeats", type=int, help="timed passes over the shapes (default: as many as fit in "
                        "--budget seconds, 3 to 50)")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds of timing per shape set (default 20)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads, as the engine will run (default 1; see kvlab/threads.py)")
    parser.add_argument("--block-size", type=int, default=SERVE_SPEC.block_size,
                        help=f"KV block size in tokens (default {SERVE_SPEC.block_size})")
    parser.add_argument("--validate", action="store_true",
                        help="also time shapes not used in the fit and report the prediction error")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the validation table as JSON here")


def main(args: argparse.Namespace) -> int:
    spec = SERVE_SPEC.replace(block_size=args.block_size)  # checked before the model is built
    model = _model_for(args.config)
    out = args.out or calibration_path(model.config.name)
    check_writable(out, "--out")  # before minutes of timing, not after
    if args.json:
        check_writable(args.json, "--json")
    print(f"calibrating {model.config.name} ({model.num_parameters() / 1e6:.1f}M parameters) on "
          f"{len(design_shapes(min(model.config.max_position_embeddings, 1024)))} shapes, "
          f"{args.threads} thread(s)", file=sys.stderr)
    t0 = time.perf_counter()
    cm = calibrate(model, repeats=args.repeats, threads=args.threads, spec=spec,
                   budget_s=args.budget, validate=args.validate)
    cm.settings["calibration_s"] = time.perf_counter() - t0
    cm.save(out)
    print(cm.describe())
    print(f"saved {out.name} in {out.parent.name}/ ({cm.settings['calibration_s']:.1f} s)")
    if args.validate:
        v = cm.fit["validation"]
        frame = pd.DataFrame(v["rows"])
        print(frame.to_string(index=False, formatters={"measured_s": "{:.4f}".format,
                                                       "predicted_s": "{:.4f}".format, "error": "{:+.1%}".format}))
        mape = v["median_ape"]
        print(f"validation on {len(frame)} shapes not used in the fit (timed in the same passes): median absolute "
              f"error {mape:.1%} ({'within' if mape <= 0.20 else 'OUTSIDE'} the 20% goal)")
        if args.json:
            from kvlab.env import environment

            write_json(args.json, {"benchmark": "cost_model_validation", "config": model.config.name, "median_ape": mape,
                                   "rows": v["rows"], "coefficients": cm.coefficients, "settings": cm.settings,
                                   "env": environment()})
    return 0


def check_writable(path: Path, flag: str) -> None:
    """Refuse, before any timing, a file that could not be written: its folder missing or read-only."""
    folder = path.parent  # Path("fit.json").parent is Path(".")
    if not folder.is_dir():
        raise SystemExit(f"cannot save to {path}: the folder {folder} does not exist; create it or pass another {flag}")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise SystemExit(f"cannot save to {path}: not writable here (an installed kvlab's own data folder usually "
                         f"is not); pass {flag} PATH to save the calibration elsewhere")


__all__ = ["BatchShape", "calibrate", "design_shapes", "fit_cost_model", "measure_step_times", "validate_cost_model",
           "validation_shapes"]
