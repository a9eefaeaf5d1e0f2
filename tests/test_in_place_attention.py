"""Decode attention read in the pool (kvlab.cache.in_place_attention): dense attention per row is the oracle.

Building the kernel takes about a minute on a fresh machine, so every test that builds it is in the full tier; the
default run checks what needs no build (the option's validation, and which pools keep the torch path).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kvlab.cache import in_place_attention
from kvlab.cache.paged import PagedKVCache
from kvlab.serving import Engine
from kvlab.serving.compiled_decode import CompiledDecode
from kvlab.serving.config import SERVE_SPEC
from kvlab.serving.executor import ModelExecutor
from kvlab.workload import make_workload

from engine_tokens import tokens_of


def test_an_unknown_attention_backend_is_refused_before_any_pool_is_made():
    with pytest.raises(ValueError, match="attention must be one of gather, in_place"):
        PagedKVCache(1, 2, 8, num_blocks=4, block_size=4, attention="paged")


def test_pools_the_kernel_does_not_read_keep_the_torch_path():
    """float64 (and any pool off the CPU) never builds the kernel: in_place falls back to the gather path."""
    assert not in_place_attention.applies(torch.zeros(1, dtype=torch.float64))
    cache = PagedKVCache(1, 2, 8, num_blocks=4, block_size=4, dtype=torch.float64, attention="in_place")
    assert not cache.in_place


def test_a_machine_that_cannot_build_the_kernel_is_told_what_to_use_before_any_step(monkeypatch):
    """No C++ compiler (the build raises): the pool is refused when it is made, saying to use the gather path."""
    import torch.utils.cpp_extension

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Error building extension: g++: not found")

    monkeypatch.setattr(torch.utils.cpp_extension, "load_inline", no_compiler)
    in_place_attention.load.cache_clear()
    try:
        with pytest.raises(in_place_attention.KernelUnavailable, match=r"g\+\+: not found.*attention='gather'"):
            PagedKVCache(1, 2, 8, num_blocks=4, block_size=4, attention="in_place")
    finally:
        in_place_attention.load.cache_clear()  # a later test builds (or loads) it for real


@pytest.mark.full
def test_the_kernel_matches_dense_attention_per_row_and_reads_no_slot_past_a_length():
    """Uneven contexts, grouped heads, tables padded with a block full of NaN that must never be read; a NaN in one
    row's own keys stays in that row (a fault stays in its request)."""
    in_place_attention.load()
    torch.manual_seed(0)
    nh, nkv, hs, bs, nb = 8, 4, 32, 16, 40
    k_pool, v_pool = torch.randn(nb, bs, nkv, hs), torch.randn(nb, bs, nkv, hs)
    k_pool[0] = v_pool[0] = float("nan")  # the padding block
    tables = [[3, 9, 1], [5], [12, 7, 30, 2, 8], [6, 4]]
    lens = [40, 1, 77, 32]  # the last fills its two blocks exactly
    width = max(map(len, tables))
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    q = torch.randn(len(tables), nh, hs)
    got = in_place_attention.paged_decode_attention(q, k_pool, v_pool, block_tables, torch.tensor(lens))
    for i, (table, n) in enumerate(zip(tables, lens)):
        keys = k_pool[table].reshape(-1, nkv, hs)[:n].transpose(0, 1)[None]  # (1, nkv, n, hs)
        values = v_pool[table].reshape(-1, nkv, hs)[:n].transpose(0, 1)[None]
        want = F.scaled_dot_product_attention(q[i][None, :, None], keys, values, enable_gqa=True)[0, :, 0]
        print(f"row {i}: context {n}, max |kernel - dense| {(got[i] - want).abs().max():.2e}")
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)
    k_pool[5, 0, 1, 3] = float("nan")  # row 1's only key
    got = in_place_attention.paged_decode_attention(q, k_pool, v_pool, block_tables, torch.tensor(lens))
    assert got[1].isnan().any() and got[[0, 2, 3]].isfinite().all()
    bad = block_tables.clone()
    bad[2, 4] = nb  # past the pool: raised in the step, never read (the engine fails that step's requests alone)
    with pytest.raises(RuntimeError, match=f"row 2 names block {nb} of a pool of {nb}"):
        in_place_attention.paged_decode_attention(q, k_pool, v_pool, bad, torch.tensor(lens))
    with pytest.raises(RuntimeError, match="row 0 attends over 81 slots, its table holds 80"):
        in_place_attention.paged_decode_attention(q, k_pool, v_pool, block_tables, torch.tensor([81] + lens[1:]))



