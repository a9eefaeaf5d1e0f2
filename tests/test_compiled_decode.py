"""The serving engine's decode step compiled per batch size: the eager engine's tokens, padded batches included."""
from __future__ import annotations

import pytest
import torch

from kvlab.cache.base import causal_attention
from kvlab.http.peer import kvlab_server
from kvlab.serving import Engine, PagedKVCache
from kvlab.serving.compiled_decode import CompiledDecode, DecodeBatch
from kvlab.serving.config import SERVE_SPEC
from kvlab.serving.executor import ModelExecutor
from kvlab.workload import make_workload

from engine_tokens import tokens_of


def greedy_tokens(model, compile_sizes: tuple[int, ...] = (), backend="eager", n: int = 7):
    """Every token of ``n`` requests sent at once (decode batches of 1 to n, some above the largest size), and the
    engine's compiled step (None without ``compile_sizes``)."""
    executor = ModelExecutor(model)
    engine = Engine(model, SERVE_SPEC.replace(max_seqs=8, max_batch_tokens=64), executor=executor)
    if compile_sizes:  # as ModelExecutor(model, compile_sizes) does, with a backend of the test's choice
        executor.compiled = CompiledDecode(model, executor._paged_cache(), compile_sizes, backend=backend)
        executor.compiled.compile_all()
        assert all(not pool[0].any() for pool in executor._paged_cache().key_cache)  # the compile's writes undone
    tokens = tokens_of(engine, make_workload("short_short", n, arrival="all_at_once", seed=3,
                                             vocab_size=model.config.vocab_size))
    return tokens, executor.compiled


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.full)])
def test_compiled_decode_gives_the_eager_engines_tokens(model, backend):
    """The same greedy tokens with and without the compiled step (batches padded up to 4 among its steps; steps of
    more decodes than 4 run eagerly)."""
    expected, _ = greedy_tokens(model)
    got, compiled = greedy_tokens(model, (1, 4), backend)
    assert got == expected and sum(map(len, got.values())) > 50
    assert compiled.num_steps > 0 and compiled.fallback is None and set(compiled.compile_s) == {1, 4}


