"""Tiny saved checkpoints of each family, with their tokenizers, loaded on the device against transformers.

GPT-2, Llama and Qwen2 checkpoints saved here and loaded with ``kvlab.from_pretrained`` on the device: logits
against transformers' (on the CPU, fp32) and greedy tokens; the real-model demonstration
(``kvlab.experiments.real_model``) on the Llama one, its dynamic cache's bytes against the formula.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

import kvlab

pytestmark = [pytest.mark.full, pytest.mark.gpu]

PROMPT = "The memory of a long context grows with layers, heads and tokens."


def checkpoint_runs(device: torch.device, quick: bool) -> dict:
    """Per family: max |logit difference|, greedy tokens equal, text round-trip; and the real-model demo's tables."""
    import transformers

    from kvlab.experiments.real_model import real_model_demo, try_real_model
    from kvlab.model.tiny_checkpoint import FAMILIES, save_tiny_checkpoint

    transformers.utils.logging.disable_progress_bar()  # one bar per save and load otherwise
    rows, demo = [], None
    with tempfile.TemporaryDirectory(prefix="kvlab-ckpt-") as tmp:
        for family in FAMILIES:
            folder = save_tiny_checkpoint(Path(tmp) / family, family)
            hf = transformers.AutoModelForCausalLM.from_pretrained(folder, local_files_only=True,
                                                                   dtype=torch.float32).eval()
            tok = transformers.AutoTokenizer.from_pretrained(folder, local_files_only=True)
            model = kvlab.from_pretrained(folder, device=device)
            ids = torch.tensor([tok.encode(PROMPT, add_special_tokens=False)])  # (1, T)
            with torch.inference_mode():
                expected = hf(ids).logits  # (1, T, V)
                got = model(ids.to(device), kvlab.make_cache("dynamic", model.config, device=device)).cpu()
                ref = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24,
                                  do_sample=False, pad_token_id=tok.eos_token_id)[0, ids.size(1):].tolist()
            out = kvlab.generate(model, PROMPT, cache="dynamic", max_new_tokens=24)
            rows.append(dict(family=family, device=str(model.device), tokenizer=repr(model.tokenizer),
                             max_abs_logit_diff=(got - expected).abs().max().item(),
                             greedy_equal=out.tokens == ref,
                             agreement=sum(a == b for a, b in zip(out.tokens, ref)) / len(ref),
                             text_roundtrip=model.tokenizer.decode(model.tokenizer.encode(PROMPT)) == PROMPT))
            if family == "llama":
                real, note = try_real_model(folder, device=device)
                d = real_model_demo(real, new_tokens=16 if quick else 32, slowdown_prompt_tokens=32,
                                    slowdown_tokens=16 if quick else 32)
                demo = dict(note=note, **{k: v.to_dict(orient="records") for k, v in d.tables().items()})
    return dict(rows=rows, real_model_demo=demo)


@pytest.fixture(scope="module")
def checkpoints(gpu, gpu_report) -> dict:
    out = checkpoint_runs(gpu.device, gpu.quick)
    gpu_report.keep("checkpoints", out)
    return out


def test_logits_match_transformers_within_1e3(checkpoints, record):
    for r in checkpoints["rows"]:
        record(f"checkpoint {r['family']}: logits within 1e-3 of transformers", r["max_abs_logit_diff"] <= 1e-3,
               "<= 1e-3", f"{r['max_abs_logit_diff']:.2e} on {r['device']}")
    record.verdict()


def test_greedy_tokens_match_transformers(checkpoints, record):
    for r in checkpoints["rows"]:
        record(f"checkpoint {r['family']}: greedy tokens == transformers", r["greedy_equal"], "same tokens",
               f"agreement {r['agreement']:.2f}, text round-trip {r['text_roundtrip']}")
    record.verdict()


def test_the_real_model_demos_dynamic_cache_bytes_equal_the_formula(checkpoints, record):
    demo = checkpoints["real_model_demo"]
    dyn = [m for m in demo["memory"] if m["cache"] == "dynamic"]
    record("real-model demo: dynamic bytes == formula", all(m["allocated_bytes"] == m["formula_bytes"] for m in dyn),
           [m["formula_bytes"] for m in dyn], f"{[m['allocated_bytes'] for m in dyn]} ({demo['note']})")
    record.verdict()
