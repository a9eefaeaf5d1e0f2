"""Lesson 04, tokens are not words: the shipped texts, the BPE trained offline, the counts and what they do to tokens/s."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time

import pytest
from matplotlib.figure import Figure

from kvlab.experiments import tokens_words as tw
from kvlab.experiments.tokens_words import (BPE, BYTE, REFERENCE, by_text, count_tokens, first_sentences,
                                            lesson_tokenizers, load_samples, pieces, real_tokenizer, tokens_per_second,
                                            tokens_table, train_bpe, training_corpus, words_per_second)
from kvlab.model.tokenizer import ByteTokenizer
from kvlab.lessons.l04_four_clocks.figures import plot_tokens_per_word

LESSONS = ("02", "04")  # the lessons these tests belong to: `pytest -m lNN`


@pytest.fixture(scope="module")
def toks():
    return lesson_tokenizers(real=None)[0]


@pytest.fixture(scope="module")
def counts(toks):
    return count_tokens(toks)


def test_the_shipped_samples_are_one_paragraph_in_many_languages_plus_code_and_numbers():
    samples = load_samples()
    names = [s.name for s in samples]
    assert names[0] == REFERENCE and len(names) == len(set(names))
    prose = [s for s in samples if s.kind == "prose"]
    assert len(prose) >= 10 and {"Chinese", "Japanese", "Finnish", "Hindi", "Arabic"} <= set(names)
    assert {s.kind for s in samples} == {"prose", "code", "numbers"}
    assert [s.name for s in samples if not s.spaced] == ["Chinese", "Japanese"]
    assert all(s.words is None for s in samples if not s.spaced) and load_samples()[0].words == len(prose[0].text.split())
    corpus = training_corpus()
    assert 3_000 < len(corpus) < 20_000 and corpus.isascii()  # small, and English only
    assert all(s.text not in corpus for s in samples)  # the paragraphs are held out of the training text


def test_the_byte_tokenizer_counts_exactly_the_utf8_bytes(counts):
    rows = counts[counts["tokenizer"] == BYTE].set_index("text")
    assert (rows["tokens"] == rows["bytes"]).all()
    assert rows.loc[REFERENCE, "tokens"] == rows.loc[REFERENCE, "chars"]  # ASCII: one byte per character
    assert rows.loc["Chinese", "tokens"] == 3 * rows.loc["Chinese", "chars"]
    assert math.isnan(rows.loc["Chinese", "tokens_per_word"]) and math.isnan(rows.loc["numbers", "vs_english"])
    assert rows.loc[REFERENCE, "vs_english"] == 1.0
    assert rows.loc["Hindi", "tokens_per_english_word"] == rows.loc["Hindi", "tokens"] / counts.attrs["english_words"]


def test_the_bpe_trains_in_well_under_a_second_and_is_the_same_every_time():
    start = time.perf_counter()
    a = train_bpe()
    assert time.perf_counter() - start < 2.0  # milliseconds on a quiet machine
    b = train_bpe()
    assert a.tk.to_str() == b.tk.to_str() and 256 < a.vocab_size <= 1024
    text = " ".join(s.text for s in load_samples())
    assert a.encode(text) == b.encode(text)


def test_the_bpe_is_the_same_in_a_fresh_process():
    script = ("import json; from kvlab.experiments.tokens_words import train_bpe, load_samples;"
              "b = train_bpe(); print(json.dumps([b.vocab_size] + [len(b.encode(s.text)) for s in load_samples()]))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    b = train_bpe()
    assert json.loads(out) == [b.vocab_size] + [len(b.encode(s.text)) for s in load_samples()]


def test_the_bpe_is_lossless_and_falls_back_to_bytes_on_what_it_never_saw():
    bpe = train_bpe()
    for s in load_samples():
        assert bpe.decode(bpe.encode(s.text)) == s.text
    assert len(bpe.encode("图书馆")) == len("图书馆".encode("utf-8"))  # no Chinese in its corpus: one token per byte
    assert len(bpe.encode("the morning")) < len("the morning") / 2


def test_the_english_trained_bpe_favours_english(counts):
    bpe = counts[(counts["tokenizer"] == BPE) & (counts["kind"] == "prose")].set_index("text")
    assert bpe["vs_english"].drop(REFERENCE).min() > 1.5
    byte = counts[counts["tokenizer"] == BYTE].set_index("text")
    assert bpe.loc[REFERENCE, "tokens_per_word"] < byte.loc[REFERENCE, "tokens_per_word"] / 2
    assert byte.loc["Chinese", "vs_english"] < 1 < bpe.loc["Chinese", "vs_english"]  # bytes: Chinese is cheaper


def test_train_bpe_rejects_what_cannot_train():
    with pytest.raises(ValueError, match="above 256"):
        train_bpe(vocab_size=100)
    with pytest.raises(ValueError, match="empty"):
        train_bpe(corpus="  \n")
    small = train_bpe(corpus=training_corpus(), vocab_size=300)
    assert small.vocab_size == 300 and len(small.encode("the morning")) > len(train_bpe().encode("the morning"))


def test_the_tables_keep_the_sample_and_tokenizer_order(counts):
    table = tokens_table(counts)
    assert list(table.index) == [s.name for s in load_samples()]
    assert list(table.columns[:2]) == [("text", "words"), ("text", "chars")]
    assert [c[0] for c in table.columns[2:]] == [BYTE] * 3 + [BPE] * 3
    assert table.loc["Finnish", (BPE, "tokens")] == counts.query("text == 'Finnish' and tokenizer == @BPE")["tokens"].item()
    wide = by_text(counts, "tokens")
    assert list(wide.columns) == [BYTE, BPE] and wide.index[0] == REFERENCE


def test_the_same_words_per_second_in_tokens_per_second(counts):
    rates = tokens_per_second(counts, words_per_s=10)
    assert set(rates["text"]) == {s.name for s in load_samples() if s.kind == "prose"}
    en = rates[rates["text"] == REFERENCE].set_index("tokenizer")["tokens_per_s"]
    n_words = counts.attrs["english_words"]
    byte_tokens = counts.query("text == @REFERENCE and tokenizer == @BYTE")["tokens"].item()
    assert en[BYTE] == pytest.approx(10 * byte_tokens / n_words) and en[BYTE] > 2 * en[BPE]
    assert rates.attrs["words_per_s"] == 10.0
    with pytest.raises(ValueError, match="positive"):
        tokens_per_second(counts, words_per_s=0)


def test_reported_tokens_per_second_in_words_per_second(counts):
    words = words_per_second(counts, {BYTE: 50, BPE: 20}).set_index("tokenizer")
    assert words.loc[BPE, "words_per_s"] > words.loc[BYTE, "words_per_s"]  # fewer tokens/s, more words
    assert words.loc[BYTE, "words_per_s"] == pytest.approx(50 / words.loc[BYTE, "tokens_per_word"])
    zh = words_per_second(counts, {BPE: 20}, text="Chinese")  # no spaces: words of the English version
    assert zh["tokens_per_word"].item() == pytest.approx(
        counts.query("text == 'Chinese' and tokenizer == @BPE")["tokens_per_english_word"].item())
    with pytest.raises(ValueError, match="no counts for tokenizer"):
        words_per_second(counts, {"gpt-9": 10})


def test_pieces_show_a_character_split_over_bytes_once_with_its_count(toks):
    cut = pieces(toks, "图书 ab").set_index("tokenizer")
    assert cut.loc[BYTE, "pieces"] == "图³|书³|␣|a|b" and cut.loc[BYTE, "tokens"] == 9
    assert pieces({BYTE: ByteTokenizer()}, "abc", limit=2)["pieces"].item() == "a|b|…"
    assert pieces({BYTE: ByteTokenizer()}, "ab", limit=2)["pieces"].item() == "a|b"
    first = first_sentences(toks)
    assert list(first["text"].unique()) == ["English", "Finnish", "Chinese"] and len(first) == 2 * 3
    assert first.query("text == 'English' and tokenizer == @BPE")["pieces"].item().endswith(".")
    with pytest.raises(ValueError, match="no sample text named"):
        first_sentences(toks, ("Klingon",))


def test_offline_the_real_tokenizer_is_one_line_and_nothing_else(monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr("kvlab.experiments.real_model.hub_reachable", lambda timeout_s=2.5, endpoint=None: False)
    monkeypatch.setattr(tw, "_cached_on_disk", lambda name: False)
    tok, note = real_tokenizer("someone/not-a-model", timeout_s=0.1)
    assert tok is None and "\n" not in note and "offline" in note and "continues with kvlab's two" in note
    toks, note2 = lesson_tokenizers(real="someone/not-a-model", timeout_s=0.1)
    assert list(toks) == [BYTE, BPE] and note2 == note
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE=1 is set" in real_tokenizer("someone/not-a-model")[1]


def test_a_saved_tokenizer_directory_loads_as_the_real_one(tmp_path):
    from transformers import PreTrainedTokenizerFast

    bpe = train_bpe()
    PreTrainedTokenizerFast(tokenizer_object=bpe.tk).save_pretrained(tmp_path / "my-tokenizer")
    toks, note = lesson_tokenizers(real=tmp_path / "my-tokenizer", bpe=bpe)
    assert list(toks) == [BYTE, BPE, "my-tokenizer"] and note.startswith("Loaded") and "from " in note
    counts = count_tokens(toks)
    by = by_text(counts, "tokens")
    assert (by["my-tokenizer"] == by[BPE]).all()


def test_the_plot_has_a_panel_per_view(counts):
    fig = plot_tokens_per_word(counts, tokens_per_second(counts, words_per_s=10))
    assert isinstance(fig, Figure) and len(fig.axes) == 3
    assert "10 words/s" in fig.axes[2].get_title()
    assert len(plot_tokens_per_word(counts).axes) == 2


def test_vs_english_reads_one_ratio(counts):
    assert tw.vs_english(counts, REFERENCE) == 1.0
    assert tw.vs_english(counts, "Chinese", BYTE) == pytest.approx(249 / 277)
    with pytest.raises(ValueError, match="no counts for 'Klingon'"):
        tw.vs_english(counts, "Klingon")
