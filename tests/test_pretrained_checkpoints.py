"""Checkpoints as the hub ships them, offline: kvlab.from_pretrained on a saved folder of each family, tokenizer included.

Each folder is what ``save_pretrained`` writes for a tiny random GPT-2, Llama or Qwen2 model plus
a byte-level BPE tokenizer trained here (``kvlab.model.tiny_checkpoint``): the same files as
``openai-community/gpt2``, ``HuggingFaceTB/SmolLM2-135M`` or ``Qwen/Qwen2.5-0.5B``, at a
thousandth of the size. transformers, loading the same folder, is the oracle
(tests/test_parity_transformers.py checks the conversion itself on in-memory models). kvlab's
model is loaded on the test device (``device``, tests/conftest.py); transformers stays on the CPU,
so inputs go to the kvlab model's device and its logits come back to the CPU to be compared.
"""
from __future__ import annotations

import pytest
import torch
import transformers

import kvlab
from kvlab.model.tiny_checkpoint import FAMILIES, save_tiny_checkpoint
from kvlab.model.tokenizer import HFTokenizer

LESSONS = ("03",)  # the lessons these tests belong to: `pytest -m lNN`

ATOL = 1e-4  # max abs logit difference allowed in fp32
TEXTS = ["The cache keeps keys and values.", "a server batches 12 requests, whose prompts share a prefix!",
         "ünïcode, emoji 🙂 and tabs\tstill round-trip"]


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory, device):
    """(family, folder, transformers model, transformers tokenizer, kvlab model) for one saved checkpoint."""
    folder = save_tiny_checkpoint(tmp_path_factory.mktemp(request.param), request.param, seed=0)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return request.param, folder, hf, hf_tok, kvlab.from_pretrained(folder, device=device)


def test_a_saved_checkpoint_loads_with_its_own_tokenizer(checkpoint):
    family, folder, hf, hf_tok, model = checkpoint
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert hf.config.model_type == family
    assert model.config.arch == ("gpt2" if family == "gpt2" else "llama")
    assert isinstance(model.tokenizer, HFTokenizer)
    assert model.tokenizer.vocab_size == len(hf_tok) <= model.config.vocab_size  # the model's vocab is padded
    assert model.tokenizer.eos_token_id == hf_tok.eos_token_id == hf.config.eos_token_id


@pytest.mark.parametrize("text", TEXTS)
def test_the_checkpoint_tokenizer_round_trips_text(checkpoint, text):
    *_, hf_tok, model = checkpoint
    ids = model.tokenizer.encode(text)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    assert len(ids) < len(text.encode("utf-8"))  # BPE merges: fewer tokens than bytes
    assert model.tokenizer.decode(ids) == text


@torch.inference_mode()
def test_logits_of_the_loaded_checkpoint_equal_transformers(checkpoint):
    *_, hf, hf_tok, model = checkpoint
    ids = torch.tensor([hf_tok.encode(TEXTS[1], add_special_tokens=False)])  # (1, T)
    expected = hf(ids).logits  # (1, T, V), on the CPU
    got = model(ids.to(model.device), kvlab.make_cache("dynamic", model.config, device=model.device)).cpu()
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= ATOL


def test_greedy_text_equals_transformers_generate_on_the_checkpoint(checkpoint):
    *_, hf, hf_tok, model = checkpoint
    prompt = "The memory of a long context"
    ids = hf_tok(prompt, return_tensors="pt", add_special_tokens=False).input_ids  # (1, T)
    with torch.inference_mode():
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, min_new_tokens=20,
                          do_sample=False, pad_token_id=hf_tok.eos_token_id)
    expected = out[0, ids.size(1):].tolist()
    result = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=20)
    assert result.prompt_ids == ids[0].tolist()
    assert result.tokens == expected
    assert len(set(result.tokens)) > 1, "a constant continuation would make this check weak"


@pytest.mark.parametrize("cache", ["none", "static", "quantized"])
def test_every_cache_generates_from_a_loaded_checkpoint(checkpoint, cache):
    *_, model = checkpoint
    dynamic = kvlab.generate(model, TEXTS[0], cache="dynamic", max_new_tokens=8)
    other = kvlab.generate(model, TEXTS[0], cache=cache, max_new_tokens=8, **({"bits": 8} if cache == "quantized"
                                                                               else {}))
    assert len(other.tokens) == 8
    if cache != "quantized":  # exact caches: the same tokens
        assert other.tokens == dynamic.tokens


