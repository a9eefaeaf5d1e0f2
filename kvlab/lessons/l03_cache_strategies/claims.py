"""Claims of notebook 03 (cache strategies), checked on the learner's run of the strategies panel.

The panel's result (``run_strategy_comparison``: one row per setting and context, the recall accuracy by distance in
``frame.attrs["accuracy"]``) feeds every claim except the last, which reads ``try_compiled_decode``'s dict. Byte counts,
recall answers and top-1 agreement are the same on every machine (the shipped model, fixed questions, greedy decoding in
fp32 on one thread: checked bit for bit across repeated runs); their claims are ``deterministic`` and render only counts
and exact ratios. KL divergence is not quoted as a number here: its last digits change with the number of threads (the
order of the sums), so claims only compare KL between settings.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvlab.lessons.common.checks import listing
from kvlab.lessons.common.claims import SHOWN_ONLY, claim, frame_of

NOTEBOOK = "03_cache_strategies.ipynb"


def _kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


# -- memory: byte counts, the same everywhere ------------------------------------------------------


@claim(NOTEBOOK, clock="deterministic",
       says="""
           every quantized setting held exactly the bytes its format needs, at every context: {ratios} of the
           dynamic cache's bytes at {context} prompt tokens""",
       otherwise="""
           a measured size differs from bits / 32 + a scale and a zero-point per group (+ the residual window at
           full precision). Look at the payload, scale and residual columns of the frame: one of them is not what
           the format says.""")
def quantized_memory_follows_the_format(result: Any) -> dict:
    frame = frame_of(result)
    q = frame[frame["strategy"] == "quantized"]
    if not len(q):
        raise ValueError("no quantized setting in this run")
    exact = bool(np.allclose(q["memory_ratio"], q["ideal_memory_ratio"], rtol=0, atol=1e-9))
    longest = q[q["context_tokens"] == q["context_tokens"].max()]
    ratios = listing([f"{r.memory_ratio:.4f} ({int(r.bits)} bits)" for r in longest.itertuples()])
    return dict(ratios=ratios, context=int(longest["context_tokens"].iloc[0]), holds=exact)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           sized for {max_len} tokens, the static cache held {short} reserved and empty at {short_ctx} prompt
           tokens and {long} at {long_ctx}: (max_len − stored tokens) × {bpt:,} bytes at every context""",
       otherwise="""
           the reserved bytes differ from (max_len − stored tokens) × bytes per token: the cache allocated
           something the formula does not count.""")
def static_reserves_what_shorter_contexts_leave_empty(result: Any) -> dict:
    frame = frame_of(result)
    st = frame[frame["strategy"] == "static"].sort_values("context_tokens")
    if not len(st):
        raise ValueError("no static setting in this run")
    bpt = int(frame.attrs["bytes_per_token"])
    max_len = int(st["allocated_bytes"].max() // bpt)
    expected = (max_len - st["stored_tokens"]) * bpt
    first, last = st.iloc[0], st.iloc[-1]
    return dict(max_len=max_len, bpt=bpt, short=_kib(first["reserved_bytes"]), short_ctx=int(first["context_tokens"]),
                long=_kib(last["reserved_bytes"]), long_ctx=int(last["context_tokens"]),
                holds=bool((st["reserved_bytes"].to_numpy() == expected.to_numpy()).all()))


# -- quantized: time ------------------------------------------------------------------------------


@claim(NOTEBOOK, clock="wall",
       says="""
           every quantized setting was slower than dynamic at every context measured ({settings} settings ×
           {contexts} contexts): from {lo:.2f}× to {hi:.2f}× dynamic's median time per token""",
       otherwise="""
           at least one quantized setting was not clearly slower (by a tenth) than dynamic somewhere. On a busy
           machine one median can be inflated by other programs: look at the p95 whiskers, and Run again. On a GPU
           the dequantizing can also overlap with other work.""")
def quantized_slower_at_every_context(result: Any) -> dict:
    frame = frame_of(result)
    q = frame[frame["strategy"] == "quantized"].dropna(subset=["latency_ratio"])
    if not len(q):
        raise ValueError("no quantized setting with a dynamic baseline in this run")
    r = q["latency_ratio"]
    return dict(settings=q["setting"].nunique(), contexts=q["context_tokens"].nunique(), lo=float(r.min()),
                hi=float(r.max()), holds=bool(r.min() > 1.1))