def test_a_decode_batch_attends_each_row_over_its_own_blocks():
    """DecodeBatch.attend against dense attention per row: uneven contexts, a padded row repeating row 0."""
    torch.manual_seed(0)
    nh, nkv, hs, bs = 4, 2, 8, 4
    cache = PagedKVCache(1, nkv, hs, num_blocks=16, block_size=bs)
    tables, stored = [[7, 2, 9], [5], [7, 2, 9]], [9, 2, 9]  # row 2 pads: row 0 again
    dense_k = [torch.randn(1, nkv, s + 1, hs) for s in stored[:2]]
    dense_v = [torch.randn(1, nkv, s + 1, hs) for s in stored[:2]]
    for table, s, k, v in zip(tables, stored, dense_k, dense_v):
        for pos in range(s):
            cache.key_cache[0][table[pos // bs], pos % bs] = k[0, :, pos]
            cache.value_cache[0][table[pos // bs], pos % bs] = v[0, :, pos]
    q = torch.randn(2, nh, 1, hs)
    rows = [0, 1, 0]
    width = 3
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
    slots = torch.tensor([tables[i][stored[i] // bs] * bs + stored[i] % bs for i in range(3)])
    batch = DecodeBatch(cache, slots, block_tables, torch.tensor(stored) + 1)
    new_k = torch.stack([dense_k[r][0, :, -1:] for r in rows])  # (3, nkv, 1, hs)
    new_v = torch.stack([dense_v[r][0, :, -1:] for r in rows])
    out = batch.attend(0, q[rows], new_k, new_v)  # (3, nh, 1, hs)
    expected = torch.cat([causal_attention(q[i:i + 1], dense_k[i], dense_v[i]) for i in range(2)])
    torch.testing.assert_close(out[:2], expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[2], out[0])


def test_a_compiler_that_fails_leaves_every_step_eager(model, capsys):
    def broken(gm, example_inputs):
        raise RuntimeError("no C++ compiler on this machine")

    expected, _ = greedy_tokens(model)
    got, compiled = greedy_tokens(model, (2,), broken)
    assert got == expected
    assert "no C++ compiler" in (compiled.fallback or "") and not compiled.accepts(1, 1) and compiled.num_steps == 0
    assert "decode steps run uncompiled" in capsys.readouterr().err


@pytest.mark.parametrize("sizes", [(), (0, 2), (1.5,), (True,)])
def test_sizes_must_be_positive_whole_batches(model, sizes):
    cache = PagedKVCache(model.config.num_layers, model.config.num_kv_heads, model.config.head_dim, num_blocks=4)
    with pytest.raises(ValueError, match="sizes must be positive whole batch sizes"):
        CompiledDecode(model, cache, sizes=sizes)


def test_kvlab_serve_at_its_best_compiles_and_reads_in_place_and_says_so(model, tmp_path):
    """`kvlab_server(spec=BEST_SPEC)` runs `serve --compile-decode --attention in_place --compile-mixed`, recorded in
    its settings, with longer to start; PEER_SPEC (the lessons' peers), none of them and the usual start timeout."""
    from kvlab.http.peer import BEST_SPEC, PEER_SPEC
    from kvlab.http.shared_checkpoint import save_shared_checkpoint

    folder = save_shared_checkpoint(model, tmp_path / "ckpt")
    on, off = kvlab_server(folder, spec=BEST_SPEC), kvlab_server(folder)
    assert BEST_SPEC == PEER_SPEC.replace(compile_sizes=(1, 2, 4, 8, 16), attention="in_place", compile_mixed=True)
    assert "--compile-decode" in on.args and "--compile-decode" not in off.args
    assert "--compile-mixed" in on.args and "--compile-mixed" not in off.args
    assert (on.settings["compile_mixed"], off.settings["compile_mixed"]) == (True, False)
    assert on.args[on.args.index("--attention") + 1] == "in_place" and "--attention" not in off.args
    assert on.settings["compile_sizes"] == [1, 2, 4, 8, 16] and off.settings["compile_sizes"] == []
    assert (on.settings["attention"], off.settings["attention"]) == ("in_place", "gather")
    assert on.start_timeout_s > off.start_timeout_s


def test_a_decode_batch_runs_compiled_only_while_its_padding_stays_small(model):
    """Padded to its size and to its longest row, a batch runs compiled while it reads no more slots than the eager
    path's batched decodes (DECODE_BATCH_MAX_SLOTS): one long row compiles, sixteen rows beside a long one do not."""
    from kvlab.cache.paged import DECODE_BATCH_MAX_SLOTS

    cache = PagedKVCache(model.config.num_layers, model.config.num_kv_heads, model.config.head_dim, num_blocks=4)
    compiled = CompiledDecode(model, cache, sizes=(1, 4, 16), backend="eager")
    longest = DECODE_BATCH_MAX_SLOTS // cache.block_size  # blocks
    assert compiled.accepts(1, longest) and compiled.accepts(3, longest // 4)
    assert not compiled.accepts(3, longest // 4 + 1) and not compiled.accepts(16, longest // 8)
    assert not compiled.accepts(17, 1)  # above the largest size: eager


@torch.inference_mode()
def test_a_shape_without_a_program_runs_eagerly_rather_than_compiling_mid_serving(model):
    """Once serving, a step whose shapes no program was built for runs eagerly (same logits), never compiles."""
    executor = ModelExecutor(model)
    Engine(model, SERVE_SPEC, executor=executor)
    cache = executor._paged_cache()
    compiled = CompiledDecode(model, cache, sizes=(1,), backend="eager")
    compiled.compile_all()
    args = ([3], [5], [[2]])
    served = compiled(*args)
    assert compiled.num_steps == 1 and compiled.num_eager_steps == 0
    torch._dynamo.reset()  # the programs forgotten: the same call would have to compile again
    again = compiled(*args)
    assert compiled.num_steps == 1 and compiled.num_eager_steps == 1
    torch.testing.assert_close(again, served)


def test_the_model_executor_compiles_at_start_and_replays_decode_steps(model, monkeypatch):
    """`ModelExecutor(model, compile_sizes)`: the programs are built when the engine makes its cache, before any
    request, and a lone request's decode steps run them (its prompt step runs eagerly)."""
    import functools

    import kvlab.serving.executor as executor_module

    monkeypatch.setattr(executor_module, "CompiledDecode", functools.partial(CompiledDecode, backend="eager"))
    executor = ModelExecutor(model, compile_sizes=(1, 2))
    engine = Engine(model, SERVE_SPEC, executor=executor)
    assert executor.compiled is not None and set(executor.compiled.compile_s) == {1, 2}
    engine.add_request(make_workload("short_short", 1, arrival="all_at_once", seed=1,
                                     vocab_size=model.config.vocab_size)[0])
    steps = 0
    while engine.scheduler.running or engine.scheduler.waiting:
        engine.step()
        steps += 1
    assert executor.compiled.num_steps == steps - 1 > 0
