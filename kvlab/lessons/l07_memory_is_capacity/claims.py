"""Claims of notebook 07 (memory is capacity): counts of sequences that fit a KV budget, and what is wasted.

Every claim here reads a counting table of ``kvlab.experiments.capacity`` (no model runs, no
clock): the same numbers on every machine, so every claim is deterministic.
"""
from __future__ import annotations

import itertools

import pandas as pd

from kvlab.lessons.common.checks import listing
from kvlab.lessons.common.claims import claim

NOTEBOOK = "07_memory_is_capacity.ipynb"


def _schemes(table: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    t = table.set_index("scheme")
    return t.loc["reserve max length"], t.loc["paged blocks"]


# -- paged blocks vs reserving the maximum ----------------------------------------------------------

@claim(NOTEBOOK, clock="deterministic",
       says="""
           reserving the whole context ({context:,} tokens) for every request, the budget of {capacity:,} token
           slots holds {fit} sequences: {capacity:,} // {context:,} = {by_hand}""",
       otherwise="""
           the count differs from the hand division. That happens when some reservations are smaller than the
           context (a max_new_tokens cap): then each takes only prompt + max new tokens.""")
def reservation_fits_budget_over_context(table: pd.DataFrame) -> dict:
    res, _ = _schemes(table)
    context = int(table.attrs["max_model_len"])
    capacity = int(res.capacity_tokens)
    return dict(context=context, capacity=capacity, fit=int(res.sequences_fit), by_hand=capacity // context,
                holds=int(res.sequences_fit) == capacity // context)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           paged blocks of {block_size} fit {paged} sequences in the same bytes, {ratio:.1f}× the {reserved} of
           the reservation; the engine's BlockManager, allocating them one by one, counts {bm} as well""",
       otherwise="""
           paging fitted no more sequences than reserving. That happens when every request really reaches its
           reserved length, so there is nothing left unused to give to others.""")
def paging_fits_more_sequences(table: pd.DataFrame) -> dict:
    res, pag = _schemes(table)
    paged, reserved, bm = int(pag.sequences_fit), int(res.sequences_fit), int(pag.block_manager_fit)
    return dict(block_size=int(table.attrs["block_size"]), paged=paged, reserved=reserved, bm=bm,
                ratio=paged / reserved, holds=paged > reserved and bm == paged)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           of the {reserved:,} token slots the reservations hold, {unused:,} ({share:.0%}) are set aside and never
           written: most of what reserving holds is empty""",
       otherwise="""
           less than half of the reservations stayed empty: the requests come close to their maximum, so reserving
           it wastes little. Try a workload of short answers.""")
def reservation_wastes_most(table: pd.DataFrame) -> dict:
    res, _ = _schemes(table)
    reserved = int(res.tokens_held + res.reserved_unused_tokens)
    unused = int(res.reserved_unused_tokens)
    return dict(reserved=reserved, unused=unused, share=unused / reserved, holds=unused / reserved > 0.5)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           paging wastes {waste:,} token slots, {share:.1%} of what it holds: the unfilled ends of last blocks,
           {per_seq:.1f} slots per sequence, less than one block of {block_size} each""",
       otherwise="""
           the waste per sequence reached a whole block, which the unfilled tail of one last block cannot do: look
           at in_block_waste_tokens and sequences_fit in the table.""")
def paging_wastes_only_last_blocks(table: pd.DataFrame) -> dict:
    _, pag = _schemes(table)
    waste, seqs, block_size = int(pag.in_block_waste_tokens), int(pag.sequences_fit), int(table.attrs["block_size"])
    per_seq = waste / seqs
    return dict(waste=waste, share=float(pag.waste_share), per_seq=per_seq, block_size=block_size,
                holds=per_seq < block_size and float(pag.waste_share) < 0.1)


# -- block size -------------------------------------------------------------------------------------

@claim(NOTEBOOK, clock="deterministic",
       says="""
           for every block size from {smallest} to {largest}, the unfilled tail per sequence averages within 5% of a
           block (at least 1 slot) of (block_size − 1) / 2: the largest gap is {dev:.2f} slots, at blocks of {at}
           ({w_at:.1f} slots, rule {r_at:.1f}); at blocks of {mid}, {w_mid:.1f} slots against {r_mid:.1f}""",
       otherwise="""
           the waste strayed from half a block. The rule assumes lengths fall anywhere within a block; a workload
           whose lengths cluster (say, all multiples of 16) breaks it.""")