@claim(NOTEBOOK, clock="wall",
       says="""
           inside the cache's update, the quantized settings spent {qlo:.2f} to {qhi:.2f} ms per step and dynamic
           {dlo:.2f} to {dhi:.2f} ms: quantizing the new token and dequantizing the whole history is work the
           exact cache does not do""",
       otherwise="""
           somewhere a quantized setting spent less than twice dynamic's time inside update. A step slowed by
           another program can inflate one dynamic point; compare the lines in the plot of time inside the cache,
           and Run again.""")
def quantized_time_goes_into_the_cache(result: Any) -> dict:
    frame = frame_of(result).dropna(subset=["cache_ms_per_step"])
    q, d = frame[frame["strategy"] == "quantized"], frame[frame["setting"] == "dynamic"]
    if not len(q) or not len(d):
        raise ValueError("this run has no time inside the cache (cache_ms_per_step) for a quantized and the dynamic "
                         "setting")
    dyn = q["context_tokens"].map(d.set_index("context_tokens")["cache_ms_per_step"])
    return dict(qlo=float(q["cache_ms_per_step"].min()), qhi=float(q["cache_ms_per_step"].max()),
                dlo=float(d["cache_ms_per_step"].min()), dhi=float(d["cache_ms_per_step"].max()),
                holds=bool((q["cache_ms_per_step"] > 2 * dyn).all()))


# -- quantized: answers (deterministic: same model, same questions, greedy fp32) ----------------------


def _summary(result: Any) -> pd.DataFrame:
    from kvlab.experiments.cache_accuracy import accuracy_summary

    acc = frame_of(result).attrs.get("accuracy")
    if acc is None or not len(acc):
        raise ValueError("this run has no recall accuracy (frame.attrs['accuracy'])")
    return accuracy_summary(acc)


def _quantized_family(summary: pd.DataFrame) -> pd.DataFrame:
    """The quantized settings that differ only in bits (the largest such family), most bits first."""
    q = summary[summary["setting"].str.startswith("quantized")]
    if not len(q):
        raise ValueError("no quantized setting was scored in this run")
    family = q.groupby(["group_size", "residual"], dropna=False)["bits"].transform("size")
    q = q[family == family.max()]
    key = q.iloc[0][["group_size", "residual"]]
    q = q[(q["group_size"] == key["group_size"]) & (q["residual"] == key["residual"])]
    return q.sort_values("bits", ascending=False)


def _exact_row(summary: pd.DataFrame) -> pd.Series:
    return summary[summary["setting"] == "dynamic"].iloc[0]


@claim(NOTEBOOK, clock="deterministic",
       says="""
           at 8 bits the cache answered {correct}/{n} recall questions right; the exact cache {exact}/{n} on the
           same questions""",
       otherwise="""
           8 bits lost answers the exact cache got right. With a residual window of 0 and large groups, 8 bits can
           still round a key enough to change a close lookup: try a smaller group size.""")
def eight_bit_cache_keeps_the_answers(result: Any) -> dict:
    s = _summary(result)
    eight = s[s["bits"] == 8]
    if not len(eight):
        raise ValueError("no 8-bit setting was scored in this run")
    row, exact = eight.iloc[0], _exact_row(s)
    return dict(correct=int(row["correct"]), n=int(row["examples"]), exact=int(exact["correct"]),
                holds=int(row["correct"]) >= int(exact["correct"]))


# A fall in right answers between two settings counts when it passes this many standard errors of the difference
# between two shares of n questions (pooled): one answer in sixty is a question drawn one way or the other.
FALL_SE = 2.0


@claim(NOTEBOOK, clock="deterministic",
       says="""
           right answers never rose as bits fell, and fell by {drop} answers from the most bits to the fewest, more
           than the {margin:.1f} that two standard errors of a difference between two counts out of {n} allow:
           {series} (exact cache {exact}/{n})""",
       otherwise="""
           fewer bits answered more questions right than more bits somewhere, or the most and the fewest bits
           answered about as many (a difference of a few questions is within what drawing the questions can do).
           Raise the number of recall questions.""")
