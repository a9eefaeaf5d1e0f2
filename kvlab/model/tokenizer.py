"""Tokenizers: a built-in byte-level one for offline use, and a wrapper for a checkpoint's own."""
from __future__ import annotations

from itertools import groupby
from typing import Callable, Protocol


class Tokenizer(Protocol):
    """What kvlab needs of a tokenizer (it only reads these attributes)."""

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def _decode_known(ids: list[int], vocab_size: int, decode: Callable[[list[int]], str]) -> str:
    """Runs of ids below ``vocab_size`` through ``decode``; any other id shown as <id>."""
    return "".join(decode(list(run)) if known else "".join(f"<{i}>" for i in run)
                   for known, run in groupby(ids, key=lambda i: 0 <= i < vocab_size))


class ByteTokenizer:
    """UTF-8 bytes are tokens 0..255; 256 = BOS, 257 = EOS, 258 = PAD. Needs no file, works offline.

    One token per byte makes lengths easy to reason about: a 100-character ASCII prompt is 100 tokens.
    """

    bos_token_id = 256
    eos_token_id = 257
    pad_token_id = 258
    vocab_size = 259

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.bos_token_id, *ids] if add_bos else ids

    def decode(self, ids: list[int]) -> str:
        # Ids >= 256 are specials (or belong to a bigger vocabulary): shown as <id>.
        return _decode_known(ids, 256, lambda run: bytes(run).decode("utf-8", errors="replace"))

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=259)"


class HFTokenizer:
    """A transformers tokenizer behind the same small interface."""

    def __init__(self, hf_tokenizer) -> None:
        self.hf = hf_tokenizer
        self.eos_token_id, self.bos_token_id = hf_tokenizer.eos_token_id, hf_tokenizer.bos_token_id
        self.vocab_size = len(hf_tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        # A checkpoint's vocabulary is often padded past its tokenizer's (Qwen2.5: 151,936 rows for
        # 151,665 tokens); the tokenizer would silently drop such ids, so they are shown as <id>.
        return _decode_known(ids, self.vocab_size, self.hf.decode)

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.hf).__name__}, vocab_size={self.vocab_size})"
