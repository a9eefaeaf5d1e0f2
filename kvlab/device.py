"""Device choice: CUDA when present, else CPU; KVLAB_DEVICE overrides. And the lesson sizes each device gets."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch


def pick_device(device: torch.device | str | None = None) -> torch.device:
    """The device to run on: the argument, else $KVLAB_DEVICE, else cuda if available, else cpu."""
    choice = device if device is not None else os.environ.get("KVLAB_DEVICE")
    if choice is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(choice)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(choice)!r} requested but CUDA is not available here; "
                         "unset KVLAB_DEVICE or use 'cpu'")
    return dev


def synchronize(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a wall-clock reading covers it (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device | str = "cpu") -> float:
    """A wall-clock timestamp (seconds) taken after all queued work on ``device`` finished."""
    synchronize(device)
    return time.perf_counter()


# --- lesson sizes per device ---------------------------------------------------------------------

@dataclass(frozen=True)
class LessonScale:
    """The sizes the lessons default to on one kind of device, kept in one place.

    On CPU they are sized for 2 cores (every notebook runs in minutes). On a GPU the 3M-parameter
    lesson model is so small that every step is the cost of launching kernels, not of computing, so
    a cache would hardly matter: the GPU scale uses a ~90M-parameter model and longer contexts, where
    recomputation and memory traffic show again. Notebooks read these through the default
    arguments (``slowdown_config()``, ``run_slowdown()``, ``slowdown_panel()``, ``lesson_model()``);
    an explicit argument always wins.
    """

    device: str  # "cpu" or "cuda"
    model: dict  # overrides of tiny_llama() that make the lesson model (slowdown_config)
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
                                         intermediate_size=688, name="llama-3m"),
                       prompt_tokens=32, max_new_tokens=200,
                       offload_tier="a memory-mapped file (RAM via the page cache), copied synchronously"),
    "cuda": LessonScale("cuda", model=dict(hidden_size=1024, num_layers=8, num_heads=16, num_kv_heads=8,
                                           intermediate_size=2752, max_position_embeddings=2048,
                                           name="llama-90m"),
                        prompt_tokens=512, max_new_tokens=400,
                        offload_tier="pinned host memory, the next layer prefetched on a side CUDA stream"),
}


def lesson_scale(device: torch.device | str | None = None) -> LessonScale:
    """The lesson sizes for ``device`` (default: ``pick_device()``, so KVLAB_DEVICE=cpu gives the CPU sizes)."""
    kind = pick_device(device).type if device is None else torch.device(device).type
    return LESSON_SCALES["cuda" if kind == "cuda" else "cpu"]