def answers_fall_as_bits_fall(result: Any) -> dict:
    """Never rising, and the end-to-end fall beyond FALL_SE standard errors (a fall of one answer in sixty is noise)."""
    s = _summary(result)
    fam = _quantized_family(s)
    if len(fam) < 2:
        raise ValueError("only one bit width was scored; choose two or more")
    correct = fam["correct"].astype(int).tolist()
    n = int(fam["examples"].iloc[0])
    series = listing([f"{int(b)} bits {c}/{int(m)}" for b, c, m in zip(fam["bits"], correct, fam["examples"])])
    p = min(max((correct[0] + correct[-1]) / (2 * n), 0.0), 1.0)
    margin = FALL_SE * n * float(np.sqrt(p * (1 - p) * 2 / n))  # in answers
    return dict(series=series, exact=int(_exact_row(s)["correct"]), n=n, drop=correct[0] - correct[-1], margin=margin,
                holds=all(a >= b for a, b in zip(correct, correct[1:])) and correct[0] - correct[-1] > margin)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           at {bits} bits with no residual window, {correct}/{n} answers were right (exact cache {exact}/{n}):
           most lookups failed""",
       otherwise="""
           the lowest bit width still answered at least half the questions. Smaller groups or a residual window
           keep more of the keys exact; that is what they are for.""")
def lowest_bits_lose_most_answers(result: Any) -> dict:
    s = _summary(result)
    q = s[s["setting"].str.startswith("quantized") & (s["residual"] == 0)]
    if not len(q):
        raise ValueError("no quantized setting without a residual window was scored in this run")
    low = q[q["bits"] == q["bits"].min()].iloc[0]
    exact = _exact_row(s)
    return dict(bits=int(low["bits"]), correct=int(low["correct"]), n=int(low["examples"]),
                exact=int(exact["correct"]), holds=2 * int(low["correct"]) < int(low["examples"]))


def _ties(values: list, correct: list, bits: list) -> list[str]:
    """"8 and 4 bits" for each pair of neighbouring bit widths that tie on ``values`` but not on right answers."""
    return [f"{int(bits[i])} and {int(bits[i + 1])} bits" for i in range(len(values) - 1)
            if values[i] == values[i + 1] and correct[i] != correct[i + 1]]


def _discordant(values: list, correct: list) -> bool:
    """Some pair of settings ranked higher on ``values`` and lower on right answers (ties on either side allowed)."""
    return any((values[i] - values[j]) * (correct[i] - correct[j]) < 0
               for i in range(len(values)) for j in range(i + 1, len(values)))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           on the first {prompts} questions ({positions} answer positions), the mean KL grew at every step as bits
           fell, in the same order as the recall answers, which fell at every step ({answers}); the next-token
           choice agreed with the exact cache at {agree}: {top1}""",
       otherwise="""
           the token metrics order the settings differently from recall accuracy here, or recall accuracy tied
           where the mean KL did not. On a few prompts they are coarse: raise quality_prompts in
           run_strategy_comparison.""")
