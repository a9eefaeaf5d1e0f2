"""A real model, where the machine is online: the lessons' measurements on SmolLM2-135M instead of random weights.

The lessons run on small random-weight models that ship with kvlab, so they work everywhere, offline included. Where the
Hugging Face hub is reachable (Colab, most laptops), ``try_real_model()`` loads one small trained checkpoint with its
own tokenizer, and ``real_model_demo()`` repeats three measurements on it: readable text, the slowdown without a cache
(time per token, "none" vs "dynamic"), and the cache's measured bytes next to the formula at the model's real shape.
Offline, ``try_real_model()`` says so in one line and returns None; nothing waits longer than ``timeout_s`` for the
network.

    >>> model, note = try_real_model()
    >>> print(note)
    >>> if model is not None:
    ...     demo = real_model_demo(model)
"""
from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from kvlab.generate import generate
from kvlab.model.decoder import Decoder
from kvlab.experiments.memory import kv_memory_table, measure_cache_memory
from kvlab.experiments.slowdown import run_slowdown, slowdown_summary

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M"  # Llama family, grouped-query attention, ~270 MB to download
DEFAULT_PROMPT = "The key to a fast language model server is"
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
CONTINUES = "the lesson continues on the shipped model"


def offline_variable() -> str | None:
    """The name of the environment variable that puts the Hugging Face libraries offline, if one is set."""
    for name in OFFLINE_VARIABLES:
        if os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on"):
            return name
    return None


