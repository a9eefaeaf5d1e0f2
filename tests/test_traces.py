"""Trace replay with shared prefixes: Mooncake's format, exact block sharing, ideal and achieved prefix-cache hits."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure

import kvlab
from kvlab.cli import main as cli_main
from kvlab.experiments.service_curves import scheduler_config
from kvlab.experiments.prefix_traces import (caching_on_off, capacity_curve, ideal_hit_ratio, prefix_sharing,
                                             reachable_hits, trace_curve, trace_engine)
from kvlab.http.loadgen import PRINTABLE_FIRST, http_workload
from kvlab.lessons.l08_prefix_and_chunks.figures import plot_prefix_cache
from kvlab.results_io import load_results
from kvlab.serving.cost_model import CostModel
from kvlab.serving.config import EngineSpec
from kvlab.traces import (MOONCAKE_SAMPLE_TRACE, SAMPLE_TRACE, SAMPLE_TRACES, block_token_ids, detect_format,
                          mooncake_frame, read_mooncake_trace, replay_mooncake, replay_trace_file, trace_requests)
from kvlab.workload import at_rate, trace_rate

LESSONS = ("06", "08")  # the lessons these tests belong to: `pytest -m lNN`

REPO = Path(__file__).resolve().parents[1]
ROUND = dict(step=0.02, prefill_tokens=1e-3, attention_calls=1e-4, decode_seqs=1e-3, decode_kv_slots=1e-5,
             prefill_attention=1e-6)
BS = 16  # the engine's block size; the trace's 512-token blocks / 16 = 32 tokens = 2 engine blocks
VOCAB = kvlab.llama_30m().vocab_size

# A hand-made trace, one request every 10 s (each is served before the next arrives). In trace tokens;
# replayed with lengths / 16, so a block is 32 tokens.
HAND_MADE = [
    {"timestamp": 0, "input_length": 1024, "output_length": 64, "hash_ids": [1, 2]},
    {"timestamp": 10_000, "input_length": 1536, "output_length": 64, "hash_ids": [1, 2, 3]},  # extends the first
    {"timestamp": 20_000, "input_length": 1024, "output_length": 64, "hash_ids": [1, 4]},  # shares block 1 only
    {"timestamp": 30_000, "input_length": 1536, "output_length": 64, "hash_ids": [5, 2, 3]},  # 2, 3 after another 1st
    {"timestamp": 40_000, "input_length": 2048, "output_length": 64, "hash_ids": [1, 2, 3, 6]},
    {"timestamp": 50_000, "input_length": 1000, "output_length": 64, "hash_ids": [1, 7]},  # a partial last block
]
HIT_BLOCKS = [0, 2, 1, 0, 3, 1]  # in trace blocks: the chain of ids seen before
HIT_TOKENS = [0, 64, 32, 0, 96, 32]  # 1000 / 16 -> 63 tokens: block 1 (32) shared, block 7 (31) new
PROMPT_TOKENS = [64, 96, 64, 96, 128, 63]


def write_trace(path: Path, lines) -> Path:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


@pytest.fixture(scope="module")
def cost_model() -> CostModel:
    return CostModel(coefficients=ROUND, config=kvlab.llama_30m().to_dict(), settings={"block_size": BS})


@pytest.fixture
def hand_made(tmp_path) -> Path:
    return write_trace(tmp_path / "hand_made.jsonl", HAND_MADE)


@pytest.fixture
def frame(hand_made):
    return mooncake_frame(hand_made, length_scale=16)


# -- reading and scaling ---------------------------------------------------------------------------
def test_a_mooncake_trace_reads_as_arrivals_lengths_and_block_ids(hand_made):
    t = read_mooncake_trace(hand_made)
    assert t["arrival_s"].tolist() == [0, 10, 20, 30, 40, 50]
    assert t["prompt_tokens"].tolist() == [line["input_length"] for line in HAND_MADE]
    assert t["hash_ids"].tolist() == [tuple(line["hash_ids"]) for line in HAND_MADE]
    assert detect_format(hand_made) == "mooncake" and detect_format(SAMPLE_TRACE) == "azure"


def test_length_scaling_divides_the_block_too_so_the_sharing_is_kept(hand_made):
    whole, scaled = mooncake_frame(hand_made), mooncake_frame(hand_made, length_scale=16, time_scale=0.5)
    assert scaled["prompt_tokens"].tolist() == PROMPT_TOKENS and scaled["block_tokens"].iloc[0] == 32
    assert scaled["output_tokens"].tolist() == [4] * 6 and scaled["arrival_s"].tolist() == [0, 5, 10, 15, 20, 25]
    assert scaled["hash_ids"].tolist() == whole["hash_ids"].tolist()
    assert ideal_hit_ratio(scaled)["block_hit_ratio"] == ideal_hit_ratio(whole)["block_hit_ratio"]


def test_max_context_drops_the_trailing_blocks_of_a_cut_prompt(hand_made):
    f = mooncake_frame(hand_made, length_scale=16, max_context=84)  # 84 - 4 output tokens = 80 prompt tokens
    assert f["prompt_tokens"].tolist() == [64, 80, 64, 80, 80, 63]
    assert f["hash_ids"].tolist()[4] == (1, 2, 3) and f["clipped"].tolist() == [False, True, False, True, True, False]


# -- block sharing, exactly -----------------------------------------------------------------------------
def test_equal_block_ids_are_identical_token_blocks_and_different_ids_differ(frame):
    requests = trace_requests(frame, vocab_size=VOCAB)
    blocks = {}  # id -> its 32 tokens, wherever it appears
    for r, ids in zip(requests, frame["hash_ids"]):
        assert len(r.prompt) == r.prompt_tokens and all(0 <= t < VOCAB for t in r.prompt)
        for i, h in enumerate(ids):
            chunk = tuple(r.prompt[i * 32:(i + 1) * 32])
            known = blocks.setdefault(h, chunk)
            assert chunk == known[:len(chunk)]  # the partial last block is the start of the same block
    full = {h: b for h, b in blocks.items() if len(b) == 32}
    assert len(set(full.values())) == len(full)  # different ids, different tokens
    assert requests[1].prompt[:64] == requests[0].prompt and requests[3].prompt[32:96] == requests[1].prompt[32:96]


def test_different_ids_differ_by_construction_even_in_a_tiny_vocabulary():
    rows = block_token_ids(np.arange(1000), block_tokens=16, vocab_size=2, digits=10)  # 10 bits spell 0..999
    assert rows.shape == (1000, 16) and len({tuple(r) for r in rows}) == 1000 and set(np.unique(rows)) <= {0, 1}
    assert (block_token_ids([7, 7], 16, 2, 10)[0] == block_token_ids([7], 16, 2, 10)[0]).all()


# -- the ideal and the engine, exactly ------------------------------------------------------------------
def test_the_ideal_hit_ratio_of_a_hand_made_trace(frame, cost_model):
    per_request = prefix_sharing(frame)
    assert per_request["hit_blocks"].tolist() == HIT_BLOCKS and per_request["hit_tokens"].tolist() == HIT_TOKENS
    ideal = ideal_hit_ratio(frame)
    assert (ideal["blocks"], ideal["hit_blocks"]) == (16, 7)
    assert (ideal["prompt_tokens"], ideal["hit_tokens"]) == (sum(PROMPT_TOKENS), sum(HIT_TOKENS))
    assert cost_model.block_size == BS
    assert reachable_hits(trace_requests(frame, VOCAB), trace_engine(cost_model=cost_model))["hit_tokens"].tolist() == HIT_TOKENS


def test_with_a_cache_larger_than_the_trace_the_engine_reaches_the_ideal_exactly(frame, cost_model):
    curve = capacity_curve(frame, kv_blocks=[1000], cost_model=cost_model)
    row = curve.iloc[0]
    assert row["kv_share_of_footprint"] > 1
    assert row["hit_tokens"] == sum(HIT_TOKENS) and row["token_hit_ratio"] == row["ideal_token_hit_ratio"]
    assert row["block_hit_ratio"] == row["ideal_block_hit_ratio"] == 7 / 16  # 14 of 32 engine blocks
    assert row["prefill_tokens_computed"] == sum(PROMPT_TOKENS) - sum(HIT_TOKENS)


def test_a_small_pool_evicts_least_recently_used_blocks_and_the_engine_misses_them(tmp_path, cost_model):
    # A (4 engine blocks), then B (8) in a pool of 10: B evicts A's last two blocks, so when C
    # extends A it finds only A's first 32 tokens. Freed blocks go tail first, so the front of a
    # prefix is evicted last.
    path = write_trace(tmp_path / "evict.jsonl", [
        {"timestamp": 0, "input_length": 1024, "output_length": 16, "hash_ids": [1, 2]},
        {"timestamp": 10_000, "input_length": 2048, "output_length": 16, "hash_ids": [3, 4, 5, 6]},
        {"timestamp": 20_000, "input_length": 1536, "output_length": 16, "hash_ids": [1, 2, 7]}])
    f = mooncake_frame(path, length_scale=16)
    sched = scheduler_config(max_waiting=None, max_model_len=160)
    small = capacity_curve(f, kv_blocks=[10], cost_model=cost_model, scheduler=sched).iloc[0]
    big = capacity_curve(f, kv_blocks=[100], cost_model=cost_model, scheduler=sched).iloc[0]
    assert (small["hit_tokens"], big["hit_tokens"]) == (32, 64) and big["ideal_token_hit_ratio"] == 64 / 288
    assert small["token_hit_ratio"] == 32 / 288 and small["preemptions"] == 0


# -- nothing lost, nothing leaked ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def sample_curve(cost_model):
    frame = mooncake_frame(MOONCAKE_SAMPLE_TRACE, length_scale=16, max_context=1024)
    return capacity_curve(frame, points=3, cost_model=cost_model)


def test_every_request_is_accounted_for_and_no_block_stays_in_use(sample_curve):
    c = sample_curve
    assert (c["sent"] == 300).all() and (c["completed"] + c["failed"] == c["sent"]).all()
    assert (c["kv_blocks_in_use_after"] == 0).all() and c["preemptions"].iloc[0] > 0  # the smallest pool preempts
    assert c["token_hit_ratio"].is_monotonic_increasing  # more memory, more hits
    assert (c["token_hit_ratio"] <= c["reachable_token_hit_ratio"] + 1e-12).all()
    assert c["token_hit_ratio"].iloc[-1] > 0.9 * c["ideal_token_hit_ratio"].iloc[-1]


def test_caching_on_computes_fewer_prompt_tokens_and_answers_sooner_at_the_same_load(cost_model):
    frame = mooncake_frame(MOONCAKE_SAMPLE_TRACE, length_scale=16, max_context=1024, max_requests=120)
    t = caching_on_off(frame, cost_model=cost_model)
    on, off = t.iloc[0], t.iloc[1]
    assert bool(on["prefix_caching"]) and not off["prefix_caching"] and on["sent_rps"] == off["sent_rps"]
    assert off["prefill_tokens_computed"] == off["prompt_tokens"] and off["token_hit_ratio"] == 0
    assert on["prefill_tokens_computed"] < 0.7 * off["prefill_tokens_computed"]
    assert on["ttft_p50_s"] < off["ttft_p50_s"] and on["ttft_n"] == off["ttft_n"] == 120
    fig = plot_prefix_cache(capacity_curve(frame, points=2, cost_model=cost_model), t)
    assert isinstance(fig, Figure) and len(fig.axes) == 3


def test_a_bounded_queue_under_overload_still_accounts_for_every_request(cost_model):
    engine = trace_engine(cost_model=cost_model, scheduler=scheduler_config(max_seqs=4, max_waiting=8))
    curve = trace_curve(MOONCAKE_SAMPLE_TRACE, rates=[1.0, 40.0], length_scale=16, requests=100, engine=engine,
                        cost_model=cost_model)
    assert (curve["completed"] + curve["failed"] == 100).all() and curve["failed"].iloc[-1] > 0
    assert (curve["kv_blocks_in_use_after"] == 0).all()
    assert curve["time_scale"].iloc[0] == pytest.approx(curve.attrs["trace_rps"] / 1.0)


# -- the same requests, faster -------------------------------------------------------------------------
def test_at_rate_keeps_order_and_shares_and_sets_the_mean_rate():
    reqs = replay_mooncake(length_scale=16, max_requests=50, vocab_size=VOCAB)
    fast = at_rate(reqs, 10.0)
    assert trace_rate(fast) == pytest.approx(10.0)
    assert [r.prompt for r in fast] == [r.prompt for r in reqs]
    gaps, fast_gaps = np.diff([r.arrival_s for r in reqs]), np.diff([r.arrival_s for r in fast])
    assert np.allclose(fast_gaps, gaps * trace_rate(reqs) / 10.0)


# -- the shipped sample ----------------------------------------------------------------------------------
def test_the_shipped_mooncake_sample_is_small_synthetic_and_shares_like_production():
    assert SAMPLE_TRACES["mooncake"] == MOONCAKE_SAMPLE_TRACE and MOONCAKE_SAMPLE_TRACE.stat().st_size < 60_000
    t = read_mooncake_trace(MOONCAKE_SAMPLE_TRACE)
    assert len(t) == 300 and 60 < t["arrival_s"].iloc[-1] < 200
    ideal = ideal_hit_ratio(mooncake_frame(MOONCAKE_SAMPLE_TRACE))
    assert 0.35 < ideal["block_hit_ratio"] < 0.75  # Mooncake reports up to 50% hits on its traces
    # a multi-turn conversation: a later prompt starts with every block of an earlier one but its last
    ids = t["hash_ids"].tolist()
    assert any(len(a) > 2 and b[:len(a) - 1] == a[:-1] and len(b) > len(a)
               for i, a in enumerate(ids) for b in ids[i + 1:])
    assert "synthetic" in (MOONCAKE_SAMPLE_TRACE.parent / "README.md").read_text().lower()


def test_the_sample_is_what_the_script_writes():
    spec = importlib.util.spec_from_file_location("make_sample_trace", REPO / "scripts" / "make_sample_trace.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    written = [json.loads(line) for line in MOONCAKE_SAMPLE_TRACE.read_text().splitlines()]
    assert script.make_mooncake_trace(300, seed=0) == written


# -- the command lines ------------------------------------------------------------------------------------
@pytest.mark.parametrize("trace, scale", [(MOONCAKE_SAMPLE_TRACE, "16"), (SAMPLE_TRACE, "8")],
                         ids=["mooncake", "azure"])
def test_sweep_replays_either_format_at_rising_rates(trace, scale, tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert cli_main(["sweep", "--simulate", "--trace", str(trace), "--length-scale", scale, "--rates", "1,3,9",
                     "--requests", "60", "--json", str(out)]) == 0
    frame, meta = load_results(out)
    assert frame["offered_rps"].tolist() == [1, 3, 9] and (frame["completed"] + frame["failed"] == 60).all()
    assert meta["settings"]["trace_format"] == detect_format(trace) and meta["settings"]["length_scale"] == float(scale)
    shares = frame["token_hit_ratio"]
    assert (shares > 0.2).all() if detect_format(trace) == "mooncake" else (shares == 0).all()
    assert "time_scale" in capsys.readouterr().out


def test_sweep_replays_a_trace_through_the_real_engine(tmp_path, capsys):
    out = tmp_path / "real.json"
    assert cli_main(["sweep", "--trace", str(MOONCAKE_SAMPLE_TRACE), "--length-scale", "16", "--rates", "20",
                     "--requests", "6", "--json", str(out)]) == 0
    frame, meta = load_results(out)
    assert frame["completed"].iloc[0] == 6 and frame["executor"].iloc[0] == "model" and frame["clock"].iloc[0] == "wall"


def test_sweep_says_when_a_trace_does_not_fit_and_how_to_fix_it(capsys):
    assert cli_main(["sweep", "--simulate", "--trace", str(MOONCAKE_SAMPLE_TRACE), "--rates", "5",
                     "--requests", "20"]) == 0
    assert "raise --length-scale" in capsys.readouterr().err


def test_loadtest_workload_replays_a_mooncake_trace_in_printable_ids_with_its_sharing():
    reqs = http_workload(trace=MOONCAKE_SAMPLE_TRACE, trace_format=None, length_scale=16, num_requests=30)
    frame = mooncake_frame(MOONCAKE_SAMPLE_TRACE, length_scale=16, max_requests=30)
    assert all(PRINTABLE_FIRST <= t < PRINTABLE_FIRST + 95 for r in reqs for t in r.prompt)
    first = {}
    for r, ids in zip(reqs, frame["hash_ids"]):
        assert first.setdefault(ids[0], r.prompt[:32]) == r.prompt[:32]
    assert len(first) < len(reqs)  # some prompts do share their first block


# -- bad input ----------------------------------------------------------------------------------------------
GOOD = json.dumps(HAND_MADE[0])


@pytest.mark.parametrize("lines, message", [
    ([GOOD, "{not json"], r"line 2 is not JSON.*one JSON object per line"),
    ([GOOD, "[1, 2]"], r"line 2 holds list.*not an object"),
    ([GOOD, '{"timestamp": 5, "input_length": 10, "output_length": 1}'], r"line 2 lacks hash_ids; every line needs"),
    ([GOOD, '{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [0]}'],
     r"line 2: timestamp -5 must be a number of milliseconds >= 0"),
    ([GOOD, '{"timestamp": 5, "input_length": -10, "output_length": 1, "hash_ids": [0]}'],
     r"line 2: input_length -10 must be an integer >= 1"),
    ([GOOD, '{"timestamp": 5, "input_length": 10, "output_length": -1, "hash_ids": [0]}'],
     r"line 2: output_length -1 must be an integer >= 0"),
    ([GOOD, '{"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": [-3]}'],
     r"line 2: hash_ids must be a list of integers >= 0"),
    ([json.dumps({**HAND_MADE[0], "timestamp": 900}), GOOD],
     r"line 2: timestamp 0 ms is earlier than the line before \(900 ms\).*sort the lines by timestamp"),
    ([GOOD, "", json.dumps({**HAND_MADE[1], "hash_ids": [1, 2]})],
     r"line 3: input_length 1536 needs ceil\(1536/512\) = 3 hash_ids, found 2.*pass block_tokens="),
    ([""], r"has no requests"),
], ids=["not-json", "not-object", "missing-field", "negative-time", "negative-input", "negative-output",
        "negative-id", "non-monotone", "ids-vs-length", "empty"])
def test_a_malformed_trace_is_refused_naming_the_line_and_the_fix(tmp_path, lines, message):
    path = write_trace(tmp_path / "bad.jsonl", lines)
    with pytest.raises(ValueError, match=message):
        read_mooncake_trace(path)


def test_bad_replay_arguments_get_a_clear_error(hand_made, tmp_path):
    with pytest.raises(ValueError, match=r"length_scale=3 does not divide the trace's 512-token blocks.*1, 2, 4"):
        mooncake_frame(hand_made, length_scale=3)
    with pytest.raises(ValueError, match=r"block of 1 tokens cannot spell 8 different ids in base 4.*lower length_"):
        replay_mooncake(hand_made, length_scale=512, vocab_size=4)
    with pytest.raises(ValueError, match=r"unknown trace format 'parquet'; choose one of azure, mooncake"):
        replay_trace_file(hand_made, "parquet")
    with pytest.raises(ValueError, match=r"does not exist"):
        read_mooncake_trace(tmp_path / "nowhere.jsonl")


def test_loadtest_replays_a_mooncake_trace_against_kvlab_serve_and_its_prefix_cache_hits(model, tmp_path, capsys):
    from kvlab.http.loadtest import main as loadtest_main
    from kvlab.http.local import ServerThread
    from kvlab.http.server import create_app
    from kvlab.serving import Engine, SchedulerConfig

    engine = Engine(model, EngineSpec(scheduler=SchedulerConfig(max_seqs=4, max_batch_tokens=256)))
    with ServerThread(create_app(engine, "tiny-llama"), timeout_graceful_shutdown=2) as server:
        code = loadtest_main(["--url", server.url, "--trace", str(MOONCAKE_SAMPLE_TRACE), "--length-scale", "16",
                              "--time-scale", "0.05", "--num-requests", "12", "--ignore-eos", "--no-progress",
                              "--json", str(tmp_path / "run.json")])
        stats = engine.block_manager.stats()
    assert code == 0 and "12 sent, 12 completed, 0 failed" in capsys.readouterr().out
    assert stats.prefix_hit_tokens > 0  # the server's prefix cache found the trace's shared blocks
    _, meta = load_results(tmp_path / "run.json")
    assert meta["settings"]["workload"]["trace_format"] is None  # detected
