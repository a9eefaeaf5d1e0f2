"""OffloadedPagedKVCache: the serving engine's paged KV pool kept in a slower tier, its blocks copied in every step.

The ``PagedKVCache`` keeps every layer's pool of blocks on the compute device. This one keeps the whole pool (all
layers, K and V) in a slower memory tier, the way ``OffloadedCache`` does for one sequence, and holds on the device only
a working pool of **one layer**. In every layer of every step it

1. copies in, from the tier, the blocks this step's sequences attend over that already hold
   tokens (each sequence's first ceil(stored / block_size) blocks; a block two sequences share
   through prefix caching is copied once), as runs of consecutive block ids;
2. writes the step's new keys and values into their slots of the working pool, and attends every
   sequence over its blocks there exactly as ``PagedKVCache.attend`` does (it is the same code);
3. writes the new tokens' K and V back to their slots in the tier.

So every step moves real bytes, and more of them the more context its batch holds: under load the step's price depends
on *who else* is in the batch. The tier is a memory-mapped file on a CPU-only machine (its pages live in RAM, in the OS
page cache) and pinned host memory on CUDA; the copies are synchronous. ``link_gbps`` puts the tier behind a modelled
slower link exactly as ``OffloadedCache(link_gbps=...)`` does: the bytes are really copied, and then the cache waits
until the time those bytes take at that rate has passed (once per layer and step), so the link's time is inside the
measured step.

Accounting, per step (reset by layer 0) and in total: ``bytes_read_last_step`` (tier -> device),
``bytes_written_last_step`` (device -> tier), ``bytes_moved_last_step`` (both);
``copy_s_total`` seconds spent copying (link waits included), ``link_wait_s_total`` seconds waited
for the link. Tokens are bit for bit those of the on-device pool: the blocks attention reads hold
the same numbers, and the padding keys a batched decode reads (block 0) are masked out.
"""
from __future__ import annotations

import time

import torch

from kvlab import device as devices  # devices.now(): a timestamp after the device's queued work (patchable in tests)
from kvlab.cache.base import CacheMemory, KVCache, tensor_bytes
from kvlab.cache.offloaded import SlowTier, check_link_and_storage, wait_for_link
from kvlab.cache.paged import PagedAttentionMetadata, PagedKVCache, check_pool_geometry


