"""Quality vs the exact cache: KL, agreement, perplexity and recall accuracy are honest measures."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kvlab
from kvlab.cache import DynamicCache, NoCache
from kvlab.experiments.quality import (compare_distributions, compare_to_exact, perplexity, recall_accuracy,
                           teacher_forced_logits)

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`

PROMPT = "The cache keeps keys and values"


class NoisyKeysCache(DynamicCache):
    """A deliberately degraded cache: every stored key gets seeded Gaussian noise."""

    name = "noisy"

    def __init__(self, *args, scale: float = 0.5, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.scale, self.gen = scale, torch.Generator().manual_seed(0)

    def update(self, layer_idx, k, v):
        noise = torch.randn(k.shape, generator=self.gen) * self.scale * k.std()
        return super().update(layer_idx, k + noise, v)

    def reset(self) -> None:
        super().reset()
        self.gen.manual_seed(0)


@pytest.fixture(scope="module")
def model():
    # A larger init scale than the default 0.02 gives peaked, token-dependent distributions.
    m = kvlab.Decoder(kvlab.tiny_llama()).init_weights(seed=0, std=0.3)
    m.tokenizer = kvlab.ByteTokenizer()
    return m.eval()


def noisy(model, scale=0.5):
    c = model.config
    return NoisyKeysCache(c.num_layers, c.num_kv_heads, c.head_dim, scale=scale)


def test_kl_matches_a_hand_computed_case():
    exact = torch.tensor([[0.0, 0.0], [1.0, 2.0]], dtype=torch.float64)
    approx = torch.tensor([[0.0, math.log(3.0)], [1.0, 2.0]], dtype=torch.float64)
    f = compare_distributions(exact, approx)
    # p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3)
    assert f["kl"][0] == pytest.approx(0.5 * math.log(2) + 0.5 * math.log(2 / 3), abs=1e-12)
    assert f["kl"][1] == 0.0
    ref = F.kl_div(approx.log_softmax(-1), exact.log_softmax(-1), log_target=True, reduction="none").sum(-1)
    assert torch.allclose(torch.tensor(f["kl"].values, dtype=torch.float64), ref, atol=1e-12)
    assert f["top1_agree"].tolist() == [False, True]


def test_identical_distributions_give_kl_zero_and_full_agreement(model):
    logits = torch.randn(7, model.config.vocab_size, generator=torch.Generator().manual_seed(1))
    f = compare_distributions(logits, logits.clone())
    assert (f["kl"] == 0).all() and f["top1_agree"].all()
    report = compare_to_exact(model, PROMPT, "dynamic", max_new_tokens=12)
    assert report.kl_mean == 0.0 and report.kl_max == 0.0
    assert report.top1_agreement == 1.0
    assert report.greedy_agreement == 1.0 and report.greedy_prefix_agreement == 1.0
    assert report.first_divergence is None and report.positions == 12


def test_teacher_forced_cached_logits_match_the_uncached_forward(model):
    cont = kvlab.generate(model, PROMPT, max_new_tokens=10).tokens
    cached = teacher_forced_logits(model, PROMPT, cont, "dynamic")
    oracle = teacher_forced_logits(model, PROMPT, cont, "none")  # one full forward, no cache
    assert cached.shape == (10, model.config.vocab_size)
    torch.testing.assert_close(cached, oracle, atol=1e-4, rtol=1e-4)
    static = teacher_forced_logits(model, PROMPT, cont, "static", max_len=64)
    torch.testing.assert_close(static, oracle, atol=1e-4, rtol=1e-4)


def test_a_degraded_cache_shows_kl_above_zero(model):
    report = compare_to_exact(model, [PROMPT, "another prompt"], noisy(model), max_new_tokens=12)
    assert report.positions == 24
    assert report.kl_mean > 1e-3 and report.kl_max >= report.kl_mean
    assert report.top1_agreement <= 1.0
    assert 0.0 <= report.greedy_prefix_agreement <= report.greedy_agreement <= 1.0
    more = compare_to_exact(model, [PROMPT, "another prompt"], noisy(model, scale=2.0), max_new_tokens=12)
    assert more.kl_mean > report.kl_mean  # more noise, further from exact


def test_greedy_agreement_counts_positions_until_the_first_divergence(model):
    report = compare_to_exact(model, PROMPT, noisy(model, scale=3.0), max_new_tokens=16)
    exact = kvlab.generate(model, PROMPT, max_new_tokens=16).tokens
    cache = noisy(model, scale=3.0)
    approx = kvlab.generate(model, PROMPT, cache=cache, max_new_tokens=16).tokens
    equal = [a == b for a, b in zip(exact, approx)]
    first = equal.index(False) if False in equal else None
    assert report.first_divergence == first
    assert report.greedy_agreement == pytest.approx(sum(equal) / 16)
    assert report.greedy_prefix_agreement == pytest.approx((16 if first is None else first) / 16)


def test_perplexity_through_the_cache_equals_the_full_forward(model):
    text = "kv caches trade memory for time. " * 2
    ids = model.tokenizer.encode(text)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), NoCache(2, 2, 16))[0, :-1]  # (T-1, V)
    oracle = F.cross_entropy(logits.double(), torch.tensor(ids[1:])).item()
    got = perplexity(model, text)
    assert got.tokens == len(ids) - 1
    assert got.nll == pytest.approx(oracle, rel=1e-5)
    assert got.perplexity == pytest.approx(math.exp(oracle), rel=1e-5)
    assert perplexity(model, text, noisy(model)).nll != pytest.approx(oracle, rel=1e-3)


def test_bad_arguments_are_refused_before_any_work(model):
    with pytest.raises(ValueError, match="does not take option"):
        compare_to_exact(model, PROMPT, "dynamic", bits=4)
    with pytest.raises(ValueError, match="cache object"):
        teacher_forced_logits(model, PROMPT, [1, 2], noisy(model), bits=4)
    with pytest.raises(ValueError, match="context_tokens"):
        perplexity(model, "ab", context_tokens=2)
    with pytest.raises(ValueError, match="exceed"):
        perplexity(model, "x" * 2000)


# -- on the shipped recall model --------------------------------------------------------------
@pytest.fixture(scope="module")
def recall():
    from kvlab.experiments.recall import load_recall_model, make_examples

    return load_recall_model(device="cpu"), make_examples(80, 16, seed=77)


def test_recall_accuracy_is_broken_down_by_distance(recall):
    model, examples = recall
    frame = recall_accuracy(model, examples[:24], noisy(model, scale=1.0))
    assert frame["examples"].sum() == 24 and len(frame) == 4
    assert set(frame.columns) >= {"setting", "distance_bucket", "accuracy", "exact_accuracy"}
    assert frame["accuracy"].mean() < frame["exact_accuracy"].mean()


def test_two_bit_cache_answers_measurably_worse_than_eight_bit(recall):
    from kvlab.experiments.recall import score

    model, examples = recall
    eight = score(model, examples, "quantized", bits=8, residual=0).accuracy
    two = score(model, examples, "quantized", bits=2, residual=0).accuracy
    assert eight >= 0.9  # 8-bit keeps the exact cache's answers
    assert two <= eight - 0.2, f"2-bit accuracy {two:.2f} is not clearly below 8-bit {eight:.2f}"


def test_perplexity_of_recall_text_rises_when_the_cache_loses_precision(recall):
    import random

    from kvlab.experiments.recall import training_batch

    model, _ = recall
    ids, _, _ = training_batch(1, 12, 12, random.Random(5))  # a context, then every key asked and answered
    text = model.tokenizer.decode(ids[0].tolist())
    exact = perplexity(model, text)
    eight = perplexity(model, text, "quantized", bits=8, residual=0)
    two = perplexity(model, text, "quantized", bits=2, residual=0)
    assert eight.nll == pytest.approx(exact.nll, rel=0.01)
    # the model was trained on the queries only, so most of the text's NLL is the random context's,
    # the same for every cache: the 2-bit cache's loss shows up as a clear but small excess
    assert two.nll > eight.nll + 0.1
