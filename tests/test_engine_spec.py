"""EngineSpec: an engine's settings checked once where they are made, changed by name, read from a command line,
and the one way an engine is built, real or simulated."""
from __future__ import annotations

import argparse

import pytest
import torch

import kvlab
from kvlab.http.peer import BEST_SPEC
from kvlab.http.server import add_arguments
from kvlab.http.settings import ServerSettings
from kvlab.serving.block_manager import BlockManager
from kvlab.serving.config import SERVE_SPEC, EngineSpec, add_engine_arguments, engine_args, spec_from_args
from kvlab.serving.cost_model import CostModelExecutor, load_calibration
from kvlab.serving.engine import Engine
from kvlab.serving.scheduler import SchedulerConfig
from kvlab.experiments.presets import LESSON_SPEC, MAX_MODEL_LEN, MAX_WAITING


@pytest.mark.parametrize("bad", [0, -4, 2.5, True, "16"])
def test_a_block_size_that_is_not_a_positive_whole_number_is_refused_with_the_same_words_everywhere(bad):
    """One check (kvlab.cache.paged.check_pool_geometry), whoever is given the block size first."""
    for make in (lambda: EngineSpec(block_size=bad), lambda: BlockManager(8, bad)):
        with pytest.raises(ValueError, match="block_size must be a positive integer number of tokens"):
            make()


@pytest.mark.parametrize("field,bad,words", [("kv_budget_bytes", 0, "kv_budget_bytes must be a whole number"),
                                             ("kv_budget_bytes", 1.5, "kv_budget_bytes must be a whole number"),
                                             ("seed", "1", "seed must be an integer"),
                                             ("compile_sizes", [1, 2], "compile_sizes must be a tuple"),
                                             ("compile_sizes", (0,), "compile_sizes must be a tuple of positive"),
                                             ("attention", "paged", "attention must be one of gather, in_place"),
                                             ("compile_mixed", "yes", "compile_mixed must be True or False")])
def test_bad_values_are_refused_where_the_spec_is_made(field, bad, words):
    with pytest.raises(ValueError, match=words):
        EngineSpec(**{field: bad})
    with pytest.raises(TypeError, match="scheduler= takes a SchedulerConfig"):
        EngineSpec(scheduler={"max_seqs": 4})  # type: ignore[arg-type]  # the mistake under test


def test_replace_changes_scheduler_fields_by_their_own_names_and_checks_again():
    spec = EngineSpec().replace(max_seqs=4, max_batch_tokens=64, seed=3)
    assert (spec.scheduler.max_seqs, spec.scheduler.max_batch_tokens, spec.seed) == (4, 64, 3)
    assert EngineSpec().scheduler.max_seqs == SchedulerConfig().max_seqs  # the original is unchanged (frozen)
    with pytest.raises(TypeError, match="no field max_seq"):
        EngineSpec().replace(max_seq=4)
    with pytest.raises(ValueError, match="max_seqs must be an integer >= 1"):
        EngineSpec().replace(max_seqs=0)


def test_the_presets_say_what_differs_from_the_defaults():
    assert SERVE_SPEC.scheduler.max_waiting == 64 and SERVE_SPEC.replace(max_waiting=None) == EngineSpec()
    assert (LESSON_SPEC.scheduler.max_waiting, LESSON_SPEC.scheduler.max_model_len) == (MAX_WAITING, MAX_MODEL_LEN)


def test_the_command_line_reads_back_the_spec_it_describes():
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, SERVE_SPEC)
    parser.add_argument("--seed", type=int, default=0)
    assert spec_from_args(parser.parse_args([])) == SERVE_SPEC
    spec = spec_from_args(parser.parse_args(["--block-size", "8", "--kv-budget-mb", "2", "--no-prefix-caching",
                                             "--max-seqs", "4", "--max-waiting", "0", "--seed", "7"]))
    assert spec == EngineSpec(block_size=8, kv_budget_bytes=2 * 2**20, enable_prefix_caching=False,
                              scheduler=SchedulerConfig(max_seqs=4, max_waiting=None), seed=7)


