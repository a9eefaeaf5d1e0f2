"""kvlab's decoder against transformers on the same weights: logits, cached decode steps, greedy tokens.

transformers is the independent oracle here: tiny models are built from random configs offline
(no download), converted with ``kvlab.from_transformers``, and both run side by side in fp32.
"""
from __future__ import annotations

import pytest
import torch
import transformers

import kvlab
from kvlab.threads import torch_threads

ATOL = 1e-4  # max abs logit difference allowed in fp32
DECODE_STEPS = 16
VOCAB = 128


def llama(tie: bool = False) -> transformers.PreTrainedModel:
    """Llama with grouped-query attention (4 query heads share 2 K/V heads)."""
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   rope_theta=500000.0, tie_word_embeddings=tie, initializer_range=0.2)
    return transformers.LlamaForCausalLM(cfg)


def qwen2() -> transformers.PreTrainedModel:
    """Qwen2: Llama's layout plus q/k/v biases, GQA and tied embeddings."""
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                                   tie_word_embeddings=True, initializer_range=0.2)
    hf = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # transformers initialises biases to zero: make them matter
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0.0, 0.5)
    return hf


def gpt2() -> transformers.PreTrainedModel:
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=256,
                                  initializer_range=0.2)
    hf = transformers.GPT2LMHeadModel(cfg)
    with torch.no_grad():  # non-trivial norms and biases, so a mix-up of any of them shows
        for name, p in hf.named_parameters():
            if "ln_" in name or name.endswith("bias"):
                p.normal_(1.0 if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") else 0.0, 0.2)
    return hf


MODELS = {"llama-gqa": llama, "llama-gqa-tied": lambda: llama(tie=True), "qwen2-bias": qwen2, "gpt2": gpt2}


@pytest.fixture(params=list(MODELS), scope="module")
def pair(request):
    torch.manual_seed(0)
    hf = MODELS[request.param]().float().eval()
    return hf, kvlab.from_transformers(hf, device="cpu")


def prompt(n: int = 12, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))  # (1, T)


@torch.inference_mode()
def test_prefill_logits_match_transformers(pair):
    hf, model = pair
    ids = prompt()
    expected = hf(ids).logits  # (1, T, V)
    got = model(ids, kvlab.make_cache("dynamic", model.config))
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= ATOL


@torch.inference_mode()
def test_cached_decode_steps_match_transformers_dynamic_cache(pair):
    """Both models run the same tokens step by step, each with its own dynamic cache."""
    hf, model = pair
    ids = prompt()
    hf_cache = transformers.DynamicCache(config=hf.config)
    cache = kvlab.make_cache("dynamic", model.config)
    expected = hf(ids, cache=hf_cache, use_cache=True).logits[:, -1]  # (1, V)
    got = model(ids, cache)[:, -1]
    assert (got - expected).abs().max().item() <= ATOL
    for step in range(DECODE_STEPS):
        token = got.argmax(-1, keepdim=True)  # (1, 1): the same token goes into both models
        expected = hf(token, cache=hf_cache, use_cache=True).logits[:, -1]
        got = model(token, cache)[:, -1]
        diff = (got - expected).abs().max().item()
        assert diff <= ATOL, f"decode step {step}: max abs logit difference {diff:.2e}"
    assert cache.seq_len == hf_cache.get_seq_length() == ids.size(1) + DECODE_STEPS


@pytest.mark.parametrize("threads", [1, 2])  # 2: the decode step's products split across threads (matvec)
def test_greedy_continuation_equals_transformers_generate(pair, threads):
    hf, model = pair
    ids = prompt()
    with torch.inference_mode():
        out = hf.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False,
                          pad_token_id=0)  # min_new_tokens: no early stop on a random EOS
    with torch_threads(threads):
        result = kvlab.generate(model, ids[0].tolist(), cache="dynamic", max_new_tokens=24)
    assert result.tokens == out[0, ids.size(1):].tolist()
    assert len(set(result.tokens)) > 1, "a constant continuation would make this check weak"


