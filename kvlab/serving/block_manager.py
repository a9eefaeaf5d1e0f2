"""BlockManager: KV memory as fixed-size blocks — free list, block tables, reference counts, prefix caching."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass

from kvlab.serving.sequence import Sequence
from kvlab.cache.paged import check_pool_geometry


@dataclass
class Block:
    """One physical block: ``ref_count`` sequences use it; ``block_hash`` is set once it is full and computed."""

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] = ()  # the tokens of a hashed block, checked on every cache hit


@dataclass(frozen=True)
class BlockStats:
    """A snapshot of the pool. used + free = num_blocks; cached blocks are free ones still holding a prefix."""

    num_blocks: int
    used: int  # ref_count > 0
    free: int  # ref_count == 0: allocatable (cached ones are evicted on demand, least recently used first)
    cached: int  # free blocks whose contents are kept for prefix-cache hits
    prefix_queries_tokens: int  # prompt tokens looked up in the prefix cache at admission
    prefix_hit_tokens: int  # of those, found (their KV is reused, not recomputed)

    @property
    def prefix_hit_rate(self) -> float:
        q = self.prefix_queries_tokens
        return self.prefix_hit_tokens / q if q else float("nan")

    def to_dict(self) -> dict:
        return {**asdict(self), "prefix_hit_rate": self.prefix_hit_rate}


def hash_block(parent_hash: int | None, token_ids: tuple[int, ...]) -> int:
    """A block's identity is its tokens *and* everything before them: hash(parent_hash, tokens)."""
    return hash((parent_hash, token_ids))


