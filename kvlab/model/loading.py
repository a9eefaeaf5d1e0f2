"""Loading: transformers models and checkpoints into kvlab's Decoder, and back."""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from kvlab.device import pick_device
from kvlab.model.config import ModelConfig
from kvlab.model.decoder import Decoder
from kvlab.model.tokenizer import ByteTokenizer, HFTokenizer

# "gpt2", "openai-community/gpt2", "Qwen/Qwen2.5-0.5B": a hub name (a path that is no directory is an error)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")

# transformers model_type -> kvlab arch
SUPPORTED_MODEL_TYPES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "gpt2": "gpt2"}


def _unsupported(what: str) -> ValueError:
    return ValueError(f"{what} is not supported by kvlab; supported model types: "
                      f"{', '.join(sorted(SUPPORTED_MODEL_TYPES))} (Llama/Mistral/Qwen2 and GPT-2 families)")


def config_from_transformers(hf_config) -> ModelConfig:
    """A kvlab ModelConfig from a transformers PretrainedConfig; unsupported features are refused by name."""
    model_type = getattr(hf_config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise _unsupported(f"architecture {model_type!r} ({', '.join(getattr(hf_config, 'architectures', None) or [])})")
    arch = SUPPORTED_MODEL_TYPES[model_type]
    if arch == "gpt2":
        if hf_config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            raise _unsupported(f"GPT-2 activation {hf_config.activation_function!r}")
        if hf_config.scale_attn_by_inverse_layer_idx or hf_config.reorder_and_upcast_attn:
            raise _unsupported("GPT-2 with scale_attn_by_inverse_layer_idx / reorder_and_upcast_attn")
        return ModelConfig(arch="gpt2", vocab_size=hf_config.vocab_size, hidden_size=hf_config.n_embd,
                           num_layers=hf_config.n_layer, num_heads=hf_config.n_head,
                           intermediate_size=hf_config.n_inner or 4 * hf_config.n_embd,
                           max_position_embeddings=hf_config.n_positions, norm_eps=hf_config.layer_norm_epsilon,
                           tie_word_embeddings=True, bos_token_id=hf_config.bos_token_id,
                           eos_token_id=hf_config.eos_token_id, name=getattr(hf_config, "name_or_path", "") or "gpt2")
    if hf_config.hidden_act != "silu":
        raise _unsupported(f"{model_type} with hidden_act {hf_config.hidden_act!r}")
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise _unsupported(f"{model_type} with attention_bias / mlp_bias")
    if getattr(hf_config, "sliding_window", None) and getattr(hf_config, "use_sliding_window", model_type == "mistral"):
        raise _unsupported(f"{model_type} with sliding-window attention")
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim not in (None, hf_config.hidden_size // hf_config.num_attention_heads):
        raise _unsupported(f"{model_type} with head_dim {head_dim} != hidden_size / num_heads")
    eos = hf_config.eos_token_id
    return ModelConfig(arch="llama", vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
                       num_layers=hf_config.num_hidden_layers, num_heads=hf_config.num_attention_heads,
                       num_kv_heads=hf_config.num_key_value_heads or hf_config.num_attention_heads,
                       intermediate_size=hf_config.intermediate_size,
                       max_position_embeddings=hf_config.max_position_embeddings,
                       rope_theta=float(getattr(hf_config, "rope_theta", None)
                                        or (getattr(hf_config, "rope_parameters", None) or {}).get("rope_theta", 10000.0)),
                       norm_eps=hf_config.rms_norm_eps, qkv_bias=model_type == "qwen2",
                       tie_word_embeddings=bool(hf_config.tie_word_embeddings), bos_token_id=hf_config.bos_token_id,
                       eos_token_id=eos[0] if isinstance(eos, (list, tuple)) else eos,
                       name=getattr(hf_config, "name_or_path", "") or model_type)


def _llama_weights(sd: Mapping[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """kvlab's parameters from a Llama-family state dict in transformers' names (a model's or a safetensors file's)."""
    out = {"embed": sd["model.embed_tokens.weight"], "final_norm.weight": sd["model.norm.weight"]}
    for i in range(cfg.num_layers):
        a, mlp, p = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp.", f"blocks.{i}."
        # transformers stores [out, in]; kvlab stores [in, out] (see decoder.py)
        out[p + "attn.w_qkv"] = torch.cat([sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]]).T
        if cfg.qkv_bias:
            out[p + "attn.b_qkv"] = torch.cat([sd[a + "q_proj.bias"], sd[a + "k_proj.bias"], sd[a + "v_proj.bias"]])
        out[p + "attn.w_o"] = sd[a + "o_proj.weight"].T
        out[p + "mlp.w_gate_up"] = torch.cat([sd[mlp + "gate_proj.weight"], sd[mlp + "up_proj.weight"]]).T
        out[p + "mlp.w_down"] = sd[mlp + "down_proj.weight"].T
        out[p + "attn_norm.weight"] = sd[f"model.layers.{i}.input_layernorm.weight"]
        out[p + "mlp_norm.weight"] = sd[f"model.layers.{i}.post_attention_layernorm.weight"]
    if not cfg.tie_word_embeddings:
        out["lm_head"] = sd["lm_head.weight"].T
    return out


def _gpt2_weights(hf, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    t, out = hf.transformer, {}
    out["embed"], out["pos_embed"] = t.wte.weight, t.wpe.weight
    for i, h in enumerate(t.h):
        p = f"blocks.{i}."
        # GPT-2's Conv1D already stores [in, out]
        out[p + "attn.w_qkv"], out[p + "attn.b_qkv"] = h.attn.c_attn.weight, h.attn.c_attn.bias
        out[p + "attn.w_o"], out[p + "attn.b_o"] = h.attn.c_proj.weight, h.attn.c_proj.bias
        out[p + "mlp.w_fc"], out[p + "mlp.b_fc"] = h.mlp.c_fc.weight, h.mlp.c_fc.bias
        out[p + "mlp.w_proj"], out[p + "mlp.b_proj"] = h.mlp.c_proj.weight, h.mlp.c_proj.bias
        out[p + "attn_norm.weight"], out[p + "attn_norm.bias"] = h.ln_1.weight, h.ln_1.bias
        out[p + "mlp_norm.weight"], out[p + "mlp_norm.bias"] = h.ln_2.weight, h.ln_2.bias
    out["final_norm.weight"], out["final_norm.bias"] = t.ln_f.weight, t.ln_f.bias
    return out


def _decoder_with(cfg: ModelConfig, weights: Mapping[str, torch.Tensor]) -> Decoder:
    """A Decoder of ``cfg`` holding ``weights`` (kvlab's names), every parameter set."""
    model = Decoder(cfg)
    missing = set(dict(model.named_parameters())) - set(weights)
    if missing:
        raise RuntimeError(f"conversion left parameters unset: {sorted(missing)}")
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name].detach().to(torch.float32).contiguous())
    return model


def from_transformers(hf_model, device: torch.device | str | None = None,
                      dtype: torch.dtype | None = torch.float32, tokenizer=None) -> Decoder:
    """Convert a transformers causal-LM object (Llama, Mistral, Qwen2, GPT-2) into a kvlab Decoder."""
    cfg = config_from_transformers(hf_model.config)
    if cfg.arch == "gpt2":
        model = _decoder_with(cfg, _gpt2_weights(hf_model, cfg))
    else:
        model = _decoder_with(cfg, _llama_weights(hf_model.state_dict(), cfg))
        # transformers' own rotary frequencies, so scaled RoPE variants (e.g. Llama 3) carry over
        rotary = getattr(hf_model.model, "rotary_emb", None)
        if rotary is not None and getattr(rotary, "attention_scaling", 1.0) != 1.0:
            raise _unsupported("RoPE scaling with attention_scaling != 1 (e.g. YaRN)")
        if rotary is not None:
            inv_freq = rotary.inv_freq  # (hs/2,)
            if inv_freq.dtype != torch.float32:  # cast by hf_model.to(dtype): recompute it in fp32
                inv_freq = type(rotary)(hf_model.config).inv_freq
            with torch.no_grad():
                model.inv_freq.copy_(inv_freq.float())
    model.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
    return model.to(device=pick_device(device), dtype=dtype or torch.float32).eval()


# A checkpoint kvlab reads without transformers: one safetensors file, no tokenizer of its own, a Llama-family
# config with plain RoPE (what kvlab saves, e.g. the shipped recall-tiny). Anything else goes through transformers.
TOKENIZER_FILES = ("tokenizer*", "vocab*", "merges.txt", "*.model", "special_tokens_map.json")


def read_plain_checkpoint(path: str | Path) -> Decoder | None:
    """The Decoder of a plain Llama-family checkpoint directory, read with safetensors alone, or None if it is not
    one (tokenizer files, sharded weights, GPT-2, scaled RoPE): then ``from_pretrained`` uses transformers.

    Skips importing transformers, most of a server's start-up on a small model; ``tests/test_pretrained_checkpoints``
    checks it yields the same parameters and buffers as the transformers path."""
    from types import SimpleNamespace

    from safetensors.torch import load_file

    path = Path(path)
    weights, config = path / "model.safetensors", path / "config.json"
    if not (weights.is_file() and config.is_file()) or any(any(path.glob(g)) for g in TOKENIZER_FILES):
        return None
    raw = json.loads(config.read_text())
    rope = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if SUPPORTED_MODEL_TYPES.get(raw.get("model_type")) != "llama" or rope.get("rope_type", "default") != "default":
        return None
    defaults = dict(num_key_value_heads=None, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                    hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=2048)  # LlamaConfig's defaults
    try:
        cfg = config_from_transformers(SimpleNamespace(**{**defaults, **raw}))
    except AttributeError:  # a key transformers would default some other way: let it read the config
        return None
    model = _decoder_with(cfg, _llama_weights(load_file(str(weights)), cfg))
    model.tokenizer = ByteTokenizer()
    return model


def to_transformers(model: Decoder):
    """The same weights as a transformers model (LlamaForCausalLM or GPT2LMHeadModel), for parity checks and saving."""
    import transformers

    cfg = model.config
    hf: transformers.PreTrainedModel
    if cfg.arch == "gpt2":
        hf_cfg = transformers.GPT2Config(vocab_size=cfg.vocab_size, n_embd=cfg.hidden_size, n_layer=cfg.num_layers,
                                         n_head=cfg.num_heads, n_inner=cfg.intermediate_size,
                                         n_positions=cfg.max_position_embeddings, layer_norm_epsilon=cfg.norm_eps,
                                         bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id)
        hf = transformers.GPT2LMHeadModel(hf_cfg)
    else:
        llama_kw: dict[str, Any] = dict(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, num_hidden_layers=cfg.num_layers,
            num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
            intermediate_size=cfg.intermediate_size, max_position_embeddings=cfg.max_position_embeddings,
            rope_theta=cfg.rope_theta, rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
            bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id)
        if cfg.qkv_bias:
            hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**llama_kw))
        else:
            hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**llama_kw))
    hf = hf.float().eval()
    src = dict(model.named_parameters())
    with torch.no_grad():
        if cfg.arch == "gpt2":
            for name, t in _gpt2_weights(hf, cfg).items():  # kvlab name -> the transformers tensor it maps to
                t.copy_(src[name])
        else:
            C, kv, I = cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
            for i, layer in enumerate(hf.model.layers):
                p, a = f"blocks.{i}.", layer.self_attn
                w = src[p + "attn.w_qkv"].T  # (q + 2 kv, C)
                a.q_proj.weight.copy_(w[:C]); a.k_proj.weight.copy_(w[C:C + kv]); a.v_proj.weight.copy_(w[C + kv:])
                if cfg.qkv_bias:
                    b = src[p + "attn.b_qkv"]
                    a.q_proj.bias.copy_(b[:C]); a.k_proj.bias.copy_(b[C:C + kv]); a.v_proj.bias.copy_(b[C + kv:])
                a.o_proj.weight.copy_(src[p + "attn.w_o"].T)
                gu = src[p + "mlp.w_gate_up"].T  # (2I, C)
                layer.mlp.gate_proj.weight.copy_(gu[:I]); layer.mlp.up_proj.weight.copy_(gu[I:])
                layer.mlp.down_proj.weight.copy_(src[p + "mlp.w_down"].T)
                layer.input_layernorm.weight.copy_(src[p + "attn_norm.weight"])
                layer.post_attention_layernorm.weight.copy_(src[p + "mlp_norm.weight"])
            hf.model.embed_tokens.weight.copy_(src["embed"])
            hf.model.norm.weight.copy_(src["final_norm.weight"])
            if not cfg.tie_word_embeddings:
                hf.lm_head.weight.copy_(src["lm_head"].T)
    return hf


