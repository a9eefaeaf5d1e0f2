"""Tokens are not words: the same texts through several tokenizers, and what that does to tokens/s.

A serving benchmark counts *tokens* per second, but a reader gets *words*, and how many tokens a word costs depends on
the tokenizer and on the language. This module puts one short paragraph, translated into several languages, plus a code
snippet and a line of numbers (all shipped in ``kvlab/data/texts/samples.json``), through:

- kvlab's ``ByteTokenizer``: one token per UTF-8 byte, so the counts are exact and the same everywhere;
- a byte-level BPE tokenizer trained here, offline, in a few milliseconds, with the ``tokenizers`` library on a small
  English corpus that kvlab ships (``texts/english_corpus.txt``): it learns English words and pieces of words, and
  nothing of other scripts;
- a real model's tokenizer (SmolLM2-135M's by default) where the machine is online or has it in its Hugging Face cache;
  elsewhere one line says so and the comparison keeps the other two.

    toks, note = lesson_tokenizers()
    counts = count_tokens(toks)              # one row per (text, tokenizer): tokens, words, per word, ...
    tokens_table(counts)                     # the same, one row per text
    rates = tokens_per_second(counts, words_per_s=10)   # the same words/s, in tokens/s per tokenizer
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from kvlab.data import shipped
from kvlab.model.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from kvlab.provenance import experiment

SAMPLES = "texts/samples.json"
CORPUS = "texts/english_corpus.txt"
BYTE = "kvlab bytes"  # the names the tables, plots and claims use for the two tokenizers kvlab builds
BPE = "BPE on English"
REAL_TOKENIZER = "HuggingFaceTB/SmolLM2-135M"
REFERENCE = "English"  # the prose texts are translations of this one


@dataclass(frozen=True)
class Sample:
    """One sample text: its name (a language, "Python code", "numbers"), kind and whether spaces separate words."""

    name: str
    kind: str  # "prose" (a translation of the English paragraph), "code" or "numbers"
    text: str
    spaced: bool  # False for Chinese and Japanese: no spaces between words, so no word count

    @property
    def words(self) -> int | None:
        """Whitespace-separated words (None where the script does not separate words with spaces)."""
        return len(self.text.split()) if self.spaced else None


def load_samples(path: str | Path | None = None) -> list[Sample]:
    """The shipped sample texts (or those of a JSON file of the same shape), in their file order."""
    raw = json.loads(Path(path or shipped(SAMPLES)).read_text(encoding="utf-8"))
    return [Sample(t["name"], t["kind"], t["text"], bool(t["spaced"])) for t in raw["texts"]]


def training_corpus() -> str:
    """The small English corpus the BPE tokenizer is trained on (shipped with kvlab, written for it)."""
    return shipped(CORPUS).read_text(encoding="utf-8")


# -- a BPE tokenizer trained here ---------------------------------------------------------------------------
class TrainedBPE:
    """A byte-level BPE tokenizer (the GPT-2 scheme) trained with the ``tokenizers`` library, behind kvlab's interface.

    Byte-level means every text can be encoded: what the merges never saw falls back to one token per byte, exactly like
    ``ByteTokenizer``. No special tokens.
    """

    bos_token_id: int | None = None
    eos_token_id: int | None = None

    def __init__(self, tokenizer, corpus_chars: int) -> None:
        self.tk = tokenizer  # a tokenizers.Tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.corpus_chars = corpus_chars

    def encode(self, text: str) -> list[int]:
        return list(self.tk.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tk.decode(list(ids))

    def __repr__(self) -> str:
        return f"TrainedBPE(vocab_size={self.vocab_size}, trained on {self.corpus_chars:,} characters)"


def train_bpe(corpus: str | None = None, vocab_size: int = 1024, min_frequency: int = 2) -> TrainedBPE:
    """Train a byte-level BPE tokenizer on ``corpus`` (default: kvlab's English corpus); deterministic, offline.

    The vocabulary starts from the 256 byte symbols and adds merges (the most frequent adjacent pair first, ties broken
    by the pair itself) until ``vocab_size`` or until no pair occurs ``min_frequency`` times: on the shipped corpus that
    stops before 1,024, and the result is the same on every run.
    """
    from tokenizers import Tokenizer as HFTokenizerModel
    from tokenizers import decoders, models, pre_tokenizers, trainers

    if not isinstance(vocab_size, int) or vocab_size <= 256:
        raise ValueError(f"vocab_size must be an integer above 256 (the byte alphabet), got {vocab_size!r}")
    text = training_corpus() if corpus is None else corpus
    if not text.strip():
        raise ValueError("the training corpus is empty; pass some text, or None for kvlab's English corpus")
    tk = HFTokenizerModel(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tk.train_from_iterator(text.splitlines(), trainer)
    return TrainedBPE(tk, len(text))


# -- a real model's tokenizer, where there is one ------------------------------------------------------------
def _cached_on_disk(name: str) -> bool:
    """Whether the local Hugging Face cache holds ``name``'s tokenizer (checked without importing transformers)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return any(isinstance(try_to_load_from_cache(name, f), str)
               for f in ("tokenizer.json", "tokenizer_config.json"))