def token_metrics_order_settings_like_accuracy(result: Any) -> dict:
    """The KL and the right answers strictly in the same order, and top-1 never in the other order; where top-1 ties
    but the answers do not, the sentence says so instead of "the same order"."""
    fam = _quantized_family(_summary(result)).dropna(subset=["top1_agreement"])
    if len(fam) < 2:
        raise ValueError("fewer than two quantized settings were compared token by token")
    top1 = [int(round(t * p)) for t, p in zip(fam["top1_agreement"], fam["compared_positions"])]
    kl = fam["kl_mean"].tolist()
    positions = int(fam["compared_positions"].iloc[0])
    bits = fam["bits"].tolist()
    agree = listing([f"{t}/{positions} ({int(b)} bits)" for t, b in zip(top1, bits)])
    correct = fam["correct"].astype(int).tolist()
    answers = listing([f"{c}/{int(n)}" for c, n in zip(correct, fam["examples"])])
    ties = _ties(top1, correct, bits)
    top1_words = ("in the same order" if not ties and all(a > b for a, b in zip(top1, top1[1:])) else
                  "never in the other order" + (f", but tied at {listing(ties)}, which the recall answers told apart"
                                                if ties else ""))
    holds = (all(a < b for a, b in zip(kl, kl[1:])) and all(a > b for a, b in zip(correct, correct[1:]))
             and not _discordant(top1, correct))
    return dict(prompts=int(fam["quality_prompts"].iloc[0]), positions=positions, agree=agree, answers=answers,
                top1=top1_words, holds=holds)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           at {bits} bits the next-token choice agreed with the exact cache at all {positions} answer positions of
           the {prompts} questions compared, yet {lost} of {n} recall answers were lost ({correct}/{n} against
           {exact}/{n}): a few prompts cannot see errors that hit only some questions""",
       otherwise="""
           here every setting that lost answers also disagreed with the exact cache on the compared prompts: the
           token metrics caught it. With fewer prompts compared, or rarer errors, they can miss it; measure the
           task itself before adopting a setting.""")
def few_prompt_metrics_miss_lost_answers(result: Any) -> dict:
    s = _summary(result)
    exact = int(_exact_row(s)["correct"])
    q = s[s["setting"].str.startswith("quantized")].dropna(subset=["top1_agreement"])
    if not len(q):
        raise ValueError("no quantized setting was compared token by token")
    blind = q[(q["top1_agreement"] == 1.0) & (q["correct"] < exact)]
    row = (blind if len(blind) else q[q["correct"] < exact] if (q["correct"] < exact).any() else q).iloc[0]
    return dict(bits=int(row["bits"]), positions=int(row["compared_positions"]), prompts=int(row["quality_prompts"]),
                lost=exact - int(row["correct"]), n=int(row["examples"]), correct=int(row["correct"]), exact=exact,
                holds=bool(len(blind)))


# -- offloaded: bytes (deterministic) and the link's time (wall) -------------------------------------


def _offloaded(result: Any) -> pd.DataFrame:
    frame = frame_of(result)
    off = frame[frame["strategy"] == "offloaded"]
    if not len(off):
        raise ValueError("no offloaded setting in this run")
    return off.sort_values("context_tokens")


@claim(NOTEBOOK, clock="deterministic",
       says="""
           the offloaded cache moved {moved} per decode step at {contexts} prompt tokens: every stored token of
           every layer read back in and the new one written out, as counted by hand""",
       otherwise="""
           the bytes moved differ from (stored + 1) × bytes per token: the cache copied more or less than the
           history. Look at OffloadedCache._copy, the one place bytes cross tiers.""")
def offloaded_bytes_follow_the_count(result: Any) -> dict:
    from kvlab.lessons.l03_cache_strategies.figures import expected_bytes_moved

    bpt = int(frame_of(result).attrs["bytes_per_token"])
    off = _offloaded(result)
    expected = [expected_bytes_moved(c, s, bpt) for c, s in zip(off["context_tokens"], off["stored_tokens"])]
    one = off.drop_duplicates("context_tokens")
    return dict(moved=listing([_kib(b) for b in one["bytes_moved_per_step"]]),
                contexts=listing([str(c) for c in one["context_tokens"]]),
                holds=bool(np.allclose(off["bytes_moved_per_step"], expected, rtol=0, atol=1e-6)))


def _link_rows(result: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(offloaded over the slow link, offloaded at the tier's own speed), one row per context each."""
    off = _offloaded(result)
    slow = off[off["link_gbps"].notna()] if "link_gbps" in off else off.iloc[:0]
    fast = off[off["link_gbps"].isna()] if "link_gbps" in off else off
    if not len(slow) or not len(fast):
        raise ValueError("this run has no offloaded setting over a slow link beside the plain one (link_gbps)")
    slow = slow[slow["setting"] == slow["setting"].iloc[0]].set_index("context_tokens")
    fast = fast[fast["setting"] == fast["setting"].iloc[0]].set_index("context_tokens")
    return slow, fast.loc[slow.index]


# The slow link is kvlab's model, a wait inside the step until the bytes would have crossed it
# (kvlab/cache/offloaded.py: wait_for_link): a check that the wait shows in the step could only fail on noise,
# so the two lines about it are shown (•) as the model's arithmetic on this run, never asserted.
@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           at {ctx} prompt tokens a step over the modelled {gbps:g} GB/s link took {slow:.2f} ms against
           {fast:.2f} ms for the same copies at the tier's own speed: {added:.2f} ms more, where the link needs
           {link:.2f} ms for the {kib} each step moves. kvlab waits for the link inside the step, so here it shows
           in full; an engine that copies on a side stream hides what its compute overlaps""",
       otherwise="")
def slow_link_time_shows_in_the_step(result: Any) -> dict:
    slow, fast = _link_rows(result)
    ctx = int(slow.index.max())
    s, f = slow.loc[ctx], fast.loc[ctx]
    added = float(s["token_ms_p50"] - f["token_ms_p50"])
    return dict(ctx=ctx, gbps=float(s["link_gbps"]), slow=float(s["token_ms_p50"]), fast=float(f["token_ms_p50"]),
                added=added, link=float(s["link_ms_per_step"]), kib=_kib(s["bytes_moved_per_step"]), holds=True)


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           the time the modelled link added at each context, against the link's own time for those bytes: {a:.2f}
           ms at {c1} prompt tokens ({k1} per step, link {l1:.2f} ms), {b:.2f} ms at {c2} ({k2}, link {l2:.2f} ms)""",
       otherwise="")
def slow_link_cost_grows_with_bytes(result: Any) -> dict:
    slow, fast = _link_rows(result)
    if len(slow) < 2:
        raise ValueError("the slow link ran at one context only; choose two or more")
    c1, c2 = int(slow.index.min()), int(slow.index.max())
    added = (slow["token_ms_p50"] - fast["token_ms_p50"]).sort_index()
    link = slow["link_ms_per_step"].sort_index()
    return dict(a=float(added[c1]), b=float(added[c2]), c1=c1, c2=c2, k1=_kib(slow.loc[c1, "bytes_moved_per_step"]),
                k2=_kib(slow.loc[c2, "bytes_moved_per_step"]), l1=float(link[c1]), l2=float(link[c2]), holds=True)