@pytest.mark.parametrize("nh, nkv, hs, bs", [(4, 2, 32, 16), (8, 1, 64, 5), (4, 4, 128, 24), (80, 1, 32, 16),
                                             (6, 2, 16, 7), (6, 3, 48, 1)])
def test_the_kernel_matches_dense_attention_on_every_geometry(nh, nkv, hs, bs):
    """Head sizes with a vectorised path (32, 64, 128 where the CPU has AVX2) and without (16, 48); blocks shorter than
    the 8 slots scored together (1, 5, 7), longer than a chunk of 16 (24); one to 40 query heads per KV head."""
    in_place_attention.load()
    torch.manual_seed(1)
    lens = [1, 7, 8, 9, 16, 17, 40, 123]
    width = max(-(-n // bs) for n in lens)
    nb = len(lens) * width + 1
    k_pool, v_pool = torch.randn(nb, bs, nkv, hs), torch.randn(nb, bs, nkv, hs)
    block_tables = (torch.randperm(nb - 1) + 1)[:len(lens) * width].view(len(lens), width)
    q = torch.randn(len(lens), nh, hs)
    got = in_place_attention.paged_decode_attention(q, k_pool, v_pool, block_tables, torch.tensor(lens))
    for i, n in enumerate(lens):
        keys = k_pool[block_tables[i]].reshape(-1, nkv, hs)[:n].transpose(0, 1)[None]  # (1, nkv, n, hs)
        values = v_pool[block_tables[i]].reshape(-1, nkv, hs)[:n].transpose(0, 1)[None]
        want = F.scaled_dot_product_attention(q[i][None, :, None], keys, values, enable_gqa=True)[0, :, 0]
        torch.testing.assert_close(got[i], want, rtol=1e-5, atol=1e-5)

def greedy_tokens(model, attention: str, compile_sizes: tuple[int, ...] = ()) -> dict:
    """Every token of 10 long-prompt requests at once: 8 decode together over about 2,500-3,800 slots, past the
    gather path's cap (DECODE_BATCH_MAX_SLOTS), so the gather path attends them one by one. With ``compile_sizes``
    the decode steps run compiled (torch.compile's ``eager`` backend: traced through the kernel's fake, quick)."""
    spec = SERVE_SPEC.replace(max_seqs=8, max_batch_tokens=512, attention=attention)
    engine = Engine(model, spec)  # the spec's attention reaches the executor's cache
    executor = engine.executor
    assert isinstance(executor, ModelExecutor) and executor._paged_cache().in_place == (attention == "in_place")
    if compile_sizes:
        executor.compiled = CompiledDecode(model, executor._paged_cache(), compile_sizes, backend="eager")
        executor.compiled.compile_all()
    tokens = tokens_of(engine, make_workload("long_short", 10, arrival="all_at_once", seed=5,
                                             vocab_size=model.config.vocab_size))
    if compile_sizes:  # past the gather path's cap, every decode step ran compiled
        assert executor.compiled.num_steps > 20 and executor.compiled.num_eager_steps == 0
    return tokens


@pytest.mark.full
def test_the_engine_gives_the_gather_paths_tokens_with_the_kernel(model):
    expected = greedy_tokens(model, "gather")
    assert sum(map(len, expected.values())) >= 80
    assert greedy_tokens(model, "in_place") == expected
    try:
        assert greedy_tokens(model, "in_place", compile_sizes=(1, 2, 4, 8)) == expected
    finally:
        torch._dynamo.reset()  # no compiled frames left for a later test's own backend to find


@pytest.mark.full
def test_kvlab_serve_with_the_kernel_answers_as_with_the_gather_path(tmp_path):
    """`serve --attention in_place` across the process boundary: its engine's process builds (or loads) the kernel,
    records the setting, and streams the gather server's greedy text."""
    from kvlab.experiments.two_engines import lesson_checkpoint, same_greedy_answer, start_together
    from kvlab.http.peer import PEER_SPEC, kvlab_server

    folder = lesson_checkpoint(tmp_path / "recall-tiny")
    gather, in_place = kvlab_server(folder), kvlab_server(folder, spec=PEER_SPEC.replace(attention="in_place"))
    in_place.name = "kvlab serve, in place"
    assert "--attention" in in_place.args and in_place.settings["attention"] == "in_place"
    servers = start_together([gather, in_place])
    try:
        answers = same_greedy_answer(servers, max_tokens=32)
    finally:
        for s in servers:
            s.stop()
    assert len(answers["answers"]) == 2 and answers["same"], answers
