"""Both ways the paged cache attends decodes (batched over a padded gather, or one by one) give the same answers."""
from __future__ import annotations

import pytest
import torch

import kvlab
import kvlab.cache.paged as paged
from kvlab.cache.base import causal_attention
from kvlab.serving import Engine, PagedAttentionMetadata, PagedKVCache, SchedulerConfig
from kvlab.workload import make_workload
from kvlab.serving.config import EngineSpec


def attend_decodes(threshold: int, monkeypatch) -> tuple[torch.Tensor, torch.Tensor, PagedAttentionMetadata]:
    """Three decodes of uneven contexts and one fresh prompt, against dense attention per sequence."""
    monkeypatch.setattr(paged, "DECODE_BATCH_MAX_SLOTS", threshold)
    torch.manual_seed(0)
    nh, nkv, hs, bs = 4, 2, 8, 4
    cache = PagedKVCache(1, nkv, hs, num_blocks=40, block_size=bs)
    tables, stored, new = [[7, 2, 30, 31, 12], [5], [11, 3, 20], [0, 1, 9]], [18, 3, 9, 0], [1, 1, 1, 10]
    dense_k = [torch.randn(1, nkv, s + n, hs) for s, n in zip(stored, new)]
    dense_v = [torch.randn(1, nkv, s + n, hs) for s, n in zip(stored, new)]
    for table, s, k, v in zip(tables, stored, dense_k, dense_v):
        for pos in range(s):
            cache.key_cache[0][table[pos // bs], pos % bs] = k[0, :, pos]
            cache.value_cache[0][table[pos // bs], pos % bs] = v[0, :, pos]
    q = [torch.randn(1, nh, n, hs) for n in new]
    cache.metadata = PagedAttentionMetadata.build(cache, new, [s + n for s, n in zip(stored, new)], tables)
    packed = lambda xs: torch.cat([x[:, :, s:] for x, s in zip(xs, stored)], dim=2)  # noqa: E731
    out = cache.attend(0, torch.cat(q, dim=2), packed(dense_k), packed(dense_v))
    expected = torch.cat([causal_attention(qi, k, v) for qi, k, v in zip(q, dense_k, dense_v)], dim=2)
    return out, expected, cache.metadata


@pytest.mark.parametrize("threshold, batched", [(10**6, [0, 1, 2]), (0, [])])
def test_batched_and_one_by_one_decodes_equal_dense_attention(threshold, batched, monkeypatch):
    out, expected, md = attend_decodes(threshold, monkeypatch)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    assert md.decode_rows == batched and sorted(md.decode_rows + md.prefill_rows) == [0, 1, 2, 3]


@pytest.mark.parametrize("threshold", [0, 10**6])
def test_the_engine_gives_the_greedy_tokens_of_generate_either_way(threshold, monkeypatch, model):
    monkeypatch.setattr(paged, "DECODE_BATCH_MAX_SLOTS", threshold)
    requests = make_workload("mixture", 6, arrival="poisson", rate=200.0, vocab_size=320, seed=8, scale=0.25)
    engine = Engine(model, EngineSpec(block_size=8, scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=48,
                                                                    max_model_len=256)))
    records = engine.run(requests, clock="virtual")
    assert all(r.status == "completed" for r in records)
    for r in requests:
        ref = kvlab.generate(model, r.prompt, cache="dynamic", max_new_tokens=r.max_new_tokens).tokens
        assert engine.sequences[r.request_id].output_token_ids == ref, f"request {r.request_id}"
