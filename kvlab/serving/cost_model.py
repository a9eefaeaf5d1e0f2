"""Cost model: a step's time predicted from its shape, fitted to this machine, and an executor that uses it.

A step of the real model executor costs, roughly,

    t = c_step                                  per step: streaming every weight once, launching every op
      + c_prefill_token  x prompt tokens         rows of every matrix product
      + c_attn_call      x attention calls       per layer: one per prompt chunk, one per decode attended
                                                 alone, one for the decodes attended together
      + c_decode_seq     x decoding sequences    rows of every matrix product, sampling per sequence
      + c_decode_kv      x KV slots read by decodes
      + c_prefill_attn   x prompt query-key pairs  (the quadratic part of attending over a prompt)

``kvlab.serving.calibrate`` measures ``ModelExecutor`` on designed batch shapes and fits the six
coefficients by least squares (on relative error, none negative). ``CostModelExecutor`` then
prices every ``SchedulerOutput`` without any model, so an ``Engine`` on ``clock="virtual"``
simulates thousands of requests in seconds, on a clock calibrated to the machine it was fitted on.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from kvlab.cache.paged import DECODE_BATCH_MAX_SLOTS
from kvlab.data import CALIBRATION, data_path
from kvlab.results_io import write_json
from kvlab.serving.config import SERVE_SPEC
from kvlab.serving.block_manager import BlockManager
from kvlab.serving.executor import Executor, StepResult
from kvlab.serving.scheduler import SchedulerOutput

FEATURES = ("step", "prefill_tokens", "attention_calls", "decode_seqs", "decode_kv_slots", "prefill_attention")
FEATURE_UNITS = {"step": "step", "prefill_tokens": "token", "attention_calls": "call", "decode_seqs": "sequence",
                 "decode_kv_slots": "KV slot", "prefill_attention": "query-key pair"}
CALIBRATION_DIR = data_path(CALIBRATION)  # kvlab/data/calibration, shipped inside the package
Row = tuple[int, int, bool]  # (new tokens, context after the step, is a decode)


def rows_of(out: SchedulerOutput) -> list[Row]:
    """(new tokens, context after the step, is_decode) for every sequence of a scheduled step."""
    return [(n, s.num_computed_tokens + n, s.is_decoding and n == 1) for s, n in zip(out.seqs, out.num_new_tokens)]


def decode_attention(num_decodes: int, padded_slots: int, own_slots: int) -> tuple[int, int]:
    """(attention calls, KV slots read) of a step's decodes, as ``PagedKVCache.attend`` runs them.

    While the padded gather (``padded_slots``: decodes x the longest context, in whole blocks) is at most
    DECODE_BATCH_MAX_SLOTS, the decodes are attended together in one call reading it. Beyond it, one call per
    decode, each reading its own blocks (``own_slots`` in all).
    """
    if num_decodes and padded_slots <= DECODE_BATCH_MAX_SLOTS:
        return 1, padded_slots
    return num_decodes, own_slots


def features(rows: Iterable[Row], block_size: int) -> np.ndarray:
    """The feature vector (in FEATURES order) of a step made of ``rows``."""
    pt = ps = ds = longest = blocks = pairs = 0
    for n, ctx, is_decode in rows:
        if is_decode:
            ds, longest, blocks = ds + 1, max(longest, ctx), blocks - (-ctx // block_size)
        else:
            # n queries at positions ctx-n .. ctx-1, each over the keys up to itself: n*ctx - n(n-1)/2 pairs
            pt, ps, pairs = pt + n, ps + 1, pairs + n * ctx - n * (n - 1) // 2
    calls, slots = decode_attention(ds, ds * -(-longest // block_size) * block_size, blocks * block_size)
    return np.array([1.0, pt, ps + calls, ds, slots, pairs], dtype=float)


def fit_coefficients(X: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares on *relative* error with no negative coefficient.

    Each row is divided by its measured time, so a 5 ms step counts as much as a 500 ms one (the goal is a small
    percentage error everywhere). A coefficient that comes out negative would mean more work takes less time; it is set
    to 0 and the rest refitted (an active-set method: a few rounds at most for six features).
    """
    X, y = np.asarray(X, dtype=float), np.asarray(y, dtype=float)
    if X.ndim != 2 or X.shape[0] != y.shape[0] or X.shape[1] != len(FEATURES):
        raise ValueError(f"need X of shape (shapes, {len(FEATURES)}) and y of (shapes,), got {X.shape} and {y.shape}")
    if (y <= 0).any():
        raise ValueError("measured step times must all be > 0 seconds")
    Xw, yw = X / y[:, None], np.ones_like(y)  # minimise sum(((X b - y) / y)^2)
    active = [j for j in range(X.shape[1]) if X[:, j].any()]
    while True:
        coef = np.zeros(X.shape[1])
        sol, *_ = np.linalg.lstsq(Xw[:, active], yw, rcond=None)
        coef[active] = sol
        if (coef[active] >= 0).all():
            return coef
        active.remove(active[int(np.argmin(sol))])