def waste_is_about_half_a_block(sizes: pd.DataFrame) -> dict:
    """The sentence once quoted the largest gap beside the numbers of blocks of 16 (1.72 slots; at 16 the gap is
    0.72): it now names the block size where the largest gap is, and quotes 16 (the engine's default) beside it."""
    t = sizes.set_index("block_size").sort_index()
    dev = (t["waste_per_sequence"] - t["rule_of_thumb"]).abs()
    at = int(dev.idxmax())
    mid = 16 if 16 in t.index else int(t.index[len(t) // 2])
    return dict(smallest=int(t.index.min()), largest=int(t.index.max()), dev=float(dev.max()), at=at,
                w_at=float(t.loc[at, "waste_per_sequence"]), r_at=float(t.loc[at, "rule_of_thumb"]), mid=mid,
                w_mid=float(t.loc[mid, "waste_per_sequence"]), r_mid=float(t.loc[mid, "rule_of_thumb"]),
                holds=bool((dev <= (dev.index.to_series() * 0.05).clip(lower=1.0)).all()))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           bigger blocks never fit more sequences, and the largest fit fewer than the smallest: {fits}""",
       otherwise="""
           a larger block fitted more sequences, which in-block waste alone cannot explain, or every block size
           fitted as many: check that every row uses the same budget.""")
def bigger_blocks_fit_fewer(sizes: pd.DataFrame) -> dict:
    """Never rising plus fewer at the largest block than at the smallest (what the sentence says): the fit is flat
    over the small blocks (33 for blocks of 1 to 8 in the notebook), so "fewer at every step" would be false."""
    t = sizes.sort_values("block_size")
    fit = t["sequences_fit"].astype(int).tolist()
    bs = t["block_size"].astype(int).tolist()
    groups = itertools.groupby(zip(fit, bs), key=lambda pair: pair[0])  # neighbouring block sizes that fit as many
    fits = "; ".join(f"{f} with blocks of {listing([b for _, b in same])}" for f, same in groups)
    return dict(fits=fits, first=fit[0], last=fit[-1],
                holds=all(a >= b for a, b in zip(fit, fit[1:])) and fit[-1] < fit[0])


# -- max context and max new tokens -------------------------------------------------------------------

@claim(NOTEBOOK, clock="deterministic",
       says="""
           at max context {context}, lowering max new tokens from {m_hi} to {m_lo} lets reservation admit {r_hi} →
           {r_lo} sequences (+{dr}), and paging {p_hi} → {p_lo} (+{dp})""",
       otherwise="""
           paging gained as much as reservation: the answers of this workload reach their cap, so the cap is what
           both schemes hold.""")
def shorter_answers_help_reservation_most(levers: pd.DataFrame) -> dict:
    t = levers[levers["max_model_len"] == levers["max_model_len"].max()].sort_values("max_new_tokens")
    lo, hi = t.iloc[0], t.iloc[-1]
    dr, dp = int(lo.reserved_fit - hi.reserved_fit), int(lo.paged_fit - hi.paged_fit)
    return dict(context=int(lo.max_model_len), m_hi=int(hi.max_new_tokens), m_lo=int(lo.max_new_tokens),
                r_hi=int(hi.reserved_fit), r_lo=int(lo.reserved_fit), p_hi=int(hi.paged_fit), p_lo=int(lo.paged_fit),
                dr=dr, dp=dp, holds=dr > dp >= 0)


@claim(NOTEBOOK, clock="deterministic",
       says="""
           with max new tokens at {m_lo}, reserving and paging fit nearly as many: {pairs} (reserved vs paged, by
           max context)""",
       otherwise="""
           the two schemes stay far apart even with a small cap: the prompts vary a lot, and a reservation is
           sized by the prompt plus the cap.""")
def small_reservation_matches_paging(levers: pd.DataFrame) -> dict:
    m_lo = int(levers["max_new_tokens"].min())
    t = levers[levers["max_new_tokens"] == m_lo].sort_values("max_model_len")
    pairs = ", ".join(f"{int(r.reserved_fit)} vs {int(r.paged_fit)} at {int(r.max_model_len)}" for r in t.itertuples())
    close = ((t["reserved_fit"] - t["paged_fit"]).abs() <= 0.1 * t["paged_fit"]).all()
    return dict(m_lo=m_lo, pairs=pairs, holds=bool(close))


@claim(NOTEBOOK, clock="deterministic",
       says="""
           a max context of {c_lo} cuts {cut_lo} of the {n} prompts to fit (max context {c_hi}: {cut_hi}), and
           fits {fit_lo} paged sequences instead of {fit_hi}""",
       otherwise="the shorter context cut no prompt: this workload's prompts all fit; lower the context further.")
def short_context_cuts_prompts(levers: pd.DataFrame) -> dict:
    t = levers[levers["max_new_tokens"] == levers["max_new_tokens"].min()].sort_values("max_model_len")
    lo, hi = t.iloc[0], t.iloc[-1]
    return dict(c_lo=int(lo.max_model_len), c_hi=int(hi.max_model_len), cut_lo=int(lo.prompts_cut),
                cut_hi=int(hi.prompts_cut), n=int(levers.attrs.get("requests", 64)), fit_lo=int(lo.paged_fit),
                fit_hi=int(hi.paged_fit), holds=int(lo.prompts_cut) > int(hi.prompts_cut))