def block_runs(block_ids: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct block ids as runs [a, b) of consecutive ids: one contiguous copy per run.

    >>> block_runs([7, 3, 4, 5, 9, 4])
    [(3, 6), (7, 8), (9, 10)]
    """
    runs: list[tuple[int, int]] = []
    for b in sorted(set(int(i) for i in block_ids)):
        if runs and runs[-1][1] == b:
            runs[-1] = (runs[-1][0], b + 1)
        else:
            runs.append((b, b + 1))
    return runs


def blocks_to_fetch(metadata: PagedAttentionMetadata) -> list[int]:
    """Distinct blocks holding tokens stored *before* this step, over every sequence of the step.

    A sequence with ``context_lens[i]`` tokens after the step, ``query_lens[i]`` of them new, has
    ``stored = context - query`` tokens in its first ceil(stored / block_size) blocks. A whole new prompt has none.
    """
    wanted: set[int] = set()
    for q, ctx, table in zip(metadata.query_lens, metadata.context_lens, metadata.block_tables):
        stored = ctx - q
        wanted.update(table[:-(-stored // metadata.block_size)] if stored else [])
    return sorted(wanted)


class OffloadedPagedKVCache(SlowTier, PagedKVCache):
    """A paged KV pool in a slower tier; one layer's working pool on the device (see the module docstring)."""

    name = "paged_offloaded"
    _plan: tuple[PagedAttentionMetadata, list[tuple[int, int]], torch.Tensor] | None  # md, runs, slots

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", *,
                 num_blocks: int, block_size: int, link_gbps: float | None = None,
                 storage_dir: str | None = None) -> None:
        check_pool_geometry(block_size, num_blocks)
        check_link_and_storage(link_gbps, storage_dir)
        self.num_blocks, self.block_size = num_blocks, block_size
        KVCache.__init__(self, num_layers, num_kv_heads, head_dim, batch, dtype, device)
        pool = (num_blocks, block_size, num_kv_heads, head_dim)
        # every layer's K pool and V pool, one after the other: (layers, 2, num_blocks, bs, nkv, hs)
        self._open_tier((num_layers, 2, *pool), dtype, storage_dir, "paged-offload", link_gbps)
        # One layer's working pool on the device, reused by every layer (zeros: see PagedKVCache).
        self.work_k = torch.zeros(pool, dtype=dtype, device=self.device)
        self.work_v = torch.zeros(pool, dtype=dtype, device=self.device)
        self.key_cache = self.value_cache = None  # no on-device pool per layer: that is the point
        self.block_bytes = tensor_bytes(self.work_k[0])  # one block of one layer, K or V: (bs, nkv, hs)
        self.bytes_read_total = self.bytes_written_total = 0
        self.reset()

    @property
    def bytes_moved_last_step(self) -> int:
        return self.bytes_read_last_step + self.bytes_written_last_step

    @property
    def bytes_moved_total(self) -> int:
        return self.bytes_read_total + self.bytes_written_total

    # -- moving bytes between the tier and the working pool ---------------------------------------
    def _fetch(self, layer_idx: int, runs: list[tuple[int, int]]) -> int:
        """Copy the step's stored blocks of one layer, K and V, from the tier into the working pool; bytes read."""
        assert self.tier is not None  # update checked it is open
        for a, b in runs:
            self.work_k[a:b].copy_(self.tier[layer_idx, 0, a:b])  # (b-a, bs, nkv, hs): one contiguous copy
            self.work_v[a:b].copy_(self.tier[layer_idx, 1, a:b])
        return sum(2 * (b - a) * self.block_bytes for a, b in runs)

    def _step_plan(self, md: PagedAttentionMetadata) -> tuple[list[tuple[int, int]], torch.Tensor]:
        """The runs of blocks to fetch and the new tokens' slots on the CPU, once per step (every layer reuses them)."""
        if self._plan is None or self._plan[0] is not md:  # not id(md): a freed step's id can be reused
            self._plan = (md, block_runs(blocks_to_fetch(md)), md.slot_mapping.to("cpu"))
        return self._plan[1], self._plan[2]

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Fetch this layer's stored blocks, write the new k, v (1, nkv, N, hs) into the working pool and the
        tier; returns the working pools (num_blocks, bs, nkv, hs), valid for this layer only."""
        if self.tier is None:
            raise RuntimeError("this offloaded paged cache was closed; build a new one")
        md = self._require_metadata()
        if layer_idx == 0:
            self.bytes_read_last_step = self.bytes_written_last_step = 0  # a new step starts with layer 0
        runs, slots_cpu = self._step_plan(md)
        k_new, v_new = k[0].transpose(0, 1), v[0].transpose(0, 1)  # (N, nkv, hs)
        # The clock starts once the layer's queued kernels are done: on CUDA the first blocking copy would
        # otherwise wait for them, and copy_s would read as the layer's compute (hiding link time behind it).
        start = devices.now(self.device)
        read = self._fetch(layer_idx, runs)
        flat = (-1, self.num_kv_heads, self.head_dim)
        self.tier[layer_idx, 0].view(flat).index_copy_(0, slots_cpu, k_new.to("cpu"))  # write-back into their slots
        self.tier[layer_idx, 1].view(flat).index_copy_(0, slots_cpu, v_new.to("cpu"))
        written = 2 * k_new.numel() * k_new.element_size()
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()  # the bytes have arrived
        if self.link_gbps is not None:  # one wait per layer and step
            self.link_wait_s_total += wait_for_link(start, read + written, self.link_gbps)
        self.copy_s_total += time.perf_counter() - start
        self.bytes_read_last_step += read
        self.bytes_written_last_step += written
        self.bytes_read_total += read
        self.bytes_written_total += written
        self.work_k.view(flat).index_copy_(0, md.slot_mapping, k_new)  # the new tokens beside the fetched ones
        self.work_v.view(flat).index_copy_(0, md.slot_mapping, v_new)
        return self.work_k, self.work_v

    def reset(self) -> None:
        super().reset()
        self._plan = None
        self.bytes_read_last_step = self.bytes_written_last_step = 0

    def memory(self) -> CacheMemory:
        """offloaded = the whole pool in the tier; device = the one-layer working pool; used = tokens held."""
        per_token = self.bytes_per_token()
        offloaded = self.num_blocks * self.block_size * per_token
        device = tensor_bytes(self.work_k, self.work_v)
        used = self.num_tokens_held * per_token
        return CacheMemory(allocated_bytes=offloaded + device, used_bytes=used,
                           reserved_bytes=offloaded + device - used, device_bytes=device, offloaded_bytes=offloaded)

    def __repr__(self) -> str:
        link = "" if self.link_gbps is None else f", link {self.link_gbps:g} GB/s"
        return (f"OffloadedPagedKVCache({self.num_blocks} blocks x {self.block_size} tokens in "
                f"{'pinned host memory' if self.cuda else 'a memory-mapped file'}{link}, tokens held="
                f"{self.num_tokens_held}, moved {self.bytes_moved_total:,} B)")


__all__ = ["OffloadedPagedKVCache", "block_runs", "blocks_to_fetch"]
