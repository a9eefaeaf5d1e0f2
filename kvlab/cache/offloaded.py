"""OffloadedCache: every layer's K/V kept in a slower memory tier and brought back layer by layer each step."""
from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
import weakref

import torch

from kvlab import device as devices  # devices.now(): a timestamp after the device's queued work (patchable in tests)
from kvlab.cache.base import CacheMemory, KVCache, check_fits, kv_cache_bytes


def _remove_storage(path: str, owned_dir: str | None) -> None:
    """Delete the tier's file (and the temporary folder made for it)."""
    if owned_dir is not None:
        shutil.rmtree(owned_dir, ignore_errors=True)
    elif os.path.exists(path):
        os.remove(path)


class SlowTier:
    """The slower tier both offloaded caches keep K/V in: its storage, its modelled link and its copy counters."""

    device: torch.device
    tier: torch.Tensor | None  # None once closed
    storage_path: str | None = None  # the tier's file (CPU)
    _finalizer: weakref.finalize | None = None  # deletes that file

    def _open_tier(self, shape: tuple[int, ...], dtype: torch.dtype, storage_dir: str | None, name: str,
                   link_gbps: float | None) -> None:
        """The tier, zeroed: pinned host memory on CUDA (RAM the GPU can copy from without staging), else
        a memory-mapped file in ``storage_dir`` (default: a temporary folder ``kvlab-<name>-*``), deleted on
        ``close()`` or when the cache is garbage-collected."""
        self.cuda = self.device.type == "cuda"
        self.link_gbps = None if link_gbps is None else float(link_gbps)
        self.copy_s_total = 0.0  # seconds spent copying, link waits included
        self.link_wait_s_total = 0.0  # seconds waited for the modelled link
        if self.cuda:
            self.tier = torch.zeros(shape, dtype=dtype).pin_memory()
            return
        owned = tempfile.mkdtemp(prefix=f"kvlab-{name}-") if storage_dir is None else None
        fd, self.storage_path = tempfile.mkstemp(prefix="kvlab-kv-", suffix=".bin", dir=owned or storage_dir)
        os.close(fd)
        self._finalizer = weakref.finalize(self, _remove_storage, self.storage_path, owned)
        self.tier = torch.from_file(self.storage_path, shared=True, size=math.prod(shape), dtype=dtype).view(shape)

    def close(self) -> None:
        """Release the tier and delete its file (CPU); the cache cannot be used afterwards."""
        self.tier = None
        if self._finalizer is not None:
            self._finalizer()  # runs once: removes the file (and the temporary folder)


LINK_POLL_S = 1e-3  # the last part of a link wait is polled, not slept (a sleeper wakes late)


def check_link_and_storage(link_gbps: float | None, storage_dir: str | None) -> None:
    """The options both offloaded caches share: a modelled link's speed and the tier's folder (CPU)."""
    if link_gbps is not None and (isinstance(link_gbps, bool) or not isinstance(link_gbps, (int, float))
                                  or not 0 < link_gbps < float("inf")):
        raise ValueError(f"link_gbps must be a positive number of GB/s (1.0 = 10^9 bytes per second) or None "
                         f"for no throttle, got {link_gbps!r}")
    if storage_dir is not None and not os.path.isdir(storage_dir):
        raise ValueError(f"storage_dir {storage_dir!r} is not an existing folder; create it or pass None "
                         "for a temporary one")


def wait_for_link(start: float, nbytes: int, link_gbps: float) -> float:
    """Wait until ``nbytes`` would have crossed a link of ``link_gbps`` GB/s since ``start`` (a
    ``perf_counter()`` time); returns the seconds waited (0 for copies already slower than the link).

    It sleeps, and polls the clock only for the last ``LINK_POLL_S``: the OS wakes a sleeper tens of µs
    late (much later on a busy machine), while a process that polls for long on a shared machine is
    charged for it by the OS scheduler and computes slower afterwards.
    """
    deadline = start + nbytes / (link_gbps * 1e9)
    now = time.perf_counter()
    if now >= deadline:
        return 0.0
    if deadline - now > LINK_POLL_S:
        time.sleep(deadline - now - LINK_POLL_S)
    while time.perf_counter() < deadline:
        pass
    return time.perf_counter() - now