# A copy within this machine's memory set against a link rate the panel chooses (1 GB/s by default) could fail only if
# the tier's pages went to disk: a check that cannot fail on a working machine is no finding, so the line is shown (•)
# with its numbers and that reason.
@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           at the tier's own speed the copies ran at {fast:.1f} GB/s ({ms:.3f} ms of a {step:.2f} ms step at {ctx}
           prompt tokens), {times:.0f}× the {gbps:g} GB/s link you chose""",
       otherwise="")
def memory_tier_copies_outrun_the_link(result: Any) -> dict:
    slow, _ = _link_rows(result)
    off = _offloaded(result)
    timed = off[off["link_gbps"].isna() & off["copy_gb_per_s"].notna()]  # plain tier, synchronous copies
    if not len(timed):
        raise ValueError("the plain tier's copies were not timed: on CUDA the offloaded cache prefetches them on a "
                         "side stream, overlapping compute; add the setting {'cache': 'offloaded', 'prefetch': "
                         "False} (run_strategy_comparison does on CUDA) to time them")
    fast = timed[timed["setting"] == timed["setting"].iloc[0]].set_index("context_tokens")
    ctx = int(fast.index.max())
    f = fast.loc[ctx]
    rate = float(f["copy_gb_per_s"])
    gbps = float(slow.loc[ctx, "link_gbps"])
    return {"fast": rate, "ms": float(f["copy_ms_per_step"]), "step": float(f["token_ms_p50"]), "ctx": ctx,
            "gbps": gbps, "times": rate / gbps, "holds": True,
            SHOWN_ONLY: "a copy within memory set against a link rate you chose, it could fail only if the tier's "
                        "pages went to disk"}


# -- static: the compiled step (wall; only when the compile ran) -------------------------------------


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           after {compile_s:.1f} s of compiling, a decode step took {compiled:.2f} ms compiled against {eager:.2f}
           ms eager ({speedup:.2f}× [min–max {lo:.2f}–{hi:.2f}] over {rounds} paired rounds); at that saving the
           compile pays for itself {breakeven}""",
       otherwise="the compile did not run, so there is no compiled step to compare.")
def compiled_step_is_faster(compiled: dict) -> dict:
    """Shown, not asserted: on a CPU a tiny model's step is mostly fixed overhead, and whether the compiler
    removes it depends on the backend, the torch version and the machine (its hold rate under 2/3 quiet,
    notebooks/TEACHING.md); on a GPU it usually does."""
    if compiled.get("status") != "compiled":
        raise ValueError(f"the compile did not run ({compiled.get('status')}): {compiled.get('message', '')}")
    saved_ms = compiled["eager_ms"] - compiled["compiled_ms"]
    breakeven = (f"after about {1e3 * compiled['compile_s'] / saved_ms:,.0f} tokens" if saved_ms > 0
                 else "never (it saved no time)")
    return dict(compile_s=compiled["compile_s"], compiled=compiled["compiled_ms"], eager=compiled["eager_ms"],
                speedup=compiled["speedup"], lo=compiled["speedup_min"], hi=compiled["speedup_max"],
                rounds=compiled["rounds"], breakeven=breakeven, holds=True)


# -- beside transformers: the same strategies in transformers, on the same weights --------------------


def _pairs_ran(result: Any) -> pd.DataFrame:
    """The rows of the strategies whose transformers cache ran, one row per (strategy, library)."""
    from kvlab.experiments.transformers_caches import RAN

    frame = frame_of(result)
    ran = frame.loc[(frame["library"] == "transformers") & (frame["status"] == RAN), "strategy"]
    if not len(ran):
        raise ValueError("no transformers cache ran in this run")
    return frame[frame["strategy"].isin(set(ran))]


def _row(frame: pd.DataFrame, strategy: str, library: str) -> pd.Series:
    rows = frame[(frame["strategy"] == strategy) & (frame["library"] == library)]
    if not len(rows):
        raise ValueError(f"no {strategy} row for {library} in this run")
    return rows.iloc[0]


@claim(NOTEBOOK, clock="deterministic",
       says="""
           transformers' {names} gave exactly the greedy tokens of kvlab's {kvlab} on the same weights: {same}/{n}
           tokens identical over {q} recall prompts""",
       otherwise="""
           an exact cache in transformers gave other tokens than its kvlab counterpart. Both keep exact fp32
           numbers, so the two decoders computed different logits: check the weights' conversion (to_transformers)
           and the attention mask, as tests/test_parity_transformers.py does.""")