@dataclass
class CostModel:
    """Seconds per unit of each feature, the machine and settings they were measured on, and the fit's quality.

    ``fit`` holds the fit residuals: per calibration shape its measured and predicted time.
    """

    coefficients: dict[str, float]
    config: dict = field(default_factory=dict)  # the model config it was measured with (ModelConfig.to_dict())
    settings: dict = field(default_factory=dict)  # block_size, threads, dtype, repeats, device
    environment: dict = field(default_factory=dict)  # kvlab.env.environment() at calibration time
    fit: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        missing = [f for f in FEATURES if f not in self.coefficients]
        if missing:
            raise ValueError(f"cost model coefficients lack {missing}; expected one per feature of {FEATURES}")
        bad = {k: v for k, v in self.coefficients.items() if not (isinstance(v, (int, float)) and v >= 0)}
        if bad:
            raise ValueError(f"cost model coefficients must be numbers >= 0 seconds per unit, got {bad}")
        self._coef = np.array([float(self.coefficients[f]) for f in FEATURES])
        self.block_size = int(self.settings.get("block_size", SERVE_SPEC.block_size))

    @property
    def config_name(self) -> str:
        return self.config.get("name", "unknown")

    def predict_rows(self, rows: Iterable[Row]) -> float:
        """Predicted seconds for a step made of ``rows`` (new tokens, context after the step, is_decode)."""
        return float(self._coef @ features(rows, self.block_size))

    def predict(self, out: SchedulerOutput) -> float:
        """Predicted seconds for a scheduled step."""
        return self.predict_rows(rows_of(out))

    def decode_step_s(self, batch: int, context: int) -> float:
        """A step of ``batch`` decodes, each over ``context`` tokens."""
        return self.predict_rows([(1, context, True)] * batch)

    def prefill_s(self, prompt_tokens: int) -> float:
        """A step computing one whole prompt of ``prompt_tokens``."""
        return self.predict_rows([(prompt_tokens, prompt_tokens, False)])

    def describe(self) -> str:
        """The coefficients in units a person reads (µs or ms per unit)."""
        lines = [f"cost model of {self.config_name} ({self.settings.get('threads', '?')} thread(s), "
                 f"on {self.environment.get('device', 'an unknown machine')}):"]
        for f in FEATURES:
            c = self.coefficients[f]
            value = f"{c * 1e3:.3f} ms" if c >= 1e-3 else f"{c * 1e6:.4g} µs"
            lines.append(f"  {f:<18} {value} per {FEATURE_UNITS[f]}")
        if "median_ape" in self.fit:
            lines.append(f"  fit: median error {self.fit['median_ape']:.1%} over {self.fit['n_shapes']} shapes")
        return "\n".join(lines)

    # -- saving and loading ---------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"kind": "kvlab.cost_model", "features": list(FEATURES), **asdict(self)}

    def save(self, path: str | Path) -> Path:
        return write_json(path, self.to_dict())

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        if d.get("kind") != "kvlab.cost_model":
            raise ValueError("not a kvlab cost model (no \"kind\": \"kvlab.cost_model\"); "
                             "make one with python -m kvlab calibrate")
        return cls(coefficients=dict(d["coefficients"]), config=d.get("config", {}), settings=d.get("settings", {}),
                   environment=d.get("environment", {}), fit=d.get("fit", {}))

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"no cost model at {path}; make one with python -m kvlab calibrate --out {path}")
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))


def calibration_path(config_name: str) -> Path:
    """Where the calibration of ``config_name`` shipped with kvlab lives: kvlab/data/calibration/<name>.json."""
    return CALIBRATION_DIR / f"{config_name}.json"