def test_compiled_static_decode_gives_transformers_tokens(pair):
    """The fixed-shape static cache's decode step, traced by torch.compile (the "eager" backend: tracing without
    code generation, seconds not minutes), gives transformers' greedy tokens and says it compiled."""
    hf, model = pair
    ids = prompt()
    with torch.inference_mode():
        out = hf.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False, pad_token_id=0)
    result = kvlab.generate(model, ids[0].tolist(), cache="static", max_new_tokens=24, compile=True,
                            compile_backend="eager")
    assert result.tokens == out[0, ids.size(1):].tolist()
    assert result.settings["compiled"] and result.settings["compile_fallback"] is None
    assert result.settings["compile_s"] >= 0


@torch.inference_mode()
def test_to_transformers_round_trip_keeps_weights_and_logits(pair):
    hf, model = pair
    back = kvlab.to_transformers(model)
    assert type(back) is type(hf)
    ids = prompt(seed=1)
    assert (back(ids).logits - hf(ids).logits).abs().max().item() <= ATOL
    again = kvlab.from_transformers(back, device="cpu")
    for (name, p), (_, q) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("tie", [True, False])
def test_tied_and_untied_embeddings_convert_as_such(tie):
    torch.manual_seed(0)
    hf = llama(tie=tie).eval()
    model = kvlab.from_transformers(hf, device="cpu")
    assert model.config.tie_word_embeddings is tie
    assert (model.lm_head is None) is tie
    n_hf = sum(p.numel() for p in hf.parameters())  # transformers counts a tied matrix once
    assert model.num_parameters() == n_hf == model.config.num_parameters()
    back = kvlab.to_transformers(model)
    assert back.config.tie_word_embeddings is tie
    assert (back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()) is tie


@torch.inference_mode()
def test_from_pretrained_loads_a_saved_checkpoint_offline(tmp_path):
    torch.manual_seed(0)
    hf = llama().eval()
    hf.save_pretrained(tmp_path)
    model = kvlab.from_pretrained(tmp_path, device="cpu")
    assert isinstance(model.tokenizer, kvlab.ByteTokenizer)  # no tokenizer files saved
    ids = prompt()
    got = model(ids, kvlab.make_cache("dynamic", model.config))
    assert (got - hf(ids).logits).abs().max().item() <= ATOL


def _neox() -> transformers.PreTrainedModel:
    return transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4, intermediate_size=96))


UNSUPPORTED = r"'gpt_neox'.*not supported.*gpt2.*llama.*mistral.*qwen2"


def test_unsupported_architecture_is_named_with_the_supported_ones():
    with pytest.raises(ValueError, match=UNSUPPORTED):
        kvlab.from_transformers(_neox())


def test_unsupported_checkpoint_is_refused_before_loading_weights(tmp_path):
    transformers.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
                               intermediate_size=96).save_pretrained(tmp_path)  # config only, no weights
    with pytest.raises(ValueError, match=UNSUPPORTED):
        kvlab.from_pretrained(tmp_path)


def test_missing_checkpoint_directory_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        kvlab.from_pretrained(tmp_path / "nowhere")


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
def test_split_products_equal_the_plain_product(threads):
    """The decoder's weight products split their inner dimension across threads: same result up to rounding."""
    from kvlab.model.matvec import matvec

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(threads)
        w = torch.randn(1376, 512, generator=gen)  # llama-30m's w_down: K = 1376
        for x in (torch.randn(1, 1, 1376, generator=gen), torch.randn(3, 5, 1376, generator=gen),
                  torch.randn(1, 40, 1376, generator=gen)):  # one row, a decode batch, a prompt (plain product)
            torch.testing.assert_close(matvec(x, w), x @ w, atol=1e-4, rtol=1e-5)
        wide = torch.randn(512, 2752, generator=gen)  # llama-30m's fused gate/up: the split serves wide outputs too
        x = torch.randn(1, 1, 512, generator=gen)
        torch.testing.assert_close(matvec(x, wide), x @ wide, atol=1e-4, rtol=1e-5)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2])
