"""Tiny checkpoints of each supported family, written offline: random weights and a tokenizer trained here.

A hub checkpoint is a folder: ``config.json``, the weights, and the tokenizer's files. This module writes such a folder
with ``save_pretrained`` for a GPT-2, a Llama or a Qwen2 model of a few hundred thousand parameters, beside a small
byte-level BPE tokenizer trained in a fraction of a second on generated sentences (the ``tokenizers`` library, which
transformers depends on). The loading tests and the real-model demonstration run on these folders exactly as they would
on ``openai-community/gpt2``, ``HuggingFaceTB/SmolLM2-135M`` or ``Qwen/Qwen2.5-0.5B``, with no network.

    >>> folder = save_tiny_checkpoint(tmp / "tiny-qwen2", "qwen2")
    >>> model = kvlab.from_pretrained(folder)        # the checkpoint's own tokenizer comes with it
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch

FAMILIES = ("gpt2", "llama", "qwen2")
TOKENIZER_VOCAB = 360  # 256 byte tokens, the special token and 103 merges
SPECIAL = "<|endoftext|>"  # bos = eos, as in GPT-2 and SmolLM2

_WORDS = ("the cache keeps keys and values of every token so each step computes only the new one while "
          "a server batches many requests whose prompts share a prefix and the memory of a long context "
          "grows with layers heads and tokens").split()


def corpus(lines: int = 400, seed: int = 0) -> list[str]:
    """Seeded sentences made of the lab's own words (with capitals, digits and punctuation) to train a tokenizer on."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 18))]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + rng.choice((".", ",", "!", "?", f" {i}.")))
    return out


def train_tokenizer(vocab_size: int = TOKENIZER_VOCAB, seed: int = 0):
    """A byte-level BPE tokenizer (GPT-2's scheme) trained on ``corpus()``, as a transformers fast tokenizer.

    Byte-level: any text encodes (unknown characters fall back to their UTF-8 bytes) and decodes
    back to itself exactly. BOS and EOS are both ``<|endoftext|>`` (id 0).
    """
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[SPECIAL], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed=seed), trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=SPECIAL, eos_token=SPECIAL)


def tiny_transformers_model(family: str, vocab_size: int, seed: int = 0):
    """A transformers causal LM of ``family`` with a tiny config and seeded random weights.

    Weights are drawn wider than transformers' default (std 0.2) and biases and norms are made
    non-trivial, so logits differ clearly between tokens and a mix-up of any tensor shows.
    """
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    torch.manual_seed(seed)
    hf: transformers.PreTrainedModel
    common: dict[str, Any] = dict(vocab_size=vocab_size, bos_token_id=0, eos_token_id=0, initializer_range=0.2)
    if family == "gpt2":
        hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, n_positions=512,
                                                                  **common))
    elif family == "llama":  # grouped-query attention, untied output layer, Llama-3-style rope_theta
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(  # type: ignore[call-arg]  # accepts legacy rope_theta
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=512, rope_theta=500000.0, tie_word_embeddings=False, **common))
    else:  # qwen2: Llama's layout plus q/k/v biases, tied embeddings
        hf = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
            hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
            max_position_embeddings=512, tie_word_embeddings=True, **common))
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if name.endswith("bias"):  # transformers starts biases at zero: make them matter
                p.normal_(0.0, 0.2)
            elif "ln_" in name or "norm" in name:
                p.normal_(1.0, 0.2)
    return hf.float().eval()


def save_tiny_checkpoint(folder: str | Path, family: str = "llama", seed: int = 0,
                         pad_vocab_to: int | None = 64) -> Path:
    """Write a tiny ``family`` checkpoint with its tokenizer into ``folder`` (``save_pretrained``); return the folder.

    The model's vocabulary is the tokenizer's rounded up to a multiple of ``pad_vocab_to``, as
    real checkpoints pad theirs (Qwen2.5: 151,936 rows for 151,665 tokens); None keeps it equal.
    """
    tokenizer = train_tokenizer(seed=seed)
    vocab = len(tokenizer)
    if pad_vocab_to:
        vocab = -(-vocab // pad_vocab_to) * pad_vocab_to
    hf = tiny_transformers_model(family, vocab, seed=seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


__all__ = ["FAMILIES", "corpus", "save_tiny_checkpoint", "tiny_transformers_model", "train_tokenizer"]
