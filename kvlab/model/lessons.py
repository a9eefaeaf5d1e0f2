"""The lesson model and the lesson sizes per device: what every notebook runs on unless told otherwise.

``lesson_scale()`` picks the sizes of this device (``LESSON_SCALES``), ``lesson_config()`` is the lesson model's config
and ``lesson_model()`` the model itself, with seeded random weights.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import torch

from kvlab.data import RECALL_TINY, data_path, missing_message
from kvlab.device import pick_device
from kvlab.model.config import ModelConfig, tiny_llama
from kvlab.model.decoder import Decoder, build_model

RECALL_MODEL_DIR = data_path(RECALL_TINY)  # the recall task's trained checkpoint (lesson 03, lesson 09's engines)


@dataclass(frozen=True)
class LessonScale:
    """The sizes the lessons default to on one kind of device, kept in one place.

    On CPU they are sized for 2 cores (every notebook runs in minutes). On a GPU the 3M-parameter lesson model is so
    small that every step is the cost of launching kernels, not of computing, so a cache would hardly matter: the GPU
    scale uses a ~90M-parameter model and longer contexts, where recomputation and memory traffic show again. Notebooks
    read these through the default arguments (``lesson_config()``, ``run_slowdown()``, ``slowdown_panel()``,
    ``lesson_model()``); an explicit argument always wins.
    """

    device: str  # "cpu" or "cuda"
    model: dict  # overrides of tiny_llama() that make the lesson model (lesson_config)
    prompt_tokens: int  # lesson 01: the prompt of the slowdown run
    max_new_tokens: int  # lesson 01: tokens generated per cache
    offload_tier: str  # where the offloaded cache keeps its K/V on this device

    def describe(self) -> str:
        """One line for the setup report."""
        m = self.model
        return (f"lesson defaults for {self.device}: model {m['name']} (hidden {m['hidden_size']}, "
                f"{m['num_layers']} layers), slowdown prompt {self.prompt_tokens} + {self.max_new_tokens} new "
                f"tokens; the offloaded cache keeps K/V in {self.offload_tier}")


LESSON_SCALES: dict[str, LessonScale] = {
    "cpu": LessonScale("cpu", model=dict(hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4,
                                         intermediate_size=688, name="llama-3m"), prompt_tokens=32, max_new_tokens=200,
                       offload_tier="a memory-mapped file (RAM via the page cache), copied synchronously"),
    "cuda": LessonScale("cuda", model=dict(hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8,
                                           intermediate_size=2752, max_position_embeddings=2048, name="llama-90m"),
                        prompt_tokens=512, max_new_tokens=400,
                        offload_tier="pinned host memory, the next layer prefetched on a side CUDA stream"),
}


def lesson_scale(device: torch.device | str | None = None) -> LessonScale:
    """The lesson sizes for ``device`` (default: ``pick_device()``, so KVLAB_DEVICE=cpu gives the CPU sizes)."""
    kind = pick_device(device).type if device is None else torch.device(device).type
    return LESSON_SCALES["cuda" if kind == "cuda" else "cpu"]


def lesson_config(**overrides) -> ModelConfig:
    """The ~3M-parameter Llama of the lessons (hidden 256, 4 layers, 8 heads, 4 KV heads).

    Small enough that a run of 200 uncached tokens takes seconds, not minutes, on 2 CPU cores; big enough that an
    uncached step over a few hundred tokens takes clearly longer than a cached one (``run_slowdown`` measures both on
    the machine at hand). On a GPU: the ~90M-parameter one of ``lesson_scale()`` (``LessonScale`` says why). Lesson 01
    calls it ``slowdown_config``.
    """
    return tiny_llama(**{**lesson_scale().model, **overrides})


def lesson_model(seed: int = 0) -> Decoder:
    """The lesson model (``lesson_config()``), seeded random weights, built once per seed (timing needs no training).

    Lesson 01 calls it ``slowdown_model``; the serving lessons (04-08) run on it too.
    """
    return _built_model(seed, lesson_scale().device)


@functools.lru_cache(maxsize=4)
def _built_model(seed: int, scale: str) -> Decoder:  # one per seed and device scale
    return build_model(lesson_config(), seed=seed)


def load_recall_model(path: str | Path | None = None, device: torch.device | str | None = None):
    """The shipped recall checkpoint (kvlab/data/recall-tiny), loaded offline with ``kvlab.from_pretrained``.

    It ships inside the package (``kvlab.data``), so it is found from a checkout, an editable install
    and a wheel alike; ``path`` loads another checkpoint folder instead (e.g. one you retrained).
    """
    from kvlab.model.loading import from_pretrained

    where = RECALL_MODEL_DIR if path is None else Path(path)
    if not (where / "config.json").is_file():
        raise FileNotFoundError(missing_message(RECALL_TINY) if path is None else (
            f"no recall checkpoint at {where} (no config.json there): pass the folder "
            "scripts/train_recall.py --out wrote, or call load_recall_model() for the shipped one"))
    model = from_pretrained(where, device=device)
    model.config.name = "recall-tiny"
    return model


__all__ = ["LESSON_SCALES", "LessonScale", "RECALL_MODEL_DIR", "lesson_config", "lesson_model", "lesson_scale",
           "load_recall_model"]