def real_tokenizer(name: str | Path = REAL_TOKENIZER, timeout_s: float = 2.5) -> tuple[Tokenizer | None, str]:
    """A trained model's own tokenizer where possible: ``(tokenizer, note)``, else ``(None, note)``.

    ``name`` is a hub name ("HuggingFaceTB/SmolLM2-135M", "Qwen/Qwen2.5-0.5B", ...) or a directory with a saved
    tokenizer. Only the tokenizer's files are fetched (a few MB, no weights); offline (``real_model.offline_reason``)
    only the local Hugging Face cache is tried.
    """
    from kvlab.experiments.real_model import offline_reason

    why = None if Path(name).is_dir() else offline_reason(timeout_s)
    if why is not None and not _cached_on_disk(str(name)):
        return None, (f"No real model's tokenizer here: this machine is offline ({why}) and {name}'s tokenizer "
                      f"is not in the local Hugging Face cache; the comparison continues with kvlab's two tokenizers.")
    try:
        from transformers import AutoTokenizer

        tok = HFTokenizer(AutoTokenizer.from_pretrained(str(name), local_files_only=why is not None))
    except Exception as exc:  # not cached after all, a download cut short, no tokenizer files
        return None, (f"No real model's tokenizer here: could not load {name}'s "
                      f"({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}); "
                      f"the comparison continues with kvlab's two tokenizers.")
    source = (f"from the local cache (offline: {why})" if why
              else f"from {name}" if Path(name).is_dir() else "from the Hugging Face hub")
    return tok, f"Loaded {name}'s tokenizer {source}: {tok.vocab_size:,} tokens in its vocabulary."


def lesson_tokenizers(real: str | Path | None = REAL_TOKENIZER, timeout_s: float = 2.5,
                      bpe: TrainedBPE | None = None) -> tuple[dict[str, Tokenizer], str]:
    """The lesson's tokenizers by name: kvlab's bytes, the BPE trained on English, and a real one if available.

    ``real=None`` leaves the real tokenizer out (no network probe). Returns ``(tokenizers, note)``.
    """
    toks: dict[str, Tokenizer] = {BYTE: ByteTokenizer(), BPE: bpe if bpe is not None else train_bpe()}
    note = "No real model's tokenizer asked for (real=None); the comparison uses kvlab's two tokenizers."
    if real is not None:
        tok, note = real_tokenizer(real, timeout_s=timeout_s)
        if tok is not None:
            toks[f"{Path(str(real)).name}"] = tok
    return toks, note