class BlockManager:
    """Hands out fixed-size KV blocks to sequences and takes them back.

    Each sequence owns a ``block_table`` (physical block ids in token order); a block may be shared by several sequences
    (``ref_count``) when prefix caching finds it. With ``enable_prefix_caching`` every full, computed block is
    registered under a chain hash (parent hash + its tokens), so a later prompt starting with the same tokens reuses
    that KV. A block whose last user leaves keeps its contents and its hash while it sits in the free queue, and is
    evicted (its hash dropped) only when allocation needs it — least recently freed first.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        check_pool_geometry(block_size, num_blocks)
        self.num_blocks, self.block_size, self.enable_prefix_caching = num_blocks, block_size, enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order (front evicted first); an OrderedDict gives O(1) removal on a hit.
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self.num_cached_free = 0  # free blocks that still hold a hash
        self.num_shared_refs = 0  # sum over blocks of (ref_count - 1) where shared: tokens stored once, used twice
        self.prefix_queries_tokens = self.prefix_hit_tokens = 0

    # -- pool bookkeeping -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    def blocks_for(self, seq: Sequence, num_tokens: int | None = None) -> int:
        """Blocks to hold ``num_tokens`` (default: all its current tokens) of ``seq``'s KV."""
        return -(-(seq.num_tokens if num_tokens is None else num_tokens) // self.block_size)

    def _take_free_block(self) -> int:
        """Pop the least recently freed block; evict its cached prefix if it had one."""
        block_id, _ = self.free_queue.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            if self.hash_to_block.get(block.block_hash) == block_id:
                del self.hash_to_block[block.block_hash]
            block.block_hash, block.token_ids = None, ()
            self.num_cached_free -= 1
        block.ref_count = 1
        return block_id

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:  # a cache hit on a free block takes it out of the free queue
            del self.free_queue[block_id]
            if block.block_hash is not None:
                self.num_cached_free -= 1
        else:
            self.num_shared_refs += 1
        block.ref_count += 1

    def _unref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            self.num_shared_refs -= 1
        elif block.ref_count == 0:
            self.free_queue[block_id] = None  # most recently freed: evicted last
            if block.block_hash is not None:
                self.num_cached_free += 1
            else:  # nothing worth keeping: hand it out before any cached block
                self.free_queue.move_to_end(block_id, last=False)

    # -- prefix cache ---------------------------------------------------------------------------
    def _block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """Chain hashes of (at least) ``seq``'s first ``num_blocks`` full blocks, computed once and kept on it."""
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash_block(hashes[-1] if hashes else None, tuple(seq.token_ids[i * bs:(i + 1) * bs])))
        return hashes

    def match_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding a prefix of ``seq``'s tokens (no side effects on the pool).

        Only full blocks within the first num_tokens - 1 tokens are matched: at least one token
        must be computed to produce the logits of the next one.
        """
        if not self.enable_prefix_caching:
            return []
        bs, hits = self.block_size, []
        num_full = (seq.num_tokens - 1) // bs
        hashes = self._block_hashes(seq, num_full)
        for i in range(num_full):
            block_id = self.hash_to_block.get(hashes[i])
            if block_id is None or self.blocks[block_id].token_ids != tuple(seq.token_ids[i * bs:(i + 1) * bs]):
                break
            hits.append(block_id)
        return hits

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Register ``seq``'s blocks that became full and computed, so later prompts can reuse them."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        hashes = self._block_hashes(seq, num_full)
        for i in range(seq.num_registered_blocks, num_full):
            block = self.blocks[seq.block_table[i]]
            # Skip a block already registered, or one whose prefix another sequence computed at the same time.
            if block.block_hash is None and hashes[i] not in self.hash_to_block:
                block.block_hash, block.token_ids = hashes[i], tuple(seq.token_ids[i * bs:(i + 1) * bs])
                self.hash_to_block[hashes[i]] = block.block_id
        seq.num_registered_blocks = max(seq.num_registered_blocks, num_full)

    # -- the allocation API the scheduler uses --------------------------------------------------
    def blocks_to_admit(self, seq: Sequence) -> int:
        """Blocks ``seq`` holds once admitted: all its current tokens (``ReservingBlockManager`` takes more)."""
        return self.blocks_for(seq)

    def can_allocate(self, seq: Sequence) -> bool:
        """Enough free blocks to admit ``seq`` (``blocks_to_admit``)?"""
        hits = self.match_prefix(seq)
        hits_in_free = sum(1 for b in hits if self.blocks[b].ref_count == 0)
        return self.blocks_to_admit(seq) - len(hits) <= self.num_free_blocks - hits_in_free

    def allocate(self, seq: Sequence) -> None:
        """Give ``seq`` a block table for all its tokens, reusing prefix-cache hits.

        Sets ``num_computed_tokens`` and ``num_cached_tokens`` to the tokens found in the cache.
        """
        if seq.block_table:
            raise RuntimeError(f"request {seq.request_id} already holds blocks {seq.block_table}; free them first")
        if not self.can_allocate(seq):
            raise RuntimeError(f"not enough free blocks for request {seq.request_id}; call can_allocate first")
        hits = self.match_prefix(seq)
        for block_id in hits:
            self._ref(block_id)
        seq.block_table = hits + [self._take_free_block() for _ in range(self.blocks_to_admit(seq) - len(hits))]
        seq.num_cached_tokens = seq.num_computed_tokens = len(hits) * self.block_size
        seq.num_registered_blocks = len(hits)
        if self.enable_prefix_caching:
            self.prefix_queries_tokens += seq.num_tokens
            self.prefix_hit_tokens += seq.num_cached_tokens

    def can_append(self, seq: Sequence) -> bool:
        """Room for the KV of ``seq``'s newest token (a new block only when the last one is full)?"""
        return self.blocks_for(seq) - len(seq.block_table) <= self.num_free_blocks

    def append_slot(self, seq: Sequence) -> None:
        """Grow ``seq``'s block table to hold all its tokens (at most one new block per decode step)."""
        missing = self.blocks_for(seq) - len(seq.block_table)
        if missing > self.num_free_blocks:
            raise RuntimeError(f"no free block for request {seq.request_id}; call can_append first (or preempt)")
        seq.block_table.extend(self._take_free_block() for _ in range(missing))

    def free(self, seq: Sequence) -> None:
        """Return ``seq``'s blocks. Tail blocks are freed first, so they are also evicted first."""
        for block_id in reversed(seq.block_table):
            self._unref(block_id)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def num_tokens_held(self, seqs: list[Sequence]) -> int:
        """Tokens whose KV the pool holds for ``seqs`` (the sequences holding blocks), shared blocks counted once."""
        return sum(s.num_computed_tokens for s in seqs) - self.num_shared_refs * self.block_size

    def stats(self) -> BlockStats:
        return BlockStats(num_blocks=self.num_blocks, used=self.num_blocks - self.num_free_blocks,
                          free=self.num_free_blocks, cached=self.num_cached_free,
                          prefix_queries_tokens=self.prefix_queries_tokens, prefix_hit_tokens=self.prefix_hit_tokens)

    def __repr__(self) -> str:
        s = self.stats()
        return (f"BlockManager({s.num_blocks} blocks x {self.block_size} tokens: used={s.used}, free={s.free} "
                f"(cached {s.cached}), prefix caching {'on' if self.enable_prefix_caching else 'off'})")