def transformers_exact_caches_give_kvlab_tokens(result: Any) -> dict:
    frame = _pairs_ran(result)
    t = frame[(frame["library"] == "transformers") & (frame["strategy"] != "quantized")]
    if not len(t):
        raise ValueError("no exact transformers cache (dynamic, static, offloaded) ran in this run")
    steps = frame_of(result).attrs["steps"]
    first = steps[(steps["repeat"] == 0) & steps["strategy"].isin(set(t["strategy"]))]
    pivot = first.pivot_table(index=["strategy", "question", "token"], columns="library", values="token_id")
    same = int((pivot["kvlab"] == pivot["transformers"]).sum())
    return dict(names=", ".join(t["implementation"]), kvlab=", ".join(t["strategy"]), same=same, n=len(pivot),
                q=int(t["questions"].iloc[0]), holds=same == len(pivot) and bool((t["agreement"] == 1).all()))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           after the last step both dynamic caches held {dyn} and both static caches {static}: at every step of
           every run, each cache that ran held exactly what its layout's formula says""",
       otherwise="""
           a cache held other bytes than its layout's formula (formula_bytes) at some step: look at
           frame.attrs['steps'] where cache_bytes and formula_bytes differ. A transformers version whose layers
           keep other tensors changes what transformers_cache_bytes finds.""")