# -- counting ------------------------------------------------------------------------------------------------
@experiment
def count_tokens(tokenizers: dict[str, Tokenizer], samples: list[Sample] | None = None) -> pd.DataFrame:
    """One row per (text, tokenizer): characters, UTF-8 bytes, words, tokens and the ratios between them.

    - ``tokens_per_word``: tokens / whitespace-separated words (NaN for Chinese and Japanese, which put no spaces
      between words);
    - ``tokens_per_char``: tokens / characters (Unicode code points);
    - ``vs_english``: for the prose texts (all say the same thing), tokens / the English paragraph's tokens with the
      same tokenizer: what the same content costs in that language;
    - ``tokens_per_english_word``: tokens / the English paragraph's words, the cost of the same content per word a
      reader of the English version gets (defined for every language, spaces or not).
    """
    samples = load_samples() if samples is None else samples
    if not tokenizers:
        raise ValueError("no tokenizers given; pass e.g. {'kvlab bytes': ByteTokenizer()}")
    if not samples:
        raise ValueError("no sample texts given")
    ref = next((s for s in samples if s.name == REFERENCE), None)
    frame = pd.DataFrame([dict(text=s.name, kind=s.kind, tokenizer=name, chars=len(s.text),
                               bytes=len(s.text.encode("utf-8")), words=s.words, tokens=len(tok.encode(s.text)))
                          for s in samples for name, tok in tokenizers.items()])
    frame["words"] = frame["words"].astype("Int64")
    frame["tokens_per_word"] = frame["tokens"] / frame["words"].astype(float)
    frame["tokens_per_char"] = frame["tokens"] / frame["chars"]
    prose = frame["kind"] == "prose"
    if ref is not None:
        ref_tokens = frame[frame["text"] == REFERENCE].set_index("tokenizer")["tokens"]
        frame["vs_english"] = (frame["tokens"] / frame["tokenizer"].map(ref_tokens)).where(prose)
        frame["tokens_per_english_word"] = (frame["tokens"] / ref.words).where(prose)
    else:
        frame["vs_english"] = frame["tokens_per_english_word"] = float("nan")
    frame.attrs.update(tokenizers={name: repr(tok) for name, tok in tokenizers.items()},
                       english_words=ref.words if ref is not None else None)
    return frame


def tokens_table(counts: pd.DataFrame, columns: tuple[str, ...] = ("tokens", "tokens_per_word", "vs_english")
                 ) -> pd.DataFrame:
    """``counts`` with one row per text (in sample order): words and characters, then ``columns`` per tokenizer."""
    order = list(dict.fromkeys(counts["text"]))
    toks = list(dict.fromkeys(counts["tokenizer"]))
    base = counts.drop_duplicates("text").set_index("text").loc[order, ["words", "chars"]]
    base.columns = pd.MultiIndex.from_product([["text"], base.columns])
    wide = counts.pivot(index="text", columns="tokenizer", values=list(columns)).loc[order]
    wide = wide.swaplevel(axis=1)[[(t, c) for t in toks for c in columns]]
    for key in [k for k in wide.columns if k[1] == "tokens"]:
        wide[key] = wide[key].astype("Int64")  # counts stay integers
    table = pd.concat([base, wide], axis=1)
    table.index.name = None
    return table


_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def pieces(tokenizers: dict[str, Tokenizer], text: str, limit: int = 24) -> pd.DataFrame:
    """How ``text`` is cut by each tokenizer: the token count and the first ``limit`` pieces, "|"-separated.

    Spaces are drawn as "␣". A character split over several tokens (its UTF-8 bytes, when the tokenizer never learned it
    whole) is shown once with the number of tokens it took as an exponent: "图³" is one character, three tokens.
    """
    rows = []
    for name, tok in tokenizers.items():
        ids = tok.encode(text)
        cut: list[str] = []
        group: list[int] = []
        used = 0
        for i in ids:
            if len(cut) == limit:
                break
            group.append(i)
            used += 1
            piece = tok.decode(group)
            if "\ufffd" in piece and len(group) < 8 and used < len(ids):
                continue  # part of a character: wait for its other bytes
            shown = piece.replace(" ", "␣").replace("\n", "⏎")
            cut.append(shown + (str(len(group)).translate(_SUPERSCRIPT) if len(group) > 1 else ""))
            group = []
        rows.append(dict(tokenizer=name, tokens=len(ids), pieces="|".join(cut) + ("|…" if used < len(ids) else "")))
    return pd.DataFrame(rows)


def first_sentences(tokenizers: dict[str, Tokenizer], names: tuple[str, ...] = ("English", "Finnish", "Chinese"),
                    samples: list[Sample] | None = None, limit: int = 24) -> pd.DataFrame:
    """``pieces`` of the first sentence of each named sample text, one row per (text, tokenizer)."""
    by_name = {s.name: s for s in (load_samples() if samples is None else samples)}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ValueError(f"no sample text named {unknown}; the samples are {list(by_name)}")
    frames = []
    for n in names:
        text = by_name[n].text
        end = min((text.index(p) + 1 for p in (". ", "。", "। ") if p in text), default=len(text))
        frames.append(pieces(tokenizers, text[:end], limit=limit).assign(text=n))
    return pd.concat(frames, ignore_index=True)[["text", "tokenizer", "tokens", "pieces"]]


