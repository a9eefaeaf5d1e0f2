"""The quantized cache: really low-precision storage, exact byte accounting, bounded and monotone error.

Oracles: hand-computed codes, the dynamic (exact) cache on the same inputs, and the memory
formula written out from shapes. Error bounds below were measured on tiny_llama seeds 0-2
(int8 max |logit error| <= 3e-3, int4 <= 4e-2, int2 <= 0.18 with logits of magnitude ~0.7)
and set with margin.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlab
from kvlab.cache import make_cache
from kvlab.cache.quantize_ops import dequantize, pack, quantize, unpack
from kvlab.cache.quantized import QuantizedCache

# --- the pure ops on hand-computed cases --------------------------------------------------------


def test_two_bit_quantization_of_a_known_vector_gives_known_codes():
    x = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.5, 1.5, 2.9, 3.0])
    packed, scale, zero = quantize(x, bits=2, group_size=4)
    # group 1: min 0, max 3 -> scale 1, codes 0 1 2 3; group 2: min 0.5, scale 2.5/3 -> codes 0 1 3 3
    assert torch.equal(unpack(packed, 2), torch.tensor([0, 1, 2, 3, 0, 1, 3, 3], dtype=torch.uint8))
    assert torch.equal(packed, torch.tensor([0 | 1 << 2 | 2 << 4 | 3 << 6, 0 | 1 << 2 | 3 << 4 | 3 << 6],
                                            dtype=torch.uint8))  # [228, 244]
    assert torch.allclose(scale, torch.tensor([1.0, 2.5 / 3])) and torch.equal(zero, torch.tensor([0.0, 0.5]))
    back = dequantize(packed, scale, zero, bits=2, group_size=4)
    assert torch.allclose(back, torch.tensor([0.0, 1.0, 2.0, 3.0, 0.5, 0.5 + 2.5 / 3, 3.0, 3.0]))


def test_eight_and_four_bit_codes_of_a_ramp():
    x = torch.arange(16, dtype=torch.float32)  # min 0, max 15
    p4, s4, z4 = quantize(x, bits=4, group_size=16)  # scale 1: codes are the values themselves
    assert torch.equal(unpack(p4, 4), torch.arange(16, dtype=torch.uint8))
    assert p4.tolist() == [0 | 1 << 4, 2 | 3 << 4, 4 | 5 << 4, 6 | 7 << 4, 8 | 9 << 4, 10 | 11 << 4,
                           12 | 13 << 4, 14 | 15 << 4]
    p8, s8, _ = quantize(x * 17, bits=8, group_size=16)  # range 255 -> scale 1, one code per byte
    assert s8.item() == 1.0 and torch.equal(p8, (torch.arange(16) * 17).to(torch.uint8))


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_and_unpack_round_trip_every_code(bits):
    every_byte = torch.arange(256, dtype=torch.uint8)
    codes = unpack(every_byte, bits)  # every combination of 8/bits codes appears exactly once
    assert codes.max().item() == 2 ** bits - 1 and codes.numel() == 256 * 8 // bits
    assert torch.equal(pack(codes, bits), every_byte)
    per = 8 // bits  # byte 1 holds code 1 first, in its lowest bits, then zeros
    assert codes[per:2 * per].tolist() == [1] + [0] * (per - 1)


def test_a_constant_group_comes_back_exactly():
    x = torch.full((2, 8), -1.25)
    packed, scale, zero = quantize(x, bits=2, group_size=8)
    assert torch.equal(scale, torch.zeros(2, 1)) and torch.equal(dequantize(packed, scale, zero, 2, 8), x)


@settings(max_examples=40, deadline=None)
@given(bits=st.sampled_from([2, 4, 8]), group=st.sampled_from([2, 4, 8, 16]), seed=st.integers(0, 10_000))
def test_every_value_comes_back_within_half_a_step(bits, group, seed):
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(seed))
    packed, scale, zero = quantize(x, bits, group)
    assert packed.dtype == torch.uint8 and packed.shape == (3, 5, 16 * bits // 8)
    assert scale.shape == zero.shape == (3, 5, 16 // group)
    err = (dequantize(packed, scale, zero, bits, group) - x).abs().reshape(3, 5, 16 // group, group)
    assert (err <= scale[..., None] / 2 + 1e-6).all()


def test_scales_can_be_stored_in_half_precision():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(0))
    packed, scale, zero = quantize(x, bits=8, group_size=32, scale_dtype=torch.float16)
    assert scale.dtype == zero.dtype == torch.float16
    back = dequantize(packed, scale, zero, 8, 32, dtype=torch.float32)
    assert back.dtype == torch.float32 and (back - x).abs().max() < 0.02


# --- the cache ----------------------------------------------------------------------------------


def qcache(model, **options):
    return make_cache("quantized", model.config, dtype=model.dtype, device=model.device, **options)


def test_the_store_really_holds_packed_uint8_codes(model, teacher_forced_logits):
    cfg = model.config
    cache = qcache(model, bits=4, group_size=8, residual=4)
    teacher_forced_logits(model, cache, prompt_len=10, steps=3)
    assert cache.seq_len == 13
    kv = (2, 1, cfg.num_kv_heads)  # K and V, batch, kv heads
    assert all(t.dtype == torch.uint8 and t.shape == (*kv, 9, cfg.head_dim // 2) for t in cache.packed)
    assert all(t.shape == (*kv, 9, cfg.head_dim // 8) for t in cache.scale + cache.zero)
    assert all(w.shape == (*kv, 4, cfg.head_dim) and w.dtype == torch.float32 for w in cache.window)


def test_update_returns_the_dequantized_history_then_the_exact_window():
    torch.manual_seed(0)
    B, nkv, hs, R = 2, 3, 16, 5
    cache = QuantizedCache(1, nkv, hs, batch=B, bits=2, group_size=4, residual=R)
    chunks = [torch.randn(B, nkv, T, hs) for T in (7, 1, 1, 3, 1)]  # a prefill, then mixed steps
    for n in range(1, len(chunks) + 1):
        k_all = torch.cat(chunks[:n], dim=2)  # (B, nkv, S, hs)
        K, V = cache.update(0, chunks[n - 1], -chunks[n - 1])
        S, q = k_all.size(2), max(0, k_all.size(2) - R)
        expected = torch.cat([dequantize(*quantize(k_all[:, :, :q], 2, 4), 2, 4), k_all[:, :, q:]], dim=2)
        assert K.shape == (B, nkv, S, hs) and torch.equal(K, expected)
        assert torch.equal(V[:, :, q:], -k_all[:, :, q:])  # the window is exact
        assert cache.seq_len == S


def test_with_residual_zero_even_the_current_token_is_quantized():
    cache = QuantizedCache(1, 1, 8, bits=2, group_size=8, residual=0)
    k = torch.tensor([[[[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.9]]]])  # (1, 1, 1, 8)
    K, _ = cache.update(0, k, k)
    assert not torch.equal(K, k) and torch.allclose(K, dequantize(*quantize(k, 2, 8), 2, 8))
    assert cache.memory_breakdown()["residual_bytes"] == 0


def test_a_window_as_long_as_the_sequence_is_exact(model, teacher_forced_logits):
    ref = teacher_forced_logits(model, make_cache("dynamic", model.config, device=model.device))
    got = teacher_forced_logits(model, qcache(model, bits=2, residual=100))
    assert torch.allclose(got, ref, atol=1e-6)


@pytest.mark.parametrize("bits,group,residual", [(8, 16, 0), (4, 8, 16), (2, 4, 5), (4, 16, 100)])
def test_allocated_bytes_equal_payload_plus_scales_plus_window(model, bits, group, residual, teacher_forced_logits):
    cfg = model.config
    L, nkv, hs, B, S = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 1, 48 + 24
    cache = qcache(model, bits=bits, group_size=group, residual=residual)
    teacher_forced_logits(model, cache)
    quantized_tokens, window_tokens = max(0, S - residual), min(S, residual)
    payload = 2 * L * B * nkv * quantized_tokens * hs * bits // 8  # K and V codes
    scales = 2 * L * B * nkv * quantized_tokens * (hs // group) * 2 * 4  # scale + zero, fp32
    window = 2 * L * B * nkv * window_tokens * hs * 4
    assert cache.memory_breakdown() == dict(payload_bytes=payload, scale_bytes=scales, residual_bytes=window)
    m = cache.memory()
    assert m.allocated_bytes == m.used_bytes == m.device_bytes == payload + scales + window
    assert m.reserved_bytes == 0 and m.offloaded_bytes == 0


def test_int8_logits_stay_close_to_the_exact_cache(model, teacher_forced_logits):
    ref = teacher_forced_logits(model, make_cache("dynamic", model.config, device=model.device))
    got = teacher_forced_logits(model, qcache(model, bits=8, group_size=16, residual=0))
    err = (got - ref).abs().max().item()
    assert err < 2e-2, f"int8 max |logit error| {err:.2e} (measured ~3e-3)"
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.95


def test_int8_greedy_tokens_agree_with_dynamic(model):
    prompt = list(range(5, 53))
    exact = kvlab.generate(model, prompt, cache="dynamic", max_new_tokens=32).tokens
    int8 = kvlab.generate(model, prompt, cache="quantized", max_new_tokens=32, bits=8, residual=0).tokens
    agreement = sum(a == b for a, b in zip(exact, int8)) / len(exact)
    assert agreement >= 0.9, f"int8 greedy agreement {agreement:.2f} (measured 1.0 on seeds 0-2)"


def test_error_grows_as_bits_fall(model, teacher_forced_logits):
    ref = teacher_forced_logits(model, make_cache("dynamic", model.config, device=model.device), seed=1)
    err = {b: (teacher_forced_logits(model, qcache(model, bits=b, group_size=16, residual=0), seed=1) - ref)
           .abs().max().item() for b in (8, 4, 2)}
    assert err[8] > 0  # int8 is not a no-op
    assert err[4] > 3 * err[8] and err[2] > 2 * err[4], err  # measured ratios ~13x and ~5x
    assert err[4] < 0.2 and err[2] < 0.8, err  # measured ~0.04 and ~0.18


# --- bad options ----------------------------------------------------------------------------------


@pytest.mark.parametrize("options,message", [
    (dict(bits=3), "bits 3 is not supported; use 2, 4 or 8"),
    (dict(bits=16), "bits 16 is not supported; use 2, 4 or 8"),
    (dict(group_size=5), "group_size 5 does not divide head_dim 16; use one of [1, 2, 4, 8, 16]"),
    (dict(group_size=0), "group_size must be a positive integer, got 0"),
    (dict(residual=-1), "residual must be an integer >= 0"),
])
def test_bad_options_get_a_clear_error(options, message):
    with pytest.raises(ValueError) as err:
        make_cache("quantized", kvlab.tiny_llama(), **options)
    assert message in str(err.value)


def test_generate_with_bad_bits_fails_before_any_work(model):
    with pytest.raises(ValueError, match="bits 3 is not supported"):
        kvlab.generate(model, [1, 2, 3], cache="quantized", bits=3)


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="CUDA not available: the quantized cache's CUDA run is checked by the GPU checks (tests/gpu/)")
def test_quantized_cache_runs_on_cuda(teacher_forced_logits):
    m = kvlab.build_model(kvlab.tiny_llama(), seed=0, device="cuda")
    cache = make_cache("quantized", m.config, device="cuda", bits=4, residual=8)
    teacher_forced_logits(m, cache, prompt_len=20, steps=4)
    assert cache.packed[0].is_cuda and cache.memory().allocated_bytes > 0
