"""Claims of notebook 04 (the four clocks): the journey, its exact twin, cold vs warm start, the mean vs the tail,
and tokens that are not words (what tokens/s counts)."""
from __future__ import annotations

import math
from typing import Any

import pandas as pd

from kvlab.experiments.four_clocks import mean_vs_tail
from kvlab.experiments.serving_run import ServingRun
from kvlab.experiments.tokens_words import BPE, BYTE, REFERENCE
from kvlab.lessons.common.claims import claim, frame_of, median_se

NOTEBOOK = "04_four_clocks.ipynb"


def _requests(result: Any) -> pd.DataFrame:
    """The requests frame of a panel result (``.frame``), a ServingRun (``.requests``) or the frame itself."""
    return result.requests if isinstance(result, ServingRun) else frame_of(result)


def watched_row(frame: pd.DataFrame) -> pd.Series:
    """The watched request's row of a journey run's requests frame (the last row when no profile says which)."""
    rows = frame[frame["profile"] == "watched"] if "profile" in frame.columns else frame.iloc[0:0]
    return (rows if len(rows) else frame.tail(1)).iloc[0]


# -- one request's journey (wall clock, the panel's run) ----------------------------------------------------
@claim(NOTEBOOK, clock="wall",
       says="""
           the watched request's TTFT was {ttft:.1f} ms, of which {queue:.1f} ms ({share:.0%}) was spent in the
           queue before it was admitted""",
       otherwise="""
           most of its TTFT was not queueing. With no long requests ahead, or as many batch slots as requests,
           nothing holds it back and its TTFT is mostly its own prefill; set the sliders back to their defaults (4
           requests ahead, 2 slots) to see the queue.""")
def watched_ttft_is_mostly_queue(result: Any) -> dict:
    r = watched_row(_requests(result))
    ttft, queue = float(r["ttft_s"]), float(r["queue_s"])
    return dict(ttft=ttft * 1e3, queue=queue * 1e3, share=queue / ttft, holds=queue > 0.5 * ttft)


# -- the same journey on a fixed step cost (virtual clock) ---------------------------------------------------
@claim(NOTEBOOK, clock="deterministic",
       says="""
           every step cost {step:.0f} ms; the watched request's first token came out of step {k}, so by hand TTFT
           = ({k} + 1) × {step:.0f} − {arrival:.0f} = {ttft:.0f} ms, TPOT = one step = {tpot:.0f} ms and E2E =
           TTFT + {more} × {step:.0f} = {e2e:.0f} ms: the engine's stamps say the same""",
       otherwise="""
           the engine's stamps differ from the hand count. Every step of this run should cost the same (a
           FixedStepCostExecutor on the virtual clock) and the watched request should decode in every step after
           its first; a changed executor or scheduler breaks that.""")
def watched_clocks_follow_from_its_steps(run: ServingRun) -> dict:
    durations = run.trace["duration_s"].to_numpy(dtype=float)
    step = float(durations[0])
    r = run.record(run.extra["watched"])
    mine = run.steps[run.steps["request_id"] == r.request_id]
    k = int(mine.loc[mine["phase"] == "prefill", "step"].max())
    c = r.clocks()
    ttft = (k + 1) * step - r.scheduled_s
    e2e = ttft + (r.output_tokens - 1) * step
    same = all(math.isclose(d, step, rel_tol=1e-9) for d in durations)
    holds = (same and math.isclose(c["ttft_s"], ttft, abs_tol=1e-9) and math.isclose(c["tpot_s"], step, abs_tol=1e-9)
             and math.isclose(c["e2e_s"], e2e, abs_tol=1e-9))
    return dict(step=step * 1e3, k=k, arrival=r.scheduled_s * 1e3, ttft=c["ttft_s"] * 1e3, tpot=c["tpot_s"] * 1e3,
                more=r.output_tokens - 1, e2e=c["e2e_s"] * 1e3, holds=holds)


