"""One checkpoint folder two servers load: a kvlab model saved in transformers' format, with a tokenizer.

kvlab's lesson model (recall-tiny) ships without tokenizer files: kvlab reads it with its built-in `ByteTokenizer`
(bytes are tokens 0..255, 256 = BOS, 257 = EOS, 258 = PAD). `transformers serve` needs a tokenizer in the folder, so
`save_byte_tokenizer` writes one that gives exactly the same ids, a byte-level BPE with no merges (every byte is its
own token), and `save_shared_checkpoint` writes the model's weights (`kvlab.model.loading.to_transformers`) beside it,
or beside the model's own transformers tokenizer when it has one. Both servers then load the same weights and cut a
text prompt into the same tokens; `check_same_tokens` checks that on the folder, before any timing.

    >>> folder = save_shared_checkpoint(load_recall_model(), tmp / "recall-tiny-hf")  # doctest: +SKIP
    >>> check_same_tokens(folder)  # doctest: +SKIP
"""
from __future__ import annotations

from pathlib import Path

from kvlab.model.tokenizer import ByteTokenizer, HFTokenizer

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"  # ids 256, 257, 258, as in ByteTokenizer
SAMPLE = "The cache keeps keys and values; a server batches requests. ~{}[]|\\^`"


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (printable bytes stand for themselves)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    out, shifted = {b: chr(b) for b in kept}, 0
    for b in range(256):
        if b not in out:  # control bytes, space, ...: moved past 255, in order
            out[b] = chr(256 + shifted)
            shifted += 1
    return out


def byte_tokenizer():
    """A transformers fast tokenizer that encodes and decodes as `ByteTokenizer` does (no BOS added)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    byte_chars = _bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: one token per byte
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS, PAD])  # appended in order: 256, 257, 258
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD)


def save_byte_tokenizer(folder: str | Path) -> Path:
    """Write `byte_tokenizer()`'s files into `folder`; return the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    byte_tokenizer().save_pretrained(folder)
    return folder


def save_shared_checkpoint(model, folder: str | Path) -> Path:
    """Save a kvlab `Decoder` as a transformers checkpoint folder with a tokenizer; return the folder.

    The weights go through `to_transformers` (`save_pretrained`, safetensors); the tokenizer is the
    model's own when it came from a transformers checkpoint (`HFTokenizer`), else `byte_tokenizer()`.
    A tokenizer of any other kind is refused: the two servers would not cut text the same way.
    """
    from kvlab.model.loading import to_transformers

    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None and not isinstance(tokenizer, (ByteTokenizer, HFTokenizer)):
        raise ValueError(f"model.tokenizer is {tokenizer!r}; only ByteTokenizer or a transformers tokenizer "
                         "(HFTokenizer) can be saved beside the weights")
    if not isinstance(tokenizer, HFTokenizer) and model.config.vocab_size < ByteTokenizer.vocab_size:
        raise ValueError(f"the model's vocabulary ({model.config.vocab_size}) is smaller than the byte "
                         f"tokenizer's ({ByteTokenizer.vocab_size}); it cannot be served with it")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    hf = to_transformers(model)
    hf.generation_config.bos_token_id = model.config.bos_token_id
    hf.generation_config.eos_token_id = model.config.eos_token_id
    hf.save_pretrained(folder)
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.hf.save_pretrained(folder)
    else:
        save_byte_tokenizer(folder)
    return folder


def check_same_tokens(folder: str | Path, text: str = SAMPLE) -> list[int]:
    """Raise unless the folder's tokenizer, loaded as transformers serve loads it, cuts `text` as kvlab does.

    kvlab's side: `checkpoint_tokenizer(folder)`, the tokenizer `kvlab.from_pretrained(folder)` (and so
    `kvlab serve --model folder`) gives the model, read without loading the weights.
    transformers' side: `AutoTokenizer` called as its `/v1/completions` handler calls it
    (`tokenizer(prompt)`, special tokens included). Returns the ids.
    """
    import transformers

    from kvlab.model.loading import checkpoint_tokenizer

    ours = checkpoint_tokenizer(folder).encode(text)
    theirs = list(transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)(text)["input_ids"])
    if ours != theirs:
        raise ValueError(f"{folder}: kvlab and transformers cut {text!r} into different tokens "
                         f"({ours[:8]}... vs {theirs[:8]}...); save the folder with save_shared_checkpoint")
    return ours


__all__ = ["byte_tokenizer", "check_same_tokens", "save_byte_tokenizer", "save_shared_checkpoint"]