def cache_bytes_follow_each_layout(result: Any) -> dict:
    frame = frame_of(result)
    ran = frame[frame["bytes_match"].notna()]
    if not len(ran):
        raise ValueError("no cache ran in this run")

    def both(strategy: str) -> str:
        rows = ran[ran["strategy"] == strategy]
        if len(rows) < 2:
            return "(not compared in this run)"
        kib = rows["cache_bytes"].astype(int).unique()
        return _kib(kib[0]) if len(kib) == 1 else " and ".join(f"{_kib(b)} ({lib})" for b, lib in
                                                              zip(rows["cache_bytes"], rows["library"]))
    return dict(dyn=both("dynamic"), static=both("static"), holds=bool(ran["bytes_match"].all()))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           the {bits}-bit quantized caches held different bytes for the same {stored} tokens, kvlab {k} and
           transformers {t}, each exactly its formula: kvlab keeps its newest {window} tokens at full precision,
           transformers only the {residual} stored since it last re-quantized everything""",
       otherwise="""
           a quantized cache held other bytes than its layout's formula, or both held the same: look at
           frame.attrs['steps'] for the quantized rows, where cache_bytes and formula_bytes differ.""")
def quantized_caches_hold_their_own_layouts(result: Any) -> dict:
    frame = _pairs_ran(result)
    k, t = _row(frame, "quantized", "kvlab"), _row(frame, "quantized", "transformers")
    R, last = int(frame_of(result).attrs["residual"]), int(k["new_tokens"]) - 1
    stored = int(k["prompt_tokens"]) + last
    return dict(bits=int(frame_of(result).attrs["bits"]), stored=stored, k=_kib(k["cache_bytes"]),
                t=_kib(t["cache_bytes"]), window=min(R, stored), residual=last % R if R else 0,
                holds=bool(k["bytes_match"]) and bool(t["bytes_match"]) and k["cache_bytes"] != t["cache_bytes"])


@claim(NOTEBOOK, clock="deterministic", asserts=False,
       says="""
           the two {bits}-bit quantized caches agreed on {agree:.0%} of the greedy tokens ({first}); against the
           exact cache kvlab's agreed on {k_exact:.0%} and transformers' on {t_exact:.0%}; recall answers right:
           kvlab {k_right}/{n}, transformers {t_right}/{n}""",
       otherwise="")
def quantized_caches_keep_different_tokens(result: Any) -> dict:
    frame = _pairs_ran(result)
    k, t = _row(frame, "quantized", "kvlab"), _row(frame, "quantized", "transformers")
    first = ("none differed" if pd.isna(t["first_divergence"])
             else f"the first difference at token {int(t['first_divergence'])}")
    return dict(bits=int(frame_of(result).attrs["bits"]), agree=float(t["agreement"]), first=first,
                k_exact=float(k["exact_agreement"]), t_exact=float(t["exact_agreement"]),
                k_right=int(k["answers_right"]), t_right=int(t["answers_right"]), n=int(k["questions"]), holds=True)


@claim(NOTEBOOK, clock="wall",
       says="""
           in transformers too the quantized cache cost time: {q:.2f} ms per token against {d:.2f} ms with its
           DynamicCache ({ratio:.2f}×, medians over {n} decode steps each)""",
       otherwise="""
           transformers' quantized cache was not clearly slower (by a tenth) than its DynamicCache. Every step it
           dequantizes the whole history, so on a busy machine look at the p95 whiskers and Run again; with a long
           residual window most of its steps read full-precision tokens.""")
def transformers_quantized_cache_costs_time(result: Any) -> dict:
    frame = _pairs_ran(result)
    q, d = _row(frame, "quantized", "transformers"), _row(frame, "dynamic", "transformers")
    ratio = float(q["token_ms_p50"] / d["token_ms_p50"])
    n = int(q["questions"]) * (int(q["new_tokens"]) - 1) * int(frame_of(result).attrs.get("repeats", 1))
    return dict(q=float(q["token_ms_p50"]), d=float(d["token_ms_p50"]), ratio=ratio, n=n, holds=ratio > 1.1)


@claim(NOTEBOOK, clock="wall", asserts=False,
       says="""
           the same strategy ran at a different speed in each library, per decode token (median): {pairs}. The
           cache strategy is the same; what differs is the code around it (each library's decoder and generation
           loop)""",
       otherwise="")
def same_strategy_different_speed(result: Any) -> dict:
    frame = _pairs_ran(result)
    parts = []
    for s in dict.fromkeys(frame["strategy"]):
        k, t = _row(frame, s, "kvlab"), _row(frame, s, "transformers")
        parts.append(f"{s} kvlab {k['token_ms_p50']:.2f} ms, transformers {t['token_ms_p50']:.2f} ms")
    return dict(pairs="; ".join(parts), holds=True)


# -- offloading under load: the serving engine's paged pool on the device vs in a slower tier ----------
def _modelled_link(result: Any) -> dict:
    """Where the offloaded tier sits behind a modelled link (``link_gbps``: the default on a CPU, where RAM to RAM
    needs one), each step waits its bytes / rate, so the offloaded run is slower by construction: shown, not
    checked. On a GPU with no ``link_gbps`` the copies cross the real link, and the claims below are checked."""
    rate = result.settings.get("link_gbps")
    if not rate:
        return {}
    return {SHOWN_ONLY: f"the link is modelled at {rate:g} GB/s, each step waiting its bytes / rate, so this holds "
                        "by construction here; on a GPU the copies cross the real link and it is checked"}


def _spread(result: Any, measure: str) -> tuple[dict, dict]:
    """The spread of ``measure`` (``distribution_table``'s row) offloaded and on the device."""
    from kvlab.experiments.offload_load import OFFLOADED, ON_DEVICE, distribution_table

    t = distribution_table(result).set_index(["run", "measure"])
    return t.loc[(OFFLOADED, measure)].to_dict(), t.loc[(ON_DEVICE, measure)].to_dict()


@claim(NOTEBOOK, clock="deterministic",
       says="""
           with the KV pool on the device and offloaded, the engine ran the same {steps} steps with the same
           batches and gave all {n} requests the same {tokens} tokens""",
       otherwise="""
           the two runs differ: every request arrives at once, so the schedule cannot depend on timing; different
           tokens mean the offloaded pool did not hand attention the numbers the on-device pool holds (a block not
           copied in, or a new token not written back).""")
def offloaded_engine_serves_the_same_tokens(result: Any) -> dict:
    dev = result.runs[0]
    return dict(steps=len(dev.trace), n=len(dev.records), tokens=int(dev.requests["output_tokens"].sum()),
                holds=bool(result.same_tokens and result.same_schedule))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           the offloaded pool moved {total:.2f} MiB over {steps} steps, exactly the count from the block tables
           ({blocks} blocks read in all, {new} new tokens written back); per step from {lo:.0f} to {hi:.0f} KiB
           (median {med:.0f}){link}""",
       otherwise="""
           the bytes the pool counted differ from the count by hand: a step copied blocks its sequences do not
           attend over, or missed some. (The count assumes no preemption and no prefix shared between the
           sequences of one step.)""")
def offloaded_pool_moves_the_counted_bytes(result: Any) -> dict:
    from kvlab.experiments.offload_load import OFFLOADED, bytes_by_hand

    off = result.run(OFFLOADED)
    bs, per_token = int(off.settings["block_size"]), int(result.settings["bytes_per_token"])
    hand = bytes_by_hand(off, per_token)
    moved = result.steps[result.steps["run"] == OFFLOADED].set_index("step")["bytes_moved"]
    same = moved.reindex(hand["step"]).astype("int64").tolist() == hand["bytes_moved"].astype("int64").tolist()
    rate, b = result.settings.get("link_gbps"), hand["bytes_moved"]
    link = (f", which a {rate:g} GB/s link needs {b.min() / (rate * 1e6):.2f} to {b.max() / (rate * 1e6):.2f} ms "
            "to carry" if rate else "")
    return dict(total=b.sum() / 2**20, steps=len(hand), blocks=int(hand["bytes_read"].sum() // (bs * per_token)),
                new=int(hand["bytes_written"].sum() // per_token), lo=b.min() / 1024, hi=b.max() / 1024,
                med=float(b.median()) / 1024, link=link, holds=same)


@claim(NOTEBOOK, clock="wall",
       says="""
           the slowest twentieth of the gaps between tokens began at {off:.1f} ms offloaded against {dev:.1f} ms
           on the device (p95 of {n} gaps each; medians {off50:.1f} and {dev50:.1f} ms)""",
       otherwise="""
           the offloaded run's tail of gaps was no longer than the on-device run's. Both ran the same steps, so
           something slowed the on-device run's steps (another program on the machine): look at the step times in
           the figure and run the cell again.""")
def offloaded_tail_between_tokens_is_longer(result: Any) -> dict:
    off, dev = _spread(result, "time between tokens")
    return dict(off=off["p95"] * 1e3, dev=dev["p95"] * 1e3, n=int(dev["n"]), off50=off["p50"] * 1e3,
                dev50=dev["p50"] * 1e3, holds=off["p95"] > 1.1 * dev["p95"], **_modelled_link(result))


@claim(NOTEBOOK, clock="wall",
       says="""
           offloading widened the spread, not only the times: the middle half of the step times spanned {off:.1f}
           ms offloaded against {dev:.1f} ms on the device (IQR, n = {n} steps each), and of the gaps between
           tokens {toff:.1f} against {tdev:.1f} ms (n = {nt} each)""",
       otherwise="""
           the offloaded run's times were no more spread out than the on-device run's. The bytes each step moves
           vary with the batch (see the count above), so their link time should spread the steps; a machine busy
           with other programs can spread the on-device steps as much. Run again.""")
def offloading_widens_the_spread(result: Any) -> dict:
    (so, sd), (to, td) = _spread(result, "step time"), _spread(result, "time between tokens")
    return dict(off=so["iqr"] * 1e3, dev=sd["iqr"] * 1e3, n=int(sd["n"]), toff=to["iqr"] * 1e3,
                tdev=td["iqr"] * 1e3, nt=int(td["n"]),
                holds=so["iqr"] > 1.1 * sd["iqr"] and to["iqr"] > 1.1 * td["iqr"], **_modelled_link(result))


@claim(NOTEBOOK, clock="wall",
       says="""
           steps whose batch held more context paid more for offloading: the {k} steps that moved more than the
           median {med:.0f} KiB took {extra_hi:.1f} ms longer offloaded than the same steps on the device, the
           {k2} others {extra_lo:.1f} ms longer (medians of the paired differences)""",
       otherwise="""
           the steps that moved more bytes did not pay more than the others, by more than the medians' own
           uncertainty (their standard errors). Each step's link time is its bytes / rate, so this can only come
           from noise larger than that difference: a busy machine. Run again, or lower link_gbps to make the
           link's share larger.""")
def offload_cost_follows_the_bytes(result: Any) -> dict:
    from kvlab.experiments.offload_load import paired_steps

    p = paired_steps(result)
    med = float(p["bytes_moved"].median())
    hi, lo = p[p["bytes_moved"] > med], p[p["bytes_moved"] <= med]
    extra_hi, extra_lo = float(hi["extra_s"].median()), float(lo["extra_s"].median())
    # "more" than the run's own noise: the two medians' standard errors (≈ 0.93 × IQR / √n for a median)
    # and never less than a microsecond, below which a step's clock resolves nothing (equal costs differ by rounding)
    noise = max(_median_se(hi["extra_s"]), _median_se(lo["extra_s"]), 1e-6) if len(hi) and len(lo) else float("inf")
    return dict(k=len(hi), k2=len(lo), med=med / 1024, extra_hi=extra_hi * 1e3, extra_lo=extra_lo * 1e3,
                holds=len(hi) > 0 and extra_hi - extra_lo > noise, **_modelled_link(result))


def _median_se(values: pd.Series) -> float:
    """The standard error of a median: 1.2533 σ / √n, with σ estimated robustly as IQR / 1.349."""
    q1, q3 = values.quantile([0.25, 0.75])
    return float(1.2533 * (q3 - q1) / 1.349 / np.sqrt(len(values)))