# -- cold vs warm start (wall clock, a fresh process) --------------------------------------------------------
def _startup_s(frame: pd.DataFrame) -> float:
    a = frame.attrs
    return a["python_start_s"] + a["import_s"] + a["build_model_s"] + a["engine_init_s"]


def _warm_ttft(frame: pd.DataFrame) -> pd.Series:
    return frame.loc[frame["start"] == "warm", "ttft_s"].astype(float)


# The start-up is seconds and a warm request's first token milliseconds, so "the start-up dwarfs a first token" could
# not fail. The two cold-start claims compare what is comparable instead: the start-up with the whole warm service
# (every warm request served start to finish, one after another), and the first request with the warm ones.
FIRST_REQUEST_SHARE = 0.1  # "small": the first request's own extra under a tenth of the start-up
EXTRA_SE = 2.0  # "stands out": more than twice the standard error of the warm median (shown, not asserted)


@claim(NOTEBOOK, clock="wall",
       says="""
           starting the service took {startup:.2f} s before the first request could begin (Python and imports
           {imports:.2f} s, the model {model:.2f} s, the engine {engine:.3f} s): longer than serving all {n} warm
           requests one after another, start to finish ({served:.2f} s, {times:.1f}×)""",
       otherwise="""
           start-up took less time than the warm requests' whole service. That happens when the interpreter and the
           libraries were already in the operating system's file cache and the answers are long, or when the warm
           servings were stalled by other programs; look at the phases in the table above.""")
def startup_dwarfs_a_warm_request(frame: pd.DataFrame) -> dict:
    a = frame.attrs
    warm = frame.loc[frame["start"] == "warm"]
    startup, served = _startup_s(frame), float(warm["e2e_s"].sum())
    return dict(startup=startup, imports=a["python_start_s"] + a["import_s"], model=a["build_model_s"],
                engine=a["engine_init_s"], n=len(warm), served=served, times=startup / served,
                holds=startup > served)


@claim(NOTEBOOK, clock="wall",
       says="""
           the first request's TTFT was {cold:.1f} ms, {extra:+.1f} ms against the median of {n} warm ones
           ({warm:.1f} ms; twice that median's standard error is {se2:.2f} ms: {seen}): whatever set-up its first
           forward pass paid was {pct:.1%} of the start-up, so most of a cold start's cost came before the
           request""",
       otherwise="""
           the first request paid more than a tenth of the start-up: heavy set-up in the first forward pass (on a
           GPU, creating the device context and loading kernels). That is what a warm-up request before opening a
           service is for.""")
def first_request_extra_is_small(frame: pd.DataFrame) -> dict:
    """Asserts the small half only. Whether the first request was measurably slower at all is shown, not
    asserted: on a CPU its own set-up is often within the warm requests' spread, so that half would go either
    way from run to run (an observation inside the sentence)."""
    warm = _warm_ttft(frame)
    cold = float(frame.loc[frame["start"] == "cold", "ttft_s"].iloc[0])
    median = float(warm.median())
    se = median_se(median, float(warm.quantile(0.95)), len(warm))
    extra, startup = cold - median, _startup_s(frame)
    seen = ("a set-up of its own stands out" if extra > EXTRA_SE * se
            else "no set-up of its own stands out from the warm requests' spread")
    return dict(cold=cold * 1e3, n=len(warm), warm=median * 1e3, extra=extra * 1e3, se2=EXTRA_SE * se * 1e3,
                seen=seen, pct=max(extra, 0.0) / startup, holds=extra < FIRST_REQUEST_SHARE * startup)