def test_compiled_split_product_stays_one_operator_and_equals_the_plain_product(threads):
    """Under torch.compile the split product is the opaque kvlab::split_matvec (so inductor cannot
    rewrite it into a slower multiply-and-sum), with the eager result; one thread has nothing to split."""
    from torch._dynamo.testing import CompileCounterWithBackend

    from kvlab.model.matvec import matvec, prepare_compile

    prepare_compile()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        w, x = torch.randn(512, 1536, generator=gen), torch.randn(1, 1, 512, generator=gen)
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(matvec, backend=counter, fullgraph=True)
        torch.testing.assert_close(compiled(x, w), x @ w, atol=1e-4, rtol=1e-5)
        targets = [str(n.target) for n in counter.graphs[0].graph.nodes if n.op == "call_function"]
        assert any("split_matvec" in t for t in targets) == (threads > 1), targets
        assert not any("bmm" in t for t in targets), targets
    finally:
        torch.set_num_threads(before)


# -- half precision: weights in bf16 / fp16, RoPE's angles in fp32 (as transformers keeps them) -------------

HALF_ATOL = {torch.bfloat16: 0.5, torch.float16: 0.05}  # max abs logit difference (logits reach ~6 here)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rope_angles_stay_fp32_in_a_half_precision_model(dtype):
    """``model.to(dtype)`` casts floating buffers; RoPE's frequencies must not follow. In bf16, positions 512,
    513 and 514 would all get cos -0.996 (fp32: -0.997, -0.606, 0.343)."""
    from kvlab.model.decoder import rope_cos_sin

    cfg = kvlab.tiny_llama()
    full, half = kvlab.build_model(cfg, device="cpu"), kvlab.build_model(cfg, device="cpu", dtype=dtype)
    assert half.embed.dtype == dtype and half.inv_freq.dtype == torch.float32
    assert torch.equal(half.inv_freq, full.inv_freq)
    assert half.half().inv_freq.dtype == torch.float32  # any later cast too
    positions = torch.tensor([[512, 513, 514]])  # (1, 3)
    cos32, sin32 = rope_cos_sin(positions, full.inv_freq)  # (1, 1, 3, hs)
    cos, sin = rope_cos_sin(positions, half.inv_freq, dtype)
    assert cos.dtype == sin.dtype == dtype
    assert torch.equal(cos, cos32.to(dtype)) and torch.equal(sin, sin32.to(dtype))
    assert cos32[0, 0, :, 0].tolist() == pytest.approx([-0.997, -0.606, 0.343], abs=1e-3)


@pytest.fixture(scope="module")
def llama_checkpoint(tmp_path_factory):
    """A saved fp32 Llama with room for long positions, loaded below in half precision by both libraries."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                   initializer_range=0.2)
    path = tmp_path_factory.mktemp("llama-1k")
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


@pytest.mark.parametrize("start", [0, 512])  # 512: where angles computed in bf16 were off by radians
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@torch.inference_mode()
def test_half_precision_logits_match_transformers(llama_checkpoint, dtype, start):
    """kvlab and transformers load the same checkpoint in bf16 / fp16: logits agree within HALF_ATOL at
    positions 0.. and 512.. (before RoPE stayed fp32, bf16 differed by 7.6 and fp16 by 0.38 at 512)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(llama_checkpoint, dtype=dtype).eval()
    model = kvlab.from_pretrained(llama_checkpoint, device="cpu", dtype=dtype)
    ids, positions = prompt(), torch.arange(start, start + 12)[None]  # (1, 12) each
    expected = hf(ids, position_ids=positions).logits  # (1, T, V)
    got = model(ids, kvlab.make_cache("dynamic", model.config, dtype=dtype), positions=positions)
    assert got.dtype == expected.dtype == dtype
    diff = (got.float() - expected.float()).abs().max().item()
    assert diff <= HALF_ATOL[dtype], f"max abs logit difference {diff:.3f} in {dtype} from position {start}"


def test_a_model_cast_to_bf16_before_conversion_keeps_fp32_rope_frequencies():
    """``hf.to(bf16)`` casts transformers' own inv_freq buffer; the conversion recomputes it in fp32."""
    torch.manual_seed(0)
    hf = llama()
    expected = hf.model.rotary_emb.inv_freq.clone()
    model = kvlab.from_transformers(hf.to(torch.bfloat16), device="cpu", dtype=torch.bfloat16)
    assert hf.model.rotary_emb.inv_freq.dtype == torch.bfloat16
    assert model.inv_freq.dtype == torch.float32 and torch.equal(model.inv_freq, expected)