def test_the_servers_settings_hold_the_spec_and_refuse_a_bad_one_before_any_model_loads():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = ServerSettings.from_args(parser.parse_args(["--block-size", "32", "--max-seqs", "8"]))
    assert settings.engine == SERVE_SPEC.replace(block_size=32, max_seqs=8)
    assert ServerSettings().engine == SERVE_SPEC
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        ServerSettings.from_args(parser.parse_args(["--block-size", "0", "--model", "no-such-checkpoint"]))


def test_the_engine_is_built_from_the_spec_whole():
    model = kvlab.build_model(kvlab.tiny_llama(), seed=0)
    spec = EngineSpec(block_size=8, kv_budget_bytes=64 * 8 * model.config.kv_bytes_per_token(), seed=5,
                      enable_prefix_caching=False, kv_dtype=torch.float32,
                      scheduler=SchedulerConfig(max_seqs=3, max_batch_tokens=32, max_model_len=128))
    engine = Engine(model, spec)
    assert engine.spec is spec
    assert (engine.block_size, engine.num_blocks, engine.seed, engine.enable_prefix_caching) == (8, 64, 5, False)
    assert engine.scheduler_config is spec.scheduler and engine.block_manager.block_size == 8
    with pytest.raises(TypeError, match="spec takes an EngineSpec"):
        Engine(model, SchedulerConfig())  # type: ignore[arg-type]  # the old keyword's value in the spec's place


def test_a_cost_model_makes_the_simulator_on_its_own_block_size():
    cost_model = load_calibration("llama-30m")
    engine = Engine(cost_model, LESSON_SPEC)
    assert isinstance(engine.executor, CostModelExecutor) and engine.model is None
    assert engine.config.name == cost_model.config_name and engine.block_size == cost_model.block_size
    records = engine.run(kvlab.make_workload("short_short", 4, arrival="all_at_once", seed=0, max_context=engine.max_model_len),
                         clock="virtual")
    assert all(r.status == "completed" for r in records)
    with pytest.raises(ValueError, match=r"calibrated with blocks of 16 tokens.*spec.replace\(block_size=16\)"):
        Engine(cost_model, LESSON_SPEC.replace(block_size=32))


def test_an_engine_in_its_own_process_leaves_one_core_to_the_front_end_and_never_asks_for_none():
    """kvlab serve's default torch threads with the engine in a process of its own: every core but one (vLLM's CPU
    split), at least one; in a process allowed a single core, still one."""
    import os
    import subprocess
    import sys

    from kvlab.http.server import engine_process_threads

    assert engine_process_threads() == max(1, len(os.sched_getaffinity(0)) - 1)
    one_core = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
                "from kvlab.http.server import engine_process_threads; print(engine_process_threads())")
    assert subprocess.run([sys.executable, "-c", one_core], capture_output=True, text=True,
                          check=True).stdout.strip() == "1"


@pytest.mark.parametrize("spec", [
    SERVE_SPEC,
    SERVE_SPEC.replace(block_size=8, kv_budget_bytes=3 * 2**20 + 4096, enable_prefix_caching=False, seed=7,
                       policy="static", priority="prefill_first", max_seqs=3, max_batch_tokens=40, chunked_prefill=False,
                       max_waiting=None, max_model_len=40, batch_wait_s=0.25),
    LESSON_SPEC.replace(max_waiting=4096),
    BEST_SPEC,  # compiled decode, in-place attention, compiled prompt-chunk steps
])
def test_a_spec_spelled_as_serves_options_reads_back_whole(spec):
    """What a peer server is started with (engine_args) is what its own process reads (spec_from_args): the spec
    crosses the process boundary whole, budget to the byte."""
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser, SERVE_SPEC)
    parser.add_argument("--seed", type=int, default=0)
    assert spec_from_args(parser.parse_args(engine_args(spec))) == spec


def test_what_has_no_option_is_refused_rather_than_dropped():
    with pytest.raises(ValueError, match="kv_dtype has no command-line option"):
        engine_args(SERVE_SPEC.replace(kv_dtype=torch.float16))
    with pytest.raises(ValueError, match=r"compile_sizes=\(1, 3\) has no command-line option"):
        engine_args(SERVE_SPEC.replace(compile_sizes=(1, 3)))
    with pytest.raises(ValueError, match="admission rule is code"):
        engine_args(SERVE_SPEC.replace(admission=lambda *a: [], chunked_prefill=False, max_batch_tokens=4096))
