"""The C allocator of a serving process: freed memory kept for the next engine step, or the system's default.

Every engine step allocates the same large temporaries again (a layer's gathered keys and values: megabytes at a batch
of 16). glibc's malloc hands allocations above its mmap threshold to the kernel and gives them back on free, so each
step page-faults fresh zeroed pages in again; its threshold adapts upwards, but only after a free. Keeping freed memory
in the heap (a fixed mmap threshold of 32 MiB and a trim threshold of 256 MiB, set with glibc's ``mallopt``) lets the
next step reuse it (``python -m kvlab bench serve --allocator-twin`` measures the server with and without it).

kvlab's choice: glibc's own knobs, present on every Linux learners use (Colab included), no library to install.
Real engines do the same by swapping the allocator: vLLM's CPU guide preloads TCMalloc
(https://docs.vllm.ai/en/latest/getting_started/installation/cpu/, "set LD_PRELOAD"), PyTorch's CPU
performance guide suggests TCMalloc or jemalloc
(https://pytorch.org/tutorials/recipes/recipes/tuning_guide.html, "Switch Memory allocator").
"""
from __future__ import annotations

import ctypes
import os
from typing import Final, Literal, get_args

Allocator = Literal["kept", "system"]
ALLOCATORS: Final[tuple[str, ...]] = get_args(Allocator)
M_TRIM_THRESHOLD: Final = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD: Final = -3
MMAP_THRESHOLD_BYTES: Final = 32 * 2**20  # glibc's largest on 64-bit: allocations up to it come from the heap
TRIM_THRESHOLD_BYTES: Final = 256 * 2**20  # free memory at the heap's top kept up to this, not given back
DEFAULT_ALLOCATOR: Final[Allocator] = "kept"  # what `python -m kvlab serve` runs with


def check_allocator(allocator: object) -> None:
    """ValueError unless ``allocator`` is one of ALLOCATORS (checked before a server starts, and where it is set)."""
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS} (serve --allocator), got {allocator!r}")


def set_allocator(allocator: str) -> str:
    """For the whole process: "kept" sets glibc's thresholds (above), "system" leaves malloc as it is; says what
    holds now, for the server's settings ("system: ..." where the C library is not glibc, e.g. macOS)."""
    check_allocator(allocator)
    preload = os.environ.get("LD_PRELOAD", "")
    if "tcmalloc" in preload or "jemalloc" in preload:
        return f"system: preloaded {os.path.basename(preload.split(':')[0])}"
    glibc = os.confstr("CS_GNU_LIBC_VERSION") if "CS_GNU_LIBC_VERSION" in os.confstr_names else None
    if allocator == "system" or not glibc:
        return f"system: {glibc or 'not glibc'}, default thresholds"
    mallopt = ctypes.CDLL(None).mallopt
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)):
        return f"system: {glibc} refused the thresholds"
    return (f"kept: {glibc}, mmap threshold {MMAP_THRESHOLD_BYTES >> 20} MiB, "
            f"trim threshold {TRIM_THRESHOLD_BYTES >> 20} MiB")


__all__ = ["ALLOCATORS", "DEFAULT_ALLOCATOR", "Allocator", "check_allocator", "set_allocator"]
