"""PagedKVCache: one pool of fixed-size KV blocks per layer, shared by every sequence of a serving engine."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvlab.cache import in_place_attention
from kvlab.cache.base import CacheMemory, KVCache, causal_attention, kv_cache_bytes

# Decodes are attended together (one padded gather + one masked call) only while the padded gather stays this small;
# beyond it each decode is attended on its own, over exactly its own blocks. The padded gather copies D x (longest
# context) slots per layer and the masked kernel reads them again: on a mixed batch (contexts 50-640) that measured 2-9x
# slower than one call per sequence, while for many short contexts one batched call is cheaper than D small ones.
DECODE_BATCH_MAX_SLOTS = 2048
# How decoding sequences attend: "gather" copies their blocks out and calls torch's attention (above); "in_place" reads
# them in the pool with kvlab's CPU kernel (kvlab.cache.in_place_attention), every decode in one call, no cap.
ATTENTION_BACKENDS = ("gather", "in_place")


def check_attention(attention: object) -> None:
    """ValueError unless ``attention`` names one of ATTENTION_BACKENDS (the spec and the cache check it here)."""
    if attention not in ATTENTION_BACKENDS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_BACKENDS)}, got {attention!r}")


@dataclass
class PagedAttentionMetadata:
    """What one forward of the engine's packed batch needs to know (vLLM's attention metadata).

    The batch packs S sequences' new tokens one after the other into (1, N): sequence i owns tokens query_start_loc[i] :
    query_start_loc[i + 1]. Built once per step by the model runner with ``build``; ``attend`` reads it in every layer.
    """

    slot_mapping: torch.Tensor  # (N,) pool slot (block_id * block_size + offset) of each new token
    query_start_loc: list[int]  # (S + 1,) where each sequence's new tokens start in the packed batch
    query_lens: list[int]  # (S,) new tokens per sequence (a prefill chunk, or 1 to decode)
    context_lens: list[int]  # (S,) tokens in the cache for each sequence after this step's write
    block_tables: list[list[int]]  # (S, *) physical blocks of each sequence, in token order
    # Derived once per step, used by every layer:
    decode_rows: list[int]  # single-query sequences attended together in one batched call (may be empty)
    decode_token_idx: torch.Tensor | None  # (D,) their token index in the packed batch
    decode_block_tables: torch.Tensor | None  # (D, Bmax) their blocks, padded with block 0
    decode_mask: torch.Tensor | None  # (D, 1, 1, Bmax * block_size) True where a key is real (gather only)
    decode_context_lens: torch.Tensor | None  # (D,) their context lengths (in_place only)
    prefill_rows: list[int]  # sequences attended one by one, causally: prompt chunks, and decodes not batched
    # Those of them that read stored keys (all but whole new prompts) are gathered in one call per layer:
    gather_blocks: torch.Tensor | None  # (sum nb,) their blocks, one sequence after the other
    gather_start: list[int]  # per prefill row: where its slots start in that gather (-1: a new prompt, none)
    block_size: int  # the pool's tokens per block

    @classmethod
    def build(cls, cache: PagedKVCache, query_lens: list[int], context_lens: list[int],
              block_tables: list[list[int]]) -> PagedAttentionMetadata:
        """Slot mapping, packed offsets and the batched-decode gather indices of ``cache``'s pool from
        per-sequence lengths."""
        block_size, device = cache.block_size, cache.device
        starts, slots = [0], []
        for q, ctx, table in zip(query_lens, context_lens, block_tables):
            starts.append(starts[-1] + q)
            for pos in range(ctx - q, ctx):  # positions of the new tokens
                slots.append(table[pos // block_size] * block_size + pos % block_size)
        decode_rows = [i for i, q in enumerate(query_lens) if q == 1]
        width = max((-(-context_lens[i] // block_size) for i in decode_rows), default=0)
        if not cache.in_place and len(decode_rows) * width * block_size > DECODE_BATCH_MAX_SLOTS:
            decode_rows = []  # each decode on its own (see DECODE_BATCH_MAX_SLOTS)
        batched = set(decode_rows)
        prefill_rows = [i for i in range(len(query_lens)) if i not in batched]
        dec_idx = dec_tables = dec_mask = dec_lens = None
        if decode_rows:
            padded = [block_tables[i][:width] + [0] * (width - len(block_tables[i][:width])) for i in decode_rows]
            dec_tables = torch.tensor(padded, dtype=torch.long, device=device)  # (D, Bmax)
            lens = torch.tensor([context_lens[i] for i in decode_rows], device=device)  # (D,)
            if cache.in_place:
                dec_lens = lens
            else:
                keys = torch.arange(width * block_size, device=device)  # (L,)
                dec_mask = (keys[None, :] < lens[:, None])[:, None, None, :]  # (D, 1, 1, L)
            dec_idx = torch.tensor([starts[i] for i in decode_rows], dtype=torch.long, device=device)  # (D,)
        # One gather per layer for every row that reads stored keys, instead of one per row: each
        # index_select is a call with its own fixed cost, and a step may hold tens of such rows.
        flat: list[int] = []
        gather_start: list[int] = []
        for i in prefill_rows:
            new_prompt = query_lens[i] == context_lens[i]  # a whole new prompt: its keys are its own new k, v
            gather_start.append(-1 if new_prompt else len(flat) * block_size)
            flat.extend([] if new_prompt else block_tables[i][:-(-context_lens[i] // block_size)])
        gather = torch.tensor(flat, dtype=torch.long, device=device) if flat else None
        return cls(slot_mapping=torch.tensor(slots, dtype=torch.long, device=device), query_start_loc=starts,
                   query_lens=list(query_lens), context_lens=list(context_lens), block_tables=block_tables,
                   decode_rows=decode_rows, decode_token_idx=dec_idx, decode_block_tables=dec_tables,
                   decode_mask=dec_mask, decode_context_lens=dec_lens, prefill_rows=prefill_rows, gather_blocks=gather,
                   gather_start=gather_start, block_size=block_size)


BLOCK_SIZE = 16  # tokens per KV block: vLLM's default on CUDA, and kvlab's default everywhere (the one home)


def check_pool_geometry(block_size: object, num_blocks: object = 1) -> None:
    """ValueError unless ``block_size`` is a positive whole number of tokens, and the pool's ``num_blocks`` a positive
    whole number (the one place a pool's geometry is checked: the spec, the block manager, the caches)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size must be a positive integer number of tokens, got {block_size!r}")
    if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
        raise ValueError(f"num_blocks must be a positive integer, got {num_blocks!r}")


def rows_of(pool: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """The pool's ``blocks`` copied out in order: (num_blocks, bs, nkv, hs)[blocks] -> (len(blocks), bs * nkv * hs).

    Each block is one contiguous row of the 2-D view; on a CPU, index_select copies such rows whole (a memcpy each),
    where over the 4-D pool it copies element by element: 4.5x slower on the same bytes (600 blocks of 16 slots, one
    thread, 2026-12-07).
    """
    return pool.view(pool.size(0), -1).index_select(0, blocks)


class PagedKVCache(KVCache):
    """K/V of many sequences in fixed-size blocks, found through each sequence's block table.

    Layout (vLLM's FlashAttention layout): per layer one key pool and one value pool, each (num_blocks, block_size,
    num_kv_heads, head_dim); token slot s = block_id * block_size + offset. Which sequence owns which blocks is decided
    outside (the engine's BlockManager); the model runner sets ``metadata`` before every forward, and ``attend`` writes
    each new token's k/v into its slot and attends every sequence over its own blocks only: single-query (decode)
    sequences in one batched call over a padded gather while that gather is small (DECODE_BATCH_MAX_SLOTS), every other
    sequence on its own over exactly its blocks (a prompt chunk with the causal offset of the tokens already stored; a
    whole new prompt straight from its new k, v). With ``attention="in_place"`` (a float32 pool on the CPU) every decode
    is read where its blocks lie instead, all in one call (``kvlab.cache.in_place_attention``).
    """

    name = "paged"
    # per layer (num_blocks, bs, nkv, hs); None in OffloadedPagedKVCache (no on-device pool per layer, its own update)
    key_cache: list[torch.Tensor] | None
    value_cache: list[torch.Tensor] | None
    metadata: PagedAttentionMetadata | None  # set by the model runner before every forward
    in_place: bool = False  # decodes attend with the in-place kernel (the constructor's attention="in_place")

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, batch: int = 1,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                 num_blocks: int = 256, block_size: int = BLOCK_SIZE, attention: str = "gather") -> None:
        super().__init__(num_layers, num_kv_heads, head_dim, batch, dtype, device)
        check_pool_geometry(block_size, num_blocks)
        check_attention(attention)
        self.num_blocks, self.block_size = num_blocks, block_size
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # Zeros, not empty: padded decode keys are masked, but 0 x NaN from stale memory would still be NaN.
        self.key_cache = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.value_cache = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        # in_place where the kernel reads this pool (float32 on the CPU), built before any step; else the torch path
        self.in_place = attention == "in_place" and in_place_attention.applies(self.key_cache[0])
        if self.in_place:
            in_place_attention.load()
        self.reset()

    def set_usage(self, num_tokens: int, num_blocks: int) -> None:
        """Mirror the block manager's accounting (the pool itself cannot tell a live slot from a stale one): tokens
        whose KV is stored, and blocks in use by sequences."""
        self.num_tokens_held, self.num_blocks_held = num_tokens, num_blocks

    def update(self, layer_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the packed new k, v (1, nkv, N, hs) into their slots; returns the layer's pools.

        A paged cache has no single (B, nkv, S, hs) history to return: use ``attend``.
        """
        md = self._require_metadata()
        assert self.key_cache is not None and self.value_cache is not None  # None only with an update of its own
        k_pool = self.key_cache[layer_idx].view(-1, self.num_kv_heads, self.head_dim)  # (slots, nkv, hs)
        v_pool = self.value_cache[layer_idx].view(-1, self.num_kv_heads, self.head_dim)
        k_pool.index_copy_(0, md.slot_mapping, k[0].transpose(0, 1))  # (N, nkv, hs) into their slots
        v_pool.index_copy_(0, md.slot_mapping, v[0].transpose(0, 1))
        return self.key_cache[layer_idx], self.value_cache[layer_idx]

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q (1, nh, N, hs), k, v (1, nkv, N, hs) packed -> (1, nh, N, hs), each sequence over its own blocks."""
        md = self._require_metadata()
        k_pool, v_pool = self.update(layer_idx, k, v)  # (num_blocks, bs, nkv, hs) each
        out = torch.empty_like(q)  # (1, nh, N, hs)
        gqa = q.size(1) != self.num_kv_heads
        if md.decode_rows and self.in_place:  # every decode at once, read in the pool (kvlab.cache.in_place_attention)
            assert md.decode_block_tables is not None and md.decode_context_lens is not None  # built with decode_rows
            q_dec = q[0, :, md.decode_token_idx].transpose(0, 1)  # (D, nh, hs)
            y = in_place_attention.paged_decode_attention(q_dec, k_pool, v_pool, md.decode_block_tables,
                                                          md.decode_context_lens)  # (D, nh, hs)
            out[0, :, md.decode_token_idx] = y.transpose(0, 1)  # (nh, D, hs)
        elif md.decode_rows:
            assert md.decode_block_tables is not None  # built with decode_rows
            D, width = md.decode_block_tables.shape
            shape = (D, width * self.block_size, self.num_kv_heads, self.head_dim)
            blocks = md.decode_block_tables.flatten()  # (D * Bmax,)
            keys = rows_of(k_pool, blocks).view(shape).transpose(1, 2)  # (D, nkv, L, hs)
            values = rows_of(v_pool, blocks).view(shape).transpose(1, 2)
            q_dec = q[0, :, md.decode_token_idx].transpose(0, 1).unsqueeze(2)  # (D, nh, 1, hs)
            y = F.scaled_dot_product_attention(q_dec, keys, values, attn_mask=md.decode_mask,
                                               enable_gqa=gqa)  # (D, nh, 1, hs) over (D, nkv, L, hs)
            out[0, :, md.decode_token_idx] = y.squeeze(2).transpose(0, 1)  # (nh, D, hs)
        if md.gather_blocks is not None:  # every row's stored blocks at once: (sum nb * bs, nkv, hs)
            flat = (-1, self.num_kv_heads, self.head_dim)
            k_rows = rows_of(k_pool, md.gather_blocks).view(flat).transpose(0, 1)  # (nkv, slots, hs)
            v_rows = rows_of(v_pool, md.gather_blocks).view(flat).transpose(0, 1)
        for j, row in enumerate(md.prefill_rows):
            start, T, ctx = md.query_start_loc[row], md.query_lens[row], md.context_lens[row]
            at = md.gather_start[j]
            if at < 0:  # a whole prompt from an empty cache: its keys are the new k, v; no gather
                keys, values = k[:, :, start:start + T], v[:, :, start:start + T]  # (1, nkv, T, hs)
            else:  # its slice of the step's one gather
                keys = k_rows[None, :, at:at + ctx]  # (1, nkv, ctx, hs)
                values = v_rows[None, :, at:at + ctx]
            # the T new queries sit at positions ctx-T .. ctx-1 of the ctx keys
            out[:, :, start:start + T] = causal_attention(q[:, :, start:start + T], keys, values)
        return out

    def _require_metadata(self) -> PagedAttentionMetadata:
        if self.metadata is None:
            raise RuntimeError("PagedKVCache.metadata is not set: the model runner must call "
                               "PagedAttentionMetadata.build(...) and assign it before the forward")
        return self.metadata

    @property
    def seq_len(self) -> int:
        raise TypeError("a PagedKVCache holds many sequences of different lengths; "
                        "pass positions= to the model's forward (the engine's model runner does)")

    def reset(self) -> None:
        self.metadata = None
        self.set_usage(0, 0)

    def bytes_per_token(self) -> int:
        """Bytes one token's K and V take across all layers (one slot of the pool: the batch does not apply)."""
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, 1, 1, elem)

    def memory(self) -> CacheMemory:
        """allocated = the whole pool; used = tokens held x bytes per token; reserved = the rest."""
        per_token = self.bytes_per_token()
        allocated = self.num_blocks * self.block_size * per_token
        used = self.num_tokens_held * per_token
        return CacheMemory(allocated_bytes=allocated, used_bytes=used, reserved_bytes=allocated - used,
                           device_bytes=allocated)

    def usage(self) -> dict:
        """Bytes by purpose in the whole pool: tokens, in-block waste (unfilled tails of blocks in use), free blocks."""
        per_token = self.bytes_per_token()
        in_blocks = self.num_blocks_held * self.block_size * per_token
        used = self.num_tokens_held * per_token
        return {"blocks_used": self.num_blocks_held, "blocks_free": self.num_blocks - self.num_blocks_held,
                "tokens": self.num_tokens_held, "used_bytes": used, "in_block_waste_bytes": in_blocks - used,
                "free_bytes": self.num_blocks * self.block_size * per_token - in_blocks}

    def __repr__(self) -> str:
        m = self.memory()
        return (f"PagedKVCache({self.num_blocks} blocks x {self.block_size} tokens, tokens held="
                f"{self.num_tokens_held}, allocated={m.allocated_bytes:,} B, used={m.used_bytes:,} B)")