def load_calibration(config_name: str = "llama-30m") -> CostModel:
    """The calibration of ``config_name`` shipped in kvlab/data/calibration/ (measured on the maintainers' machine).

    Recalibrate on your own machine with ``python -m kvlab calibrate --config ...``: a cost model
    predicts the machine it was measured on.
    """
    path = calibration_path(config_name)
    if not path.is_file():
        shipped = sorted(p.stem for p in CALIBRATION_DIR.glob("*.json")) if CALIBRATION_DIR.is_dir() else []
        raise ValueError(f"no shipped calibration for {config_name!r} in {CALIBRATION_DIR} (have: {shipped or 'none'}); "
                         f"fit one on this machine with python -m kvlab calibrate --out {config_name}.json "
                         f"and load it with CostModel.load(\"{config_name}.json\")")
    return CostModel.load(path)


class CostModelExecutor(Executor):
    """Prices each step with a ``CostModel`` instead of running a model (for ``Engine(..., clock="virtual")``).

    The tokens it returns are stand-ins, the same for a request at a position whatever the batch
    (so runs repeat exactly): a simulator reproduces timing, never text. With no stop tokens a
    request produces exactly its ``max_new_tokens``, as with the real model.
    """

    name = "cost_model"

    def __init__(self, cost_model: CostModel, vocab_size: int | None = None) -> None:
        if not isinstance(cost_model, CostModel):
            raise TypeError(f"CostModelExecutor takes a CostModel, got {type(cost_model).__name__}; "
                            "load one with CostModelExecutor.from_file(path)")
        self.cost_model = cost_model
        self.vocab_size = vocab_size or int(cost_model.config.get("vocab_size", 256))
        self._c = [float(cost_model.coefficients[f]) for f in FEATURES]
        self.num_steps, self.busy_s = 0, 0.0  # busy_s: predicted seconds of all steps so far

    @classmethod
    def from_file(cls, path: str | Path, vocab_size: int | None = None) -> "CostModelExecutor":
        """An executor from a calibration JSON written by ``python -m kvlab calibrate``."""
        return cls(CostModel.load(path), vocab_size)

    def initialize_cache(self, pool: BlockManager) -> None:
        self.num_steps, self.busy_s = 0, 0.0

    def execute(self, out: SchedulerOutput) -> StepResult:
        # out.shape already holds the step's counts; only the decodes' longest context and the
        # prompts' query-key pairs need a pass over the sequences (one loop, no arrays: this runs
        # tens of thousands of times per simulated load level).
        shape, vocab, bs = out.shape, self.vocab_size, self.cost_model.block_size
        longest = blocks = pairs = 0
        tokens: list[int | None] = [None] * len(out.seqs)
        for i, (seq, n, sample) in enumerate(zip(out.seqs, out.num_new_tokens, out.do_sample)):
            ctx = seq.num_computed_tokens + n
            if n == 1 and seq.num_tokens - seq.num_prompt_tokens > 0 and seq.num_tokens - ctx == 0:  # a decode
                longest = ctx if ctx > longest else longest
                blocks -= -ctx // bs
            else:
                pairs += n * ctx - n * (n - 1) // 2
            if sample:
                tokens[i] = zlib.crc32(f"{seq.request_id}:{seq.num_tokens}".encode()) % vocab
        ds = shape.num_decode_seqs
        calls, slots = decode_attention(ds, ds * -(-longest // bs) * bs, blocks * bs)
        c = self._c
        duration = (c[0] + c[1] * shape.num_prefill_tokens + c[2] * (shape.num_prefill_seqs + calls)
                    + c[3] * shape.num_decode_seqs + c[4] * slots + c[5] * pairs)
        self.num_steps += 1
        self.busy_s += duration
        return StepResult(tokens, duration)


def median_ape(measured: Sequence[float], predicted: Sequence[float]) -> float:
    """Median absolute percentage error |predicted - measured| / measured."""
    m, p = np.asarray(measured, dtype=float), np.asarray(predicted, dtype=float)
    return float(np.median(np.abs(p - m) / m))


__all__ = ["CALIBRATION_DIR", "FEATURES", "CostModel", "CostModelExecutor", "calibration_path", "decode_attention",
           "features", "fit_coefficients", "load_calibration", "median_ape", "rows_of"]