def by_text(frame: pd.DataFrame, value: str) -> pd.DataFrame:
    """``frame``'s ``value`` with one row per text and one column per tokenizer, both in their first-seen order."""
    wide = frame.pivot(index="text", columns="tokenizer", values=value)
    wide = wide.loc[list(dict.fromkeys(frame["text"])), list(dict.fromkeys(frame["tokenizer"]))]
    wide.index.name = wide.columns.name = None
    return wide


def vs_english(counts: pd.DataFrame, text: str, tokenizer: str = BPE) -> float:
    """How many times the English paragraph's tokens ``tokenizer`` spent on the translation ``text``."""
    rows = counts[(counts["text"] == text) & (counts["tokenizer"] == tokenizer)]
    if rows.empty:
        raise ValueError(f"no counts for {text!r} with {tokenizer!r}; texts: {sorted(set(counts['text']))}, "
                         f"tokenizers: {sorted(set(counts['tokenizer']))}")
    return float(rows["vs_english"].iloc[0])


def chinese_vs_english(counts: pd.DataFrame) -> tuple[float, dict[str, int]]:
    """The measure of a prediction: the BPE's tokens for the Chinese paragraph over the English one's,
    with the two counts it is computed from (what no output before the question may show)."""
    bpe = counts[counts["tokenizer"] == BPE].set_index("text")["tokens"]
    return vs_english(counts, "Chinese"), {"BPE tokens, English paragraph": int(bpe[REFERENCE]),
                                           "BPE tokens, Chinese paragraph": int(bpe["Chinese"])}


# -- what it does to tokens/s ----------------------------------------------------------------------------------
def tokens_per_second(counts: pd.DataFrame, words_per_s: float = 10.0) -> pd.DataFrame:
    """Tokens/s of models that all write the same content at ``words_per_s`` words/s (prose texts).

    Words are counted in the English version, so every language carries the same content per second: tokens/s =
    ``words_per_s`` x tokens / English words. One row per (text, tokenizer).
    """
    if not words_per_s > 0:
        raise ValueError(f"words_per_s must be positive, got {words_per_s!r}")
    prose = counts[counts["kind"] == "prose"].dropna(subset=["tokens_per_english_word"])
    if prose.empty:
        raise ValueError("counts holds no prose text with an English reference; count the shipped samples")
    out = prose[["text", "tokenizer", "tokens_per_english_word", "vs_english"]].copy()
    out["tokens_per_s"] = words_per_s * out["tokens_per_english_word"]
    out.attrs.update(counts.attrs, words_per_s=float(words_per_s))
    return out.reset_index(drop=True)


def words_per_second(counts: pd.DataFrame, tokens_per_s: dict[str, float], text: str = REFERENCE) -> pd.DataFrame:
    """What a reported tokens/s means in words/s of ``text``: one row per model, named by its tokenizer.

    ``tokens_per_s`` maps a tokenizer of ``counts`` to the tokens/s a model using it reports. Words are ``text``'s own;
    for Chinese and Japanese (no spaces) those of the English version.
    """
    rows = counts[counts["text"] == text].set_index("tokenizer")
    rows = rows.assign(tokens_per_word=rows["tokens_per_word"].fillna(rows["tokens_per_english_word"]))
    unknown = [t for t in tokens_per_s if t not in rows.index]
    if unknown:
        raise ValueError(f"no counts for tokenizer(s) {unknown} on {text!r}; counted: {list(rows.index)}")
    out = pd.DataFrame([dict(tokenizer=t, text=text, tokens_per_s=float(r),
                             tokens_per_word=float(rows.loc[t, "tokens_per_word"]),
                             words_per_s=float(r) / float(rows.loc[t, "tokens_per_word"]))
                        for t, r in tokens_per_s.items()])
    out.attrs.update(counts.attrs)
    return out


__all__ = ["BPE", "BYTE", "CORPUS", "REAL_TOKENIZER", "SAMPLES", "Sample", "TrainedBPE", "by_text", "count_tokens",
           "first_sentences", "lesson_tokenizers", "load_samples", "pieces", "real_tokenizer", "tokens_per_second",
           "tokens_table", "train_bpe", "training_corpus", "vs_english", "words_per_second"]