def test_generate_returns_text_decoded_by_the_checkpoint_tokenizer(checkpoint):
    """Random weights pick random tokens, so the words are nonsense (often lone bytes of a UTF-8
    character, shown as \ufffd); what matters here is that text goes in and comes out through the
    checkpoint's tokenizer, not kvlab's byte tokenizer."""
    *_, hf_tok, model = checkpoint
    result = kvlab.generate(model, "The cache keeps", max_new_tokens=24)
    assert result.prompt_ids == hf_tok.encode("The cache keeps", add_special_tokens=False)
    assert isinstance(result.text, str) and result.text
    assert result.text == model.tokenizer.decode(result.tokens)
    assert result.text != kvlab.ByteTokenizer().decode(result.tokens)
    if all(t < len(hf_tok) for t in result.tokens):
        assert result.text == hf_tok.decode(result.tokens)


def test_ids_past_the_tokenizer_vocabulary_decode_as_markers(checkpoint):
    *_, hf_tok, model = checkpoint
    ids = hf_tok.encode("keys", add_special_tokens=False)
    padded = model.config.vocab_size - 1  # a row of the padded embedding no token maps to
    assert padded >= len(hf_tok)
    assert model.tokenizer.decode([*ids, padded, *ids]) == f"keys<{padded}>keys"


def test_a_broken_tokenizer_file_is_reported_and_bytes_are_used(tmp_path, device):
    folder = save_tiny_checkpoint(tmp_path, "llama")
    (folder / "tokenizer.json").write_text("{ not json")
    with pytest.warns(UserWarning, match="could not load the tokenizer.*ByteTokenizer"):
        model = kvlab.from_pretrained(folder, device=device)
    assert isinstance(model.tokenizer, kvlab.ByteTokenizer)


# -- a plain checkpoint, read without transformers -----------------------------------------------------------------
def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()  # parameters and buffers (RoPE's inv_freq among them)
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name].cpu(), sb[name].cpu()), name


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("tied", [False, True])
def test_a_plain_checkpoint_reads_as_transformers_would(tmp_path, family, tied):
    """No tokenizer files, one safetensors file: safetensors alone, the same parameters and buffers as the
    transformers path (qkv bias, grouped K/V heads and tied embeddings included)."""
    from kvlab.model.loading import from_transformers, read_plain_checkpoint
    from kvlab.model.tiny_checkpoint import tiny_transformers_model

    hf = tiny_transformers_model(family, 128, seed=1)
    hf.config.tie_word_embeddings = tied
    if tied:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    else:  # a head of its own, different from the embedding
        hf.lm_head.weight = torch.nn.Parameter(torch.randn_like(hf.model.embed_tokens.weight))
    hf.save_pretrained(tmp_path)
    plain = read_plain_checkpoint(tmp_path)
    assert plain is not None and plain.config.qkv_bias == (family == "qwen2")
    assert plain.config.num_kv_heads < plain.config.num_heads or family == "llama"
    reference = from_transformers(transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32))
    _same_weights(plain, reference)
    assert plain.config.tie_word_embeddings == reference.config.tie_word_embeddings == tied


def test_what_is_not_plain_goes_through_transformers(tmp_path):
    """A tokenizer of its own, GPT-2 or scaled RoPE: read_plain_checkpoint declines (None) and from_pretrained
    uses transformers, which reads them."""
    import json

    from kvlab.model.loading import read_plain_checkpoint

    assert read_plain_checkpoint(save_tiny_checkpoint(tmp_path / "with-tokenizer", "llama")) is None
    assert read_plain_checkpoint(save_tiny_checkpoint(tmp_path / "gpt2", "gpt2")) is None
    from kvlab.model.tiny_checkpoint import tiny_transformers_model

    scaled = tmp_path / "scaled"
    tiny_transformers_model("llama", 128, seed=0).save_pretrained(scaled)
    raw = json.loads((scaled / "config.json").read_text())
    raw["rope_parameters"] = {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    (scaled / "config.json").write_text(json.dumps(raw))
    assert read_plain_checkpoint(scaled) is None


def test_the_shipped_model_loads_without_importing_transformers(tmp_path):
    """kvlab serve's start-up: the recall checkpoint in a fresh process, transformers never imported, and the same
    weights as transformers reads from the folder."""
    import subprocess
    import sys

    from kvlab.model.loading import from_transformers
    from kvlab.experiments.recall import RECALL_MODEL_DIR, load_recall_model

    code = ("import sys; from kvlab.experiments.recall import load_recall_model; load_recall_model(); "
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path)
    assert out.stdout.strip() == "False", out.stderr
    reference = transformers.AutoModelForCausalLM.from_pretrained(RECALL_MODEL_DIR, dtype=torch.float32)
    _same_weights(load_recall_model(device="cpu"), from_transformers(reference, device="cpu"))