class OffloadedCache(SlowTier, KVCache):
    """Holds all K/V in a slow tier; each step copies a layer's history in, computes, writes new tokens out.

    The slow tier ("offloaded") is preallocated to ``max_len`` tokens:

    - on CUDA it is pinned host memory (RAM the GPU can copy from over PCIe/NVLink without staging). With
      ``prefetch=True`` the next layer's history is copied to the GPU on a side stream while the current layer computes,
      and the new tokens' K/V are written back on that side stream; ``prefetch=False`` copies synchronously on the main
      stream, for comparison.
    - on a CPU-only machine it is a memory-mapped file in ``storage_dir`` (default: a temporary folder, removed on
      ``close()`` or when the cache is garbage-collected). The file's pages live in the OS page cache, i.e. in RAM,
      unless the OS evicts them: the cost shown on CPU is the copy in and out of the mapping each step, not a disk read.
      ``prefetch`` has no effect on CPU (copies are synchronous).

    The working buffers ("device") hold one layer's history at a time (two with prefetch on CUDA,
    so one can fill while the other is read); ``update`` returns views into them, valid until
    the same buffer is refilled (the next layer or the one after).

    Layout: the tier is (L, max_len, 2, B, nkv, hs) — a token's K and V for every sequence and head form one contiguous
    row, so a layer's first S tokens are one contiguous block: one copy in and one copy out per layer and step.

    A slower link, modelled honestly (``link_gbps``): by default the copies run as fast as the two memories allow, which
    on a CPU-only machine means RAM to RAM. ``link_gbps=1.0`` models a tier behind a link of 1 GB/s (10^9 bytes per
    second): every copy still really moves its bytes, in chunks of ``LINK_CHUNK_BYTES``, and after each chunk the cache
    waits until the time those bytes take at that rate has passed since the chunk began (``wait_for_link``), so the
    link's time is really inside the measured step, not added on paper. Throttled copies are synchronous (``prefetch``
    is off), so their whole time shows in the step. ``link_wait_s_total`` counts the seconds waited for the link;
    ``copy_s_total`` the seconds spent copying, waiting included.

    Accounting: ``bytes_moved_last_step`` = bytes read from the tier (the S stored tokens of every
    layer, K and V) + bytes written to it (the T new tokens of every layer) during the last step
    (reset when layer 0 is updated); ``bytes_moved_total`` since construction. ``memory()``:
    offloaded_bytes = the tier's capacity, device_bytes = the working buffers, allocated = both,
    used = tier bytes holding tokens, reserved = allocated - used (empty tier + working buffers).
    """

    name = "offloaded"
    LINK_CHUNK_BYTES = 64 * 1024  # a throttled copy moves this much at a time, then waits for the link

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 max_len: int | None = None, prefetch: bool = True, storage_dir: str | None = None,
                 link_gbps: float | None = None) -> None:
        # Every check first, so a bad option leaves no file or buffer behind.
        if max_len is None:
            raise ValueError("offloaded cache needs max_len (the most tokens it will hold), "
                             "e.g. prompt + max_new_tokens")
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"offloaded cache max_len must be an integer >= 1, got {max_len!r}")
        if not isinstance(prefetch, bool):
            raise ValueError(f"prefetch must be True or False, got {prefetch!r}")
        check_link_and_storage(link_gbps, storage_dir)
        super().__init__(num_layers, num_kv_heads, head_dim, batch, dtype, device)
        self.max_len = max_len
        tier_shape = (num_layers, max_len, 2, batch, num_kv_heads, head_dim)
        self._open_tier(tier_shape, dtype, storage_dir, "offload", link_gbps)
        # overlapping copies needs a side stream; a throttled link copies synchronously
        self.prefetch = prefetch and self.cuda and self.link_gbps is None
        self._len = [0] * num_layers
        self.bytes_moved_last_step = self.bytes_moved_total = 0
        # one token of one layer, K and V, for the whole batch: a row of the tier
        self.row_bytes = kv_cache_bytes(1, num_kv_heads, head_dim, 1, batch, torch.empty(0, dtype=dtype).element_size())

        # Working buffers on the compute device, one layer's worth each: (max_len, 2, B, nkv, hs).
        n_slots = 2 if self.prefetch else 1
        self.slots = [torch.empty(tier_shape[1:], dtype=dtype, device=self.device) for _ in range(n_slots)]
        if self.prefetch:
            self.side = torch.cuda.Stream(device=self.device)
            for buf in self.slots:  # also written on the side stream: not reusable until its copies finish
                buf.record_stream(self.side)
            self._fetched: dict[int, tuple[int, int, torch.cuda.Event]] = {}  # slot -> (layer, tokens, event)

    # -- moving bytes between the tier and the working buffers ------------------------------------
    def _copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """The one place bytes cross tiers: a contiguous block copy, counted (and paced, with ``link_gbps``).

        A synchronous copy's clock starts once the device is idle (``devices.now``): on CUDA a blocking copy
        first waits for the kernels queued before it, which would be counted as copying (and hide part of
        the link's time in ``wait_for_link``). A prefetching copy is asynchronous and is not waited for."""
        t0 = time.perf_counter() if self.prefetch else devices.now(self.device)
        if self.link_gbps is None:
            dst.copy_(src, non_blocking=self.prefetch)
        else:
            self._paced_copy(dst, src)
        n = src.numel() * src.element_size()
        self.bytes_moved_last_step += n
        self.bytes_moved_total += n
        self.copy_s_total += time.perf_counter() - t0

    def _paced_copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Copy token rows chunk by chunk; after each chunk, wait out the rest of the time its bytes take
        at ``link_gbps`` (a chunk whose copy already took longer waits nothing, and is not sped up)."""
        assert self.link_gbps is not None  # _copy paces only a modelled link
        rows = max(1, self.LINK_CHUNK_BYTES // self.row_bytes)  # tokens (rows of K and V) per chunk
        for a in range(0, src.size(0), rows):
            t0 = time.perf_counter()
            chunk = src[a:a + rows]  # (rows, 2, B, nkv, hs)
            dst[a:a + rows].copy_(chunk)
            if self.cuda:
                torch.cuda.current_stream(self.device).synchronize()  # the bytes have arrived
            self.link_wait_s_total += wait_for_link(t0, chunk.numel() * chunk.element_size(), self.link_gbps)

    def _fetch(self, layer_idx: int, slot: int) -> None:
        """Copy the layer's stored tokens from the tier into a working buffer (on the side stream if prefetching)."""
        assert self.tier is not None  # update checked it is open
        S = self._len[layer_idx]
        if self.prefetch:
            event = torch.cuda.Event()
            with torch.cuda.stream(self.side):
                if S:
                    self._copy(self.slots[slot][:S], self.tier[layer_idx, :S])  # (S, 2, B, nkv, hs)
                event.record(self.side)
            self._fetched[slot] = (layer_idx, S, event)
        elif S:
            self._copy(self.slots[slot][:S], self.tier[layer_idx, :S])

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.tier is None:
            raise RuntimeError("this offloaded cache was closed; build a new one")
        i, T = layer_idx, k.size(2)
        S = self._len[i]
        check_fits(self.name, self.max_len, S + T)
        if i == 0:
            self.bytes_moved_last_step = 0  # a new step starts with layer 0
        slot = i % len(self.slots)
        buf = self.slots[slot]  # (max_len, 2, B, nkv, hs)
        if self.prefetch:
            fetched = self._fetched.get(slot)
            if fetched is None or fetched[:2] != (i, S):  # not prefetched (layer 0, or an unusual order)
                self.side.wait_stream(torch.cuda.current_stream(self.device))  # buffer no longer read
                self._fetch(i, slot)
            torch.cuda.current_stream(self.device).wait_event(self._fetched.pop(slot)[2])
        else:
            self._fetch(i, slot)
        buf[S:S + T, 0] = k.permute(2, 0, 1, 3)  # (T, B, nkv, hs): new tokens beside the history
        buf[S:S + T, 1] = v.permute(2, 0, 1, 3)
        if self.prefetch:
            # The side stream may start only after the main stream has written the new tokens (and
            # finished with the buffer the next prefetch overwrites: the previous layer's attention).
            written = torch.cuda.Event()
            written.record(torch.cuda.current_stream(self.device))
            self.side.wait_event(written)
            with torch.cuda.stream(self.side):
                self._copy(self.tier[i, S:S + T], buf[S:S + T])  # write-back (T, 2, B, nkv, hs)
            if i + 1 < self.num_layers:
                self._fetch(i + 1, (i + 1) % len(self.slots))
        else:
            self._copy(self.tier[i, S:S + T], buf[S:S + T])  # write-back, synchronous
        self._len[i] = S + T
        kv = buf[:S + T].permute(1, 2, 3, 0, 4)  # (2, B, nkv, S+T, hs): views, no copy
        return kv[0], kv[1]

    def synchronize(self) -> None:
        """Wait for copies still in flight on the side stream (CUDA with prefetch only)."""
        if self.prefetch:
            self.side.synchronize()

    @property
    def seq_len(self) -> int:
        return self._len[-1]

    def reset(self) -> None:
        self.synchronize()
        self._len = [0] * self.num_layers
        self.bytes_moved_last_step = 0
        if self.prefetch:
            self._fetched.clear()

    def close(self) -> None:
        self.synchronize()
        self.slots = []
        super().close()

    def memory(self) -> CacheMemory:
        offloaded = self.num_layers * self.max_len * self.row_bytes
        device = sum(s.numel() * s.element_size() for s in self.slots)
        used = sum(self._len) * self.row_bytes
        return CacheMemory(allocated_bytes=offloaded + device, used_bytes=used,
                           reserved_bytes=offloaded + device - used, device_bytes=device,
                           offloaded_bytes=offloaded)