# -- why a mean hides the wait (wall clock) -----------------------------------------------------------------
def _ttft(result: Any) -> tuple[dict, int]:
    frame = _requests(result)
    row = mean_vs_tail(frame, clocks=("ttft_s",)).iloc[0]
    done = frame[frame["status"] == "completed"]["ttft_s"].dropna().astype(float)
    return row.to_dict(), int((done > row["mean"]).sum())


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           the mean TTFT is {mean:.1f} ms and the median {p50:.1f} ms: {k} of {n} requests ({share:.0%}) waited
           longer than the mean""",
       otherwise="the run could not be read.")
def share_waiting_longer_than_the_mean(result: Any) -> dict:
    """Shown, not asserted: with a long tail (bursts that queue) the share is well under half; when almost
    nobody queued (a fast machine) or nearly everybody did (overload), it is near half or above."""
    row, k = _ttft(result)
    return dict(mean=row["mean"] * 1e3, p50=row["p50"] * 1e3, k=k, n=int(row["n"]), share=row["share_above_mean"],
                holds=True)


TAIL_OVER_MEAN = 2.0  # see ttft_tail_is_well_above_the_mean


@claim(NOTEBOOK, clock="wall",
       says="""
           the p95 TTFT ({p95:.1f} ms) is {times:.1f}× the mean, and the slowest request waited {max:.1f} ms (n =
           {n})""",
       otherwise="""
           the slowest twentieth waited less than twice the mean: the waits were spread evenly, not piled into a
           queue. Bursts make the tail; with burstiness=1 or a slower machine the queue is everywhere or nowhere.
           Press Run again: with n = 30 the tail moves from run to run.""")
def ttft_tail_is_well_above_the_mean(result: Any) -> dict:
    """"Well above" is twice the mean: waits spread evenly from zero to any maximum put the p95 at 1.9× the
    mean at most, and a queue's waits (exponential-like: most requests served at once, a few behind a
    burst) put it near 3× (ln 20). Twice the mean is past the first and short of the second."""
    row, _ = _ttft(result)
    return dict(p95=row["p95"] * 1e3, times=row["p95_over_mean"], max=row["max"] * 1e3, n=int(row["n"]),
                holds=row["p95_over_mean"] > TAIL_OVER_MEAN)


# -- tokens are not words (deterministic: counts of shipped texts, a BPE trained the same way every time) ---
def _of(frame: pd.DataFrame, tokenizer: str) -> pd.DataFrame:
    rows = frame[frame["tokenizer"] == tokenizer]
    if rows.empty:
        raise ValueError(f"this run has no rows for the tokenizer {tokenizer!r}")
    return rows


@claim(NOTEBOOK, clock="deterministic",
       says="""
           kvlab's byte tokenizer spent exactly one token per UTF-8 byte on all {n} texts: from {lo:.2f} token per
           character ({lo_text}) to {hi:.2f} ({hi_text}); the same paragraph costs more tokens in some scripts
           only because their characters take more bytes""",
       otherwise="""
           some text did not cost one token per UTF-8 byte: the byte tokenizer was changed (it should map each
           byte to one id) or the table was counted with another tokenizer under its name.""")
def byte_tokens_are_utf8_bytes(counts: pd.DataFrame) -> dict:
    rows = _of(counts, BYTE)
    per_char = rows.set_index("text")["tokens_per_char"]
    return dict(n=len(rows), lo=float(per_char.min()), lo_text=per_char.idxmin(), hi=float(per_char.max()),
                hi_text=per_char.idxmax(), holds=bool((rows["tokens"] == rows["bytes"]).all()))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           the BPE trained on English spent {en:.2f} tokens per word on the English paragraph (kvlab's bytes:
           {en_bytes:.2f}); every translation cost the BPE more tokens than the English original, from {lo:.2f}×
           ({lo_text}) to {hi:.2f}× ({hi_text}), where kvlab's bytes ranged from {blo:.2f}× ({blo_text}) to
           {bhi:.2f}× ({bhi_text})""",
       otherwise="""
           some translation cost the BPE no more tokens than the English paragraph: it was trained on something
           else than the shipped English corpus (train_bpe(corpus=...)), or the sample texts were changed.""")
