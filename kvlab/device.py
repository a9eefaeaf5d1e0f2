"""Device choice: CUDA when present, else CPU; KVLAB_DEVICE overrides. (The lesson sizes per device: kvlab.model.lessons.)"""
from __future__ import annotations

import os
import time

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

