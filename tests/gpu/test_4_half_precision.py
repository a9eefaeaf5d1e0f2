"""bf16 and fp16 on the device, where it computes them, against fp32 on the same seeded weights.

``build_model(..., dtype=...)``: greedy tokens of every cache mode (exact caches equal the same dtype's dynamic
cache; agreement with fp32), teacher-forced logits against fp32's, the dynamic cache's bytes (half of fp32's).
``from_pretrained(..., dtype=...)`` on the tiny checkpoints against transformers in the same dtype. The rules are
``half_precision_checks`` (tests/gpu/report.py).
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

import kvlab
from gpu.report import MODES, half_precision_checks
from kvlab.cache import make_cache

pytestmark = [pytest.mark.full, pytest.mark.gpu]

HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
TEXT = "The memory of a long context grows with layers, heads and tokens."


def dtype_support(device: torch.device, dtype: torch.dtype) -> str | None:
    """None when ``device`` computes in ``dtype`` (a matrix product, softmax and layer norm run), else why not."""
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16 arithmetic (torch.cuda.is_bf16_supported() is False)"
    try:
        x = torch.randn(4, 8, device=device).to(dtype)
        torch.nn.functional.layer_norm((x @ x.T).softmax(-1), (4,))
        kvlab.device.synchronize(device)
    except Exception as exc:  # e.g. an old CPU build without half kernels
        return f"{type(exc).__name__}: {exc}"
    return None


def _cache_for(mode: str, config, dtype: torch.dtype, device: torch.device, max_len: int):
    strategy, options = MODES[mode]
    options = dict(options, **({"max_len": max_len} if strategy in ("static", "offloaded") else {}))
    return make_cache(strategy, config, dtype=dtype, device=device, **options)


@torch.inference_mode()
def half_precision_runs(device: torch.device, quick: bool) -> dict:
    """bf16 and fp16 against fp32: ``build_model(..., dtype=...)`` through every cache mode, and
    ``from_pretrained(..., dtype=...)`` on the tiny checkpoints against transformers."""
    import transformers

    from kvlab.model.tiny_checkpoint import FAMILIES, save_tiny_checkpoint

    cfg = kvlab.tiny_llama() if quick else kvlab.llama_30m()
    prompt_len, new = (32, 16) if quick else (128, 32)
    prompt = torch.randint(0, cfg.vocab_size, (prompt_len,), generator=torch.Generator().manual_seed(0)).tolist()
    f32 = kvlab.build_model(cfg, seed=0, device=device)
    ref = kvlab.generate(f32, prompt, cache="dynamic", max_new_tokens=new)
    ids = torch.tensor([prompt + ref.tokens[:-1]], device=device)  # (1, T): the fp32 greedy path, teacher-forced
    f32_cache = make_cache("dynamic", cfg, device=device)
    lf = f32(ids, f32_cache).float()  # (1, T, V)
    out: dict = dict(model=cfg.name, prompt_len=prompt_len, new_tokens=new, fp32_tokens=ref.tokens,
                     fp32_cache_bytes=f32_cache.memory().allocated_bytes, dtypes={}, checkpoints=[])
    del f32
    supported = {}
    for name, dt in HALF_DTYPES.items():
        why = dtype_support(device, dt)
        if why is not None:
            out["dtypes"][name] = dict(supported=False, reason=why)
            continue
        supported[name] = dt
        h = kvlab.build_model(cfg, seed=0, device=device, dtype=dt)
        cache = make_cache("dynamic", cfg, dtype=dt, device=device)
        lh = h(ids, cache).float()  # (1, T, V)
        scale = lf.abs().max().item()
        row = dict(supported=True, model_dtype=str(h.dtype), top1_vs_fp32=(lh.argmax(-1) == lf.argmax(-1)).float()
                   .mean().item(), max_abs_logit_diff=(lh - lf).abs().max().item(), max_abs_logit=scale,
                   tolerance=4 * torch.finfo(dt).eps * scale,  # 8 units of roundoff of the logits' scale
                   cache_bytes=cache.memory().allocated_bytes, modes={})
        for mode in MODES:
            try:
                c = _cache_for(mode, cfg, dt, device, prompt_len + new)
                tokens = kvlab.generate(h, prompt, cache=c, max_new_tokens=new).tokens
                if hasattr(c, "close"):
                    c.close()
                row["modes"][mode] = dict(tokens=tokens[:16], agreement_with_fp32=sum(
                    a == b for a, b in zip(tokens, ref.tokens)) / new, _tokens=tokens)
            except Exception as exc:  # one mode failing in half precision is a finding; the rest still run
                row["modes"][mode] = dict(error=f"{type(exc).__name__}: {exc}")
        dyn = row["modes"].get("dynamic", {}).get("_tokens")
        for m in row["modes"].values():
            if "_tokens" in m:
                m["equal_half_dynamic"] = m.pop("_tokens") == dyn
        out["dtypes"][name] = row
        del h
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory(prefix="kvlab-half-") as tmp:
        for family in FAMILIES:
            folder = save_tiny_checkpoint(Path(tmp) / family, family)
            tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
            ids = torch.tensor([tok.encode(TEXT, add_special_tokens=False)])  # (1, T), on the CPU
            hf32 = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                                     dtype=torch.float32).eval()
            exact = hf32(ids).logits  # (1, T, V): the fp32 reference, on the CPU
            for name, dt in supported.items():
                try:
                    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                                           dtype=dt).to(device).eval()
                    theirs = hf(ids.to(device)).logits.float().cpu()
                    model = kvlab.from_pretrained(folder, device=device, dtype=dt)
                    ours = model(ids.to(device), make_cache("dynamic", model.config, dtype=dt, device=device))
                    ours = ours.float().cpu()
                    out["checkpoints"].append(dict(
                        family=family, dtype=name, model_dtype=str(model.dtype), device=str(model.device),
                        kvlab_vs_fp32=(ours - exact).abs().max().item(),
                        transformers_vs_fp32=(theirs - exact).abs().max().item(),
                        kvlab_vs_transformers=(ours - theirs).abs().max().item(),
                        top1_vs_transformers=(ours.argmax(-1) == theirs.argmax(-1)).float().mean().item()))
                except Exception as exc:
                    out["checkpoints"].append(dict(family=family, dtype=name, error=f"{type(exc).__name__}: {exc}"))
    return out


@pytest.fixture(scope="module")
def half(gpu, gpu_report) -> dict:
    out = half_precision_runs(gpu.device, gpu.quick)
    gpu_report.keep("half_precision", out)
    return out


@pytest.mark.parametrize("dtype", list(HALF_DTYPES))
def test_half_precision_stays_within_roundoff_of_fp32(half, dtype, record):
    """Every check of ``half_precision_checks`` about this dtype: build_model's caches and the checkpoints."""
    record.extend([c for c in half_precision_checks(half) if c.name.startswith(dtype)])
    record.verdict()