def english_bpe_favours_english(counts: pd.DataFrame) -> dict:
    def ratios(tokenizer: str) -> pd.Series:
        rows = _of(counts, tokenizer)
        return rows[(rows["kind"] == "prose") & (rows["text"] != REFERENCE)].set_index("text")["vs_english"]

    def english_per_word(tokenizer: str) -> float:
        return float(_of(counts, tokenizer).set_index("text").loc[REFERENCE, "tokens_per_word"])

    bpe, byte = ratios(BPE), ratios(BYTE)
    en, en_bytes = english_per_word(BPE), english_per_word(BYTE)
    return dict(en=en, en_bytes=en_bytes, lo=float(bpe.min()), lo_text=bpe.idxmin(), hi=float(bpe.max()),
                hi_text=bpe.idxmax(), blo=float(byte.min()), blo_text=byte.idxmin(), bhi=float(byte.max()),
                bhi_text=byte.idxmax(), holds=len(bpe) > 0 and bool((bpe > 1).all()) and en < en_bytes)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           at the same {wps:g} words per second, the English paragraph counts {byte:.1f} tokens/s with kvlab's
           bytes and {bpe:.1f} tokens/s with the BPE: {ratio:.2f}× the tokens/s for the same words. With the BPE
           alone, the same content in {lang} counts {lang_rate:.1f} tokens/s, {lang_x:.2f}× English's""",
       otherwise="""
           the two tokenizers count nearly the same tokens for the same words here: the BPE was trained with too
           small a vocabulary to learn English words (train_bpe(vocab_size=...)).""")
def same_words_different_tokens_per_second(rates: pd.DataFrame) -> dict:
    def rate(tokenizer: str) -> pd.Series:
        return _of(rates, tokenizer).set_index("text")["tokens_per_s"]

    byte, bpe = rate(BYTE), rate(BPE)
    ratio = float(byte[REFERENCE] / bpe[REFERENCE])
    lang = bpe.drop(REFERENCE).idxmax()
    lang_x = float(bpe[lang] / bpe[REFERENCE])
    return dict(wps=rates.attrs["words_per_s"], byte=float(byte[REFERENCE]), bpe=float(bpe[REFERENCE]), ratio=ratio,
                lang=lang, lang_rate=float(bpe[lang]), lang_x=lang_x, holds=ratio > 1.5 and lang_x > 1.5)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           the model reporting {hi_rate:g} tokens/s ({hi_tok}, {hi_tpw:.2f} tokens per word) writes {hi_words:.1f}
           words/s of {text}; the one reporting {lo_rate:g} tokens/s ({lo_tok}, {lo_tpw:.2f} tokens per word)
           writes {lo_words:.1f}: fewer tokens/s, more words""",
       otherwise="""
           with these reported figures the model with more tokens/s also writes more words: its lead in tokens/s
           is larger than the extra tokens its tokenizer spends per word. Try figures closer together.""")
def fewer_tokens_per_second_can_be_more_words(words: pd.DataFrame) -> dict:
    if len(words) < 2:
        raise ValueError("compare two models: pass two tokenizers to words_per_second")
    ranked = words.sort_values("tokens_per_s", ascending=False)
    hi, lo = ranked.iloc[0], ranked.iloc[-1]
    return dict(text=hi["text"], hi_rate=float(hi["tokens_per_s"]), hi_tok=hi["tokenizer"],
                hi_tpw=float(hi["tokens_per_word"]), hi_words=float(hi["words_per_s"]),
                lo_rate=float(lo["tokens_per_s"]), lo_tok=lo["tokenizer"], lo_tpw=float(lo["tokens_per_word"]),
                lo_words=float(lo["words_per_s"]),
                # "fewer tokens/s": two equal figures are not fewer, whatever order the sort left them in
                holds=bool(lo["tokens_per_s"] < hi["tokens_per_s"] and lo["words_per_s"] > hi["words_per_s"]))