def checkpoint_tokenizer(name_or_path: str | Path, local_files_only: bool = True):
    """The tokenizer ``from_pretrained`` gives a checkpoint: its own (transformers' AutoTokenizer behind kvlab's
    interface), or kvlab's ByteTokenizer where it has none (with a warning where its files fail to load)."""
    import transformers

    path = Path(name_or_path)
    try:
        return HFTokenizer(transformers.AutoTokenizer.from_pretrained(str(name_or_path),
                                                                      local_files_only=local_files_only))
    except (OSError, ValueError, TypeError) as exc:
        if not path.is_dir() or any(path.glob("tokenizer*")):  # it has a tokenizer, which failed to load: say so
            warnings.warn(f"could not load the tokenizer of {name_or_path} ({type(exc).__name__}: {exc}); using "
                          "kvlab's ByteTokenizer, so text will not match what the model was trained on",
                          stacklevel=3)
        return ByteTokenizer()


def from_pretrained(name_or_path: str | Path, device: torch.device | str | None = None,
                    dtype: torch.dtype = torch.float32, local_files_only: bool | None = None) -> Decoder:
    """Load a checkpoint directory offline (or a hub name where the hub is reachable) into kvlab.

    Hub names of the supported families work as they are, e.g. ``"openai-community/gpt2"``,
    ``"HuggingFaceTB/SmolLM2-135M"`` (Llama) or ``"Qwen/Qwen2.5-0.5B"`` (downloaded once into the Hugging Face cache;
    with HF_HUB_OFFLINE=1 only the cache is read). The architecture is checked before any weights are read. The
    checkpoint's own tokenizer (transformers' AutoTokenizer, behind kvlab's small tokenizer interface) becomes
    ``model.tokenizer``, so ``kvlab.generate(model, "some text")`` takes and returns text; a checkpoint without
    tokenizer files gets the built-in ByteTokenizer. Weights are converted to ``dtype`` (fp32 by default); RoPE's
    frequencies and angles stay fp32 whatever it is (``Decoder._apply``), as in transformers. ``local_files_only=True``
    reads a hub name from the local cache only, never the network (default: True for a directory, else transformers' own
    rule).
    """
    path = Path(name_or_path)
    local = path.is_dir()
    plain = read_plain_checkpoint(path) if local else None
    if plain is not None:
        plain.config.name = str(name_or_path)
        return plain.to(device=pick_device(device), dtype=dtype).eval()
    import transformers

    if not local and not HUB_ID.fullmatch(str(name_or_path)):
        raise FileNotFoundError(f"no checkpoint directory at {name_or_path}; pass a directory holding "
                                "config.json and weights, or a hub model name such as 'HuggingFaceTB/SmolLM2-135M'")
    local = local or bool(local_files_only)
    try:
        hf_config = transformers.AutoConfig.from_pretrained(str(name_or_path), local_files_only=local)
    except OSError as exc:
        if path.is_dir():
            raise
        raise OSError(f"could not get {name_or_path!r} from the Hugging Face hub or its local cache ({exc}); "
                      "check the name, or, offline, download it once where the hub is reachable, "
                      "or pass a checkpoint directory") from exc
    config_from_transformers(hf_config)  # refuse unsupported architectures before loading weights
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(name_or_path), local_files_only=local,
                                                           dtype=torch.float32)
    model = from_transformers(hf, device=device, dtype=dtype, tokenizer=checkpoint_tokenizer(name_or_path, local))
    model.config.name = str(name_or_path)
    return model