def hub_endpoint() -> str:
    """Where the hub is: $HF_ENDPOINT (a mirror) or https://huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def hub_reachable(timeout_s: float = 2.5, endpoint: str | None = None) -> bool:
    """True when the hub answers an HTTP request within ``timeout_s`` seconds (any status counts as an answer).

    The request runs on a daemon thread that is abandoned after ``timeout_s``: a DNS lookup, which no socket timeout
    bounds, cannot hold the notebook longer than that.
    """
    url = endpoint or hub_endpoint()
    answers: list[bool] = []

    def probe() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s).close()
            answers.append(True)
        except urllib.error.HTTPError:  # the server answered, with an error status: it is reachable
            answers.append(True)
        except Exception:  # no route, refused, DNS failure, timeout, bad URL
            answers.append(False)

    thread = threading.Thread(target=probe, name="kvlab-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return bool(answers and answers[0])


def offline_reason(timeout_s: float = 2.5) -> str | None:
    """Why only the local Hugging Face cache can be tried (an offline variable set, or the hub silent); None: online."""
    if (variable := offline_variable()) is not None:
        return f"{variable}={os.environ[variable]} is set"
    if not hub_reachable(timeout_s):
        return f"{hub_endpoint()} did not answer within {timeout_s:g} s"
    return None


def describe(model: Decoder) -> str:
    """One line on a loaded model: name, parameters, shape of its KV cache, tokenizer, device."""
    cfg = model.config
    return (f"{cfg.name}: {model.num_parameters() / 1e6:.3g}M parameters, {cfg.num_layers} layers, "
            f"{cfg.num_kv_heads} KV heads x {cfg.head_dim} dims ({cfg.kv_bytes_per_token(4) / 1024:.3g} KiB of "
            f"K/V per token in fp32), tokenizer {model.tokenizer!r}, on {model.device}")


def try_real_model(name: str | Path = DEFAULT_MODEL, timeout_s: float = 2.5,
                   device: torch.device | str | None = None) -> tuple[Decoder | None, str]:
    """Load a small trained model with its tokenizer where possible: ``(model, note)``, else ``(None, note)``.

    ``name`` is a hub name of a supported family ("HuggingFaceTB/SmolLM2-135M", "openai-community/gpt2",
    "Qwen/Qwen2.5-0.5B") or a checkpoint directory. Offline (``offline_reason``) only the local Hugging Face cache is
    tried (a model downloaded earlier still loads). ``note`` is one line saying what happened.
    """
    from kvlab.model.loading import from_pretrained

    if Path(name).is_dir():
        model = from_pretrained(name, device=device)
        return model, f"loaded the checkpoint at {name}. {describe(model)}"
    why = offline_reason(timeout_s)
    try:
        model = from_pretrained(name, device=device, local_files_only=why is not None)
    except Exception as exc:  # no network, not cached, a download cut short, an unsupported checkpoint
        if why is not None and isinstance(exc, OSError):
            reason = f"this machine is offline ({why}) and {name} is not in the local Hugging Face cache"
        else:
            reason = f"could not load {name} ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})"
        return None, f"No real model here: {reason}; {CONTINUES}."
    source = f"from the local cache (offline: {why})" if why else "from the Hugging Face hub"
    return model, f"loaded {name} {source}. {describe(model)}"


@dataclass
class RealModelDemo:
    """The three measurements on a real model, each a DataFrame (``frame.attrs`` records the settings)."""

    text: pd.DataFrame  # the prompt and its greedy continuation, decoded by the model's tokenizer
    speed: pd.DataFrame  # per cache ("none", "dynamic"): time per token early and late, their ratio, the median
    memory: pd.DataFrame  # per cache: bytes measured after the run next to the formula's
    scale: pd.DataFrame  # the formula at the model's full context, fp16 as served, batch 1 and 32

    def tables(self) -> dict[str, pd.DataFrame]:
        return {"text": self.text, "speed": self.speed, "memory": self.memory, "scale": self.scale}


def real_model_demo(model: Decoder, prompt: str = DEFAULT_PROMPT, new_tokens: int = 40,
                    slowdown_prompt_tokens: int = 64, slowdown_tokens: int = 32,
                    threads: int | None = None) -> RealModelDemo:
    """Readable text, the slowdown (none vs dynamic) and measured cache bytes vs the formula, on ``model``.

    The tables are ``RealModelDemo``'s. ``threads`` CPU threads for the timed runs (None keeps torch's setting: a real
    model on CPU needs every core to finish in seconds).
    """
    if not isinstance(slowdown_tokens, int) or slowdown_tokens < 16:
        raise ValueError(f"slowdown_tokens must be an integer >= 16 (an early and a late window of 5 tokens), "
                         f"got {slowdown_tokens!r}")
    cfg = model.config
    tok = model.tokenizer
    stops = [tok.eos_token_id] if tok is not None and tok.eos_token_id is not None else None
    out = generate(model, prompt, cache="dynamic", max_new_tokens=new_tokens, stop_tokens=stops)
    text = pd.DataFrame([dict(model=cfg.name, prompt=prompt, continuation=out.text, prompt_tokens=len(out.prompt_ids),
                              new_tokens=len(out.tokens), stop_reason=out.stop_reason,
                              ms_per_token=out.timeline.decode_ms_per_token, device=str(model.device))])

    frame = run_slowdown(model, prompt_tokens=slowdown_prompt_tokens, max_new_tokens=slowdown_tokens,
                         caches=("none", "dynamic"), threads=threads)
    speed = slowdown_summary(frame)[["cache", "early_token", "late_token", "early_step_ms", "late_step_ms",
                                     "measured_ratio", "work_ratio", "total_s"]]
    decode = frame[frame["token"] >= 1].groupby("cache", sort=False)["step_ms"].median()  # a stalled step moves no median
    speed = speed.assign(decode_ms_p50=speed["cache"].map(decode))
    speed["x_dynamic"] = speed["decode_ms_p50"] / float(decode["dynamic"])
    speed.attrs.update(frame.attrs)

    measured = measure_cache_memory(model, prompt_tokens=max(1, len(out.prompt_ids)), max_new_tokens=new_tokens,
                                    caches=("dynamic", "static"))
    last = measured.groupby("cache", sort=False).tail(1)
    counts = ["tokens", "allocated_bytes", "used_bytes", "formula_bytes"]
    memory = last[["cache", *counts]].astype(dict.fromkeys(counts, int)).reset_index(drop=True)
    memory["allocated_over_formula"] = memory["allocated_bytes"] / memory["formula_bytes"]
    memory["kib_per_token"] = memory["used_bytes"] / memory["tokens"] / 1024
    memory.attrs.update(measured.attrs)

    contexts = sorted({2048, cfg.max_position_embeddings})
    scale = kv_memory_table(cfg, contexts=contexts, batches=[1, 32], bytes_per_element=2)[
        ["model", "context", "batch", "bytes_per_element", "kv_gib", "weights_gib", "over_model_context"]]
    return RealModelDemo(text=text, speed=speed.reset_index(drop=True), memory=memory, scale=scale)


__all__ = ["DEFAULT_MODEL", "RealModelDemo", "hub_reachable", "offline_variable", "real_model_demo",
           "try_real_model"]
