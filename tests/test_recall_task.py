"""The associative-recall task and the shipped checkpoint trained on it."""
from __future__ import annotations

import json
import random

import pytest
import torch

import kvlab
from kvlab.experiments.recall import (ANSWER_TOKENS, PAIR_TOKENS, QUERY_TOKENS, RECALL_MODEL_DIR, load_recall_model,
                                make_examples, score, training_batch)

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`


def facts(prompt: str) -> dict[str, str]:
    """Parse the pairs back out of a prompt, independently of the generator."""
    context, _ = prompt.split("?")
    pairs = [p.split(":") for p in context.split(";") if p]
    return {k: v for k, v in pairs}


# -- the generator --------------------------------------------------------------------------
def test_the_same_seed_gives_the_same_examples():
    assert make_examples(20, 8, seed=3) == make_examples(20, 8, seed=3)
    assert make_examples(20, 8, seed=3) != make_examples(20, 8, seed=4)


def test_answers_are_the_queried_keys_values():
    for ex in make_examples(100, 12, seed=0):
        table = facts(ex.prompt)
        assert len(table) == 12  # keys are distinct within a context
        key = ex.prompt.rsplit("?", 1)[1].rstrip(":")
        assert ex.answer == table[key] + "."
        assert ex.prompt.endswith(f"?{key}:")
        assert len(ex.prompt_ids) == 12 * PAIR_TOKENS + QUERY_TOKENS and len(ex.answer_ids) == ANSWER_TOKENS


def test_distances_are_measured_from_the_fact_and_span_the_context():
    examples = make_examples(400, 16, seed=1)
    for ex in examples:
        key = ex.prompt.rsplit("?", 1)[1].rstrip(":")
        assert ex.distance == len(ex.prompt) - ex.prompt.index(key + ":")  # counted from the fact's first token
    distances = {ex.distance for ex in examples}
    assert min(distances) == PAIR_TOKENS + QUERY_TOKENS  # the last pair, right before the query
    assert max(distances) == 16 * PAIR_TOKENS + QUERY_TOKENS  # the first pair, the whole context away
    assert {ex.pair_index for ex in examples} == set(range(16))  # every position gets queried


def test_training_batches_put_targets_on_queries_only():
    ids, targets, is_answer = training_batch(4, 6, 3, random.Random(0))
    tok = kvlab.ByteTokenizer()
    context_tokens = 6 * PAIR_TOKENS
    for row_ids, row_t, row_a in zip(ids.tolist(), targets.tolist(), is_answer.tolist()):
        full = row_ids + tok.encode(".")  # the final "." is only a target, never an input
        text = tok.decode(full)
        table = facts(text.split("?", 1)[0] + "?")
        queries = [q.split(":") for q in text.split("?")[1:]]  # [["kxx", "vyy."], ...]
        assert len(queries) == 3 and all(table[k] + "." == v for k, v in queries)  # answers are correct
        assert all(t == -100 or t == full[i + 1] for i, t in enumerate(row_t))  # targets are next tokens
        assert row_t[:context_tokens] == [-100] * context_tokens  # the random context teaches nothing
        answers = tok.decode([t for t, a in zip(row_t, row_a) if a])
        assert answers == "".join(v for _, v in queries)  # 4 answer tokens per query: "vyy."
        digits = tok.decode([t for t, a in zip(row_t, row_a) if t >= 0 and not a])
        assert digits == "".join(k[1:] for k, _ in queries)  # plus the queried key's two digits


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="num_pairs"):
        make_examples(3, 0)
    with pytest.raises(ValueError, match="num_pairs"):
        make_examples(3, 300)
    with pytest.raises(ValueError, match="positive"):
        make_examples(0, 4)


# -- the shipped checkpoint --------------------------------------------------------------------
@pytest.fixture(scope="module")
def shipped(device):
    """The shipped recall checkpoint on the test device (tests/conftest.py)."""
    return load_recall_model(device=device)


def test_the_checkpoint_ships_as_small_safetensors_with_its_record():
    weights = list(RECALL_MODEL_DIR.glob("*.safetensors"))
    assert weights and sum(w.stat().st_size for w in weights) <= 10 * 2**20
    record = json.loads((RECALL_MODEL_DIR / "training.json").read_text())
    assert record["held_out"]["accuracy"] >= 0.95
    assert (RECALL_MODEL_DIR / "README.md").is_file()


def test_the_checkpoint_loads_offline_with_the_byte_tokenizer(shipped, monkeypatch, device):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = kvlab.from_pretrained(RECALL_MODEL_DIR, device=device)  # the same loader as every model
    assert isinstance(model.tokenizer, kvlab.ByteTokenizer)
    record = json.loads((RECALL_MODEL_DIR / "training.json").read_text())
    for key in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "vocab_size"):
        assert getattr(model.config, key) == record["model"][key]
    for a, b in zip(model.parameters(), shipped.parameters()):
        assert torch.equal(a, b)


def test_the_checkpoint_recalls_held_out_facts_with_the_exact_cache(shipped):
    record = json.loads((RECALL_MODEL_DIR / "training.json").read_text())
    num_pairs = record["held_out"]["num_pairs"]
    seed = record["held_out"]["seed"] + 1  # a seed neither training nor the script's evaluation used
    result = score(shipped, make_examples(150, num_pairs, seed=seed), cache="dynamic")
    assert result.accuracy >= 0.95, result.by_distance
    assert result.by_distance["examples"].sum() == 150
    # the prompt reads as text and the answer comes back as text
    ex = make_examples(1, num_pairs, seed=seed)[0]
    assert kvlab.generate(shipped, ex.prompt, max_new_tokens=4).text == ex.answer


def test_a_missing_checkpoint_names_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="train_recall.py"):
        load_recall_model(tmp_path)
