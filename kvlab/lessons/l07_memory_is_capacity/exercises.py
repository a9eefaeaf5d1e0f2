"""Exercises of notebook 07 (memory is capacity): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from kvlab.lessons.common.exercises import Feedback, exercise, check_number, right, wrong, _is_number


EX07_LENGTHS = (100, 40, 300, 17, 250, 50)  # tokens each sequence reaches, in arrival order
EX07_BLOCKS, EX07_BLOCK_SIZE, EX07_RESERVE = 48, 16, 512


def _fit_07() -> tuple[int, int]:
    from kvlab.experiments.capacity import block_manager_fit
    from kvlab.serving.block_manager import BlockManager
    bm = BlockManager(EX07_BLOCKS, EX07_BLOCK_SIZE, enable_prefix_caching=False)
    return block_manager_fit(EX07_LENGTHS, bm), EX07_BLOCKS * EX07_BLOCK_SIZE // EX07_RESERVE


def _fit_07_by_tokens() -> int:
    from kvlab.experiments.capacity import fit_in_order
    return fit_in_order(EX07_LENGTHS, EX07_BLOCKS * EX07_BLOCK_SIZE)


@exercise("07_memory_is_capacity.ipynb", solution=_fit_07(), wrong=(_fit_07_by_tokens(), _fit_07()[1]),
          title='count them yourself',
          question="""Six sequences reach 100, 40, 300, 17, 250 and 50 tokens, arriving in that order. The pool has 48
blocks of 16 tokens (768 token slots). How many fit at once, first come first served, with
paged blocks? And if each instead reserves 512 tokens?""",
          code="""my_paged, my_reserved = None, None   # replace None with whole numbers
check_sequences_fit(None if my_paged is None else (my_paged, my_reserved))""",
          explanation="""Blocks needed: ⌈100/16⌉ = 7, then 3, 19, 2, 16, 4. Running total: 7, 10, 29, 31, 47, 51: the sixth
would pass 48, so **5** fit (adding tokens instead gives 757 ≤ 768 and the wrong answer 6: each
sequence takes whole blocks). Reserving 512 each: 768 // 512 = **1**.""")
def check_sequences_fit(answer: Any) -> Feedback:
    """(paged, reserved): sequences of EX07_LENGTHS that fit in EX07_BLOCKS blocks, or reserving EX07_RESERVE each."""
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2 and all(_is_number(a) for a in answer)):
        return wrong(f"answer with two whole numbers, (paged, reserved), got {answer!r}.")
    p, r = answer
    truth_p, truth_r = _fit_07()
    if (p, r) == (truth_p, truth_r):
        blocks = [-(-n // EX07_BLOCK_SIZE) for n in EX07_LENGTHS]
        return right(f"paged: {truth_p} (blocks {blocks} pass {EX07_BLOCKS} at the next one); reserved: "
                     f"{EX07_BLOCKS * EX07_BLOCK_SIZE} // {EX07_RESERVE} = {truth_r}.")
    hints = []
    if p != truth_p and p == _fit_07_by_tokens():
        hints.append("paged: you added tokens; each sequence takes whole blocks, ceil(n / 16) of them")
    elif p != truth_p:
        hints.append(f"paged: add ceil(n / 16) blocks per sequence, in order, until the next would pass {EX07_BLOCKS}")
    if r != truth_r:
        hints.append(f"reserved: every sequence sets aside {EX07_RESERVE} tokens whatever its length")
    return wrong("; ".join(hints) + ".")


@exercise("07_memory_is_capacity.ipynb", solution=-(-100 // 16) * 16 - 100, wrong=100 % 16,
          title="one sequence's waste",
          question="""How many token slots are wasted in the last block of a 100-token sequence with blocks of 16?""",
          code="""check_in_block_waste(None)   # replace None with a whole number""",
          explanation="""7 blocks = 112 slots for 100 tokens: **12** empty slots (the last block holds 4 tokens and 12 gaps).""")
def check_in_block_waste(answer: Any) -> Feedback:
    """Empty slots in the last block of a 100-token sequence with blocks of 16."""
    tokens, block_size = 100, 16
    blocks = -(-tokens // block_size)
    return check_number(
        answer, blocks * block_size - tokens, what="wasted slots", rel=0,
        mistakes=[(tokens % block_size, "that is how many tokens sit in the last block; count the empty slots "
                                        "next to them.")],
        hint="round the tokens up to whole blocks, then subtract the tokens.",
        confirm=f"{blocks} blocks hold {blocks * block_size} slots for {tokens} tokens: "
                f"{blocks * block_size - tokens} empty.")


# -- exercise: attention over a paged cache ------------------------------------------------------------
# The learner writes the gather a paged cache needs: one query over K/V scattered in blocks of a pool. With
# grouped-query attention the pool holds fewer K/V heads than q has query heads: query head h reads K/V head
# h // (heads // kv_heads), as in kvlab's model (repeat_interleave). The oracle is dense attention (torch's
# scaled_dot_product_attention) on the same K/V laid out contiguously, each K/V head repeated for its group; each slip
# the checker names is computed too, so a wrong answer is recognised by value.

def solution_paged_attention(q, k_blocks, v_blocks, block_table, seq_len):
    """The reference answer: gather by block table, cut at seq_len, share K/V heads among their query heads,
    scaled scores, softmax over tokens, sum."""
    import torch

    heads, head_dim = q.shape  # (heads, head_dim)
    kv_heads = k_blocks.shape[2]  # heads is a multiple of it: grouped-query attention when it is smaller
    k = k_blocks[block_table].reshape(-1, kv_heads, head_dim)[:seq_len]  # (seq_len, kv_heads, head_dim), token order
    v = v_blocks[block_table].reshape(-1, kv_heads, head_dim)[:seq_len]
    k = k.repeat_interleave(heads // kv_heads, dim=1)  # (seq_len, heads, head_dim): query head h reads K/V head
    v = v.repeat_interleave(heads // kv_heads, dim=1)  # h // (heads // kv_heads)
    scores = torch.einsum("hd,shd->hs", q, k) / head_dim ** 0.5  # (heads, seq_len)
    weights = scores.softmax(dim=-1)  # over the tokens
    return torch.einsum("hs,shd->hd", weights, v)  # (heads, head_dim)


def _paged_attention_variant(q, k_blocks, v_blocks, block_table, seq_len, *, order: str = "table",
                             cut: bool = True, scale: str = "sqrt", softmax_dim: int = -1, groups: str = "interleave"):
    """Attention with one slip switched on: the values each slip of the exercise produces."""
    import torch

    heads, head_dim = q.shape
    kv_heads = k_blocks.shape[2]
    blocks = {"table": list(block_table), "sorted": sorted(block_table),
              "first": list(range(len(block_table)))}[order]
    k = k_blocks[blocks].reshape(-1, kv_heads, head_dim)  # (blocks * block_size, kv_heads, head_dim)
    v = v_blocks[blocks].reshape(-1, kv_heads, head_dim)
    if cut:
        k, v = k[:seq_len], v[:seq_len]
    # query head h reads K/V head h // group (interleave, right) or h % kv_heads (tile: torch.repeat, a slip)
    group = heads // kv_heads
    k, v = ((t.repeat_interleave(group, dim=1) if groups == "interleave" else t.repeat(1, group, 1)) for t in (k, v))
    divide = {"sqrt": head_dim ** 0.5, "none": 1.0, "dim": float(head_dim)}[scale]
    scores = torch.einsum("hd,shd->hs", q, k) / divide  # (heads, tokens)
    return torch.einsum("hs,shd->hd", scores.softmax(dim=softmax_dim), v)  # (heads, head_dim)


def forgets_the_cut(q, k_blocks, v_blocks, block_table, seq_len):
    """A slip (the registered wrong answer): attends over every slot of the last block, stale ones too."""
    return _paged_attention_variant(q, k_blocks, v_blocks, block_table, seq_len, cut=False)


PAGED_SLIPS = (  # (variant keywords, what the learner's slip is)
    (dict(order="sorted"), "you gathered the blocks in the order of their ids, not the block table's: "
     "block_table[i] holds tokens i*block_size to (i+1)*block_size - 1, wherever it sits in the pool. Index the "
     "pool with the table as it is, k_blocks[block_table]."),
    (dict(order="first"), "you read the first blocks of the pool, not the sequence's: the block table says which "
     "physical blocks hold its tokens. Index the pool with it, k_blocks[block_table]."),
    (dict(cut=False), "you forgot to cut at seq_len: the last block is only partly filled, and its slots after "
     "seq_len hold stale keys and values (another sequence's, or none yet). Keep the first seq_len tokens of the "
     "gathered K and V."),
    (dict(scale="none"), "you forgot the 1/sqrt(head_dim) scale: without it the spread of the scores grows with head_dim and the "
     "softmax becomes too sharp. Divide q·k by head_dim ** 0.5."),
    (dict(scale="dim"), "you divided the scores by head_dim; the scale is 1/sqrt(head_dim)."),
    (dict(softmax_dim=0), "your softmax runs over the heads: each head's weights over the tokens must add up to 1, "
     "so take the softmax along the token axis of the (heads, seq_len) scores."),
    (dict(groups="tile"), "you paired query head h with K/V head h % kv_heads (torch.repeat or tiling the K/V "
     "heads): with grouped-query attention neighbouring query heads share one K/V head, so query head h reads K/V "
     "head h // (heads // kv_heads). Repeat each K/V head for its group with repeat_interleave(heads // kv_heads, "
     "dim=1)."),
)


def _paged_cases() -> list[dict]:
    """Random pools whose block tables are out of order and whose last block is partly filled (mostly).

    The K/V of the sequence is drawn contiguous first (the oracle's input), then scattered into the pool's blocks by the
    table; every other slot holds random stale values, so a slip shows. The first cases have as many K/V heads as query
    heads; the last two have 4x and 2x as many query heads (grouped-query attention), so a function that assumes equal
    heads passes the first and fails there.
    """
    import torch

    gen = torch.Generator().manual_seed(7)
    cases = []
    for heads, kv_heads, head_dim, block_size, num_blocks, table, seq_len in (
            (2, 2, 8, 4, 10, [7, 2, 5], 10),  # last block holds 2 of 4
            (3, 3, 16, 4, 12, [3, 0, 9, 1], 13),  # last block holds 1
            (2, 2, 8, 4, 8, [5, 1], 8),  # both blocks full
            (1, 1, 4, 8, 6, [4], 3),  # one block, partly filled
            (8, 2, 8, 4, 10, [6, 1, 8], 11),  # 4 query heads per K/V head; last block holds 3
            (4, 2, 16, 4, 9, [2, 7, 0, 5], 14)):  # 2 query heads per K/V head; last block holds 2
        k = torch.randn(seq_len, kv_heads, head_dim, generator=gen)  # (seq_len, kv_heads, head_dim), contiguous
        v = torch.randn(seq_len, kv_heads, head_dim, generator=gen)
        k_blocks = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)  # stale everywhere
        v_blocks = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=gen)
        for t in range(seq_len):  # token t lives in block table[t // block_size], slot t % block_size
            k_blocks[table[t // block_size], t % block_size] = k[t]
            v_blocks[table[t // block_size], t % block_size] = v[t]
        q = torch.randn(heads, head_dim, generator=gen)
        cases.append(dict(q=q, k_blocks=k_blocks, v_blocks=v_blocks, block_table=table, seq_len=seq_len,
                          k=k, v=v))
    return cases


def dense_attention(q, k, v):
    """The oracle: one query over contiguous K/V, q (heads, head_dim), k, v (seq_len, kv_heads, head_dim).

    Each K/V head is repeated for the heads // kv_heads query heads that share it (repeat_interleave:
    query head h reads K/V head h // group), as kvlab's model and SDPA's enable_gqa do.
    """
    import torch.nn.functional as F

    group = q.shape[0] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (seq_len, heads, head_dim)
    y = F.scaled_dot_product_attention(q[:, None, :], k.transpose(0, 1), v.transpose(0, 1))  # (heads, 1, head_dim)
    return y[:, 0]  # (heads, head_dim)


@exercise("07_memory_is_capacity.ipynb", kind="build", solution=solution_paged_attention, wrong=forgets_the_cut,
          title="attention over a paged cache",
          question="""A paged cache keeps a sequence's keys and values in blocks scattered over a pool; the block
table says which. Write the attention of one new token over them: gather, score with
`q · k / sqrt(head_dim)`, softmax over the tokens, weight the values. The checker compares your
function with dense attention on the same keys and values laid out contiguously.

<details><summary>The shapes and the layout</summary>

`q` is `(heads, head_dim)`; `k_blocks` and `v_blocks` are one layer's pools, shaped
`(num_blocks, block_size, kv_heads, head_dim)` as in `kvlab.cache.PagedKVCache`. Query heads may
outnumber K/V heads (grouped-query attention): `heads` is a multiple of `kv_heads`, and each group
of `heads // kv_heads` neighbouring query heads shares one K/V head, so query head `h` reads K/V
head `h // (heads // kv_heads)`. Token `t` of the sequence sits in block
`block_table[t // block_size]`, slot `t % block_size`; `seq_len` tokens are stored, so the last
block may be only partly filled, and its remaining slots hold stale data. The checker's pools have
block tables out of order, some with as many K/V heads as query heads and some with fewer.
</details>""",
          code='''import torch


def paged_attention(q, k_blocks, v_blocks, block_table, seq_len):
    """One query over a sequence whose K/V sit in blocks of a shared pool; returns (heads, head_dim)."""
    heads, head_dim = q.shape          # q: (heads, head_dim), the new token's query
    kv_heads = k_blocks.shape[2]       # heads // kv_heads query heads share each K/V head
    # k_blocks, v_blocks: (num_blocks, block_size, kv_heads, head_dim); block_table: block ids in token order
    # TODO 1: gather this sequence's keys and values in token order, cut at seq_len: (seq_len, kv_heads, head_dim)
    # TODO 2: give each query head its K/V head, h // (heads // kv_heads): (seq_len, heads, head_dim)
    # TODO 3: scores of q against every key, scaled by 1/sqrt(head_dim): (heads, seq_len)
    # TODO 4: softmax over the tokens, then the weighted sum of the values: (heads, head_dim)
    return torch.zeros(heads, head_dim)


check_paged_attention(paged_attention)''',
          explanation="""```python
def paged_attention(q, k_blocks, v_blocks, block_table, seq_len):
    heads, head_dim = q.shape
    kv_heads = k_blocks.shape[2]
    k = k_blocks[block_table].reshape(-1, kv_heads, head_dim)[:seq_len]   # (seq_len, kv_heads, head_dim)
    v = v_blocks[block_table].reshape(-1, kv_heads, head_dim)[:seq_len]
    k = k.repeat_interleave(heads // kv_heads, dim=1)                     # (seq_len, heads, head_dim)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scores = torch.einsum("hd,shd->hs", q, k) / head_dim ** 0.5        # (heads, seq_len)
    weights = scores.softmax(dim=-1)                                    # over the tokens
    return torch.einsum("hs,shd->hd", weights, v)                      # (heads, head_dim)
```
Indexing the pool with the table, `k_blocks[block_table]`, copies the sequence's blocks in token
order: `(blocks, block_size, kv_heads, head_dim)`, flattened to one token axis and cut at `seq_len`.
kvlab's `PagedKVCache.attend` does the same with `index_select` for a whole batch at once (padding
the tables and masking past each sequence's length). vLLM's PagedAttention kernels never build the
copy: they walk the block table inside the kernel and read each block where it lies, which is why
paging costs attention little. With grouped-query attention several query heads share one K/V head:
`repeat_interleave` gives query heads `0 .. group - 1` K/V head 0, the next group K/V head 1, and so
on, as kvlab's model does (`scaled_dot_product_attention(..., enable_gqa=True)` in
`PagedKVCache.attend`); the pool stores only `kv_heads` heads, which is what grouping saves. The
slips the checker names: blocks in the order of their ids instead of the table's, no cut at
`seq_len` (the stale slots of the last block join in), a missing or wrong 1/sqrt(head_dim) scale, a
softmax over the heads instead of the tokens, query heads paired with K/V heads by `h % kv_heads`
(`repeat` instead of `repeat_interleave`), and K/V heads taken to be as many as query heads.""")
def check_paged_attention(fn: Any) -> Feedback:
    """A function paged_attention(q, k_blocks, v_blocks, block_table, seq_len) against dense attention."""
    import torch

    if not callable(fn) or isinstance(fn, type):
        return wrong(f"pass your function itself, check_paged_attention(paged_attention), not "
                     f"{type(fn).__name__} {str(fn)[:40]!r}.")
    cases = _paged_cases()
    for i, case in enumerate(cases):
        args = {k: (v.clone() if isinstance(v, torch.Tensor) else list(v) if isinstance(v, list) else v)
                for k, v in case.items() if k not in ("k", "v")}
        heads, kv_heads = case["q"].shape[0], case["k_blocks"].shape[2]
        shape = (f"heads={heads}, kv_heads={kv_heads}, head_dim={case['q'].shape[1]}, "
                 f"block_size={case['k_blocks'].shape[1]}")
        where = f"with {shape}, block_table={case['block_table']}, seq_len={case['seq_len']}"
        # reached only when every earlier case, all with heads == kv_heads, came out right
        gqa = ("" if heads == kv_heads else
               f" Here {heads} query heads share {kv_heads} K/V heads (grouped-query attention): the pools hold "
               f"kv_heads = k_blocks.shape[2] heads, and each group of heads // kv_heads = {heads // kv_heads} "
               "neighbouring query heads reads one of them, query head h reading K/V head h // (heads // kv_heads). "
               "Gather with kv_heads, then k.repeat_interleave(heads // kv_heads, dim=1) (the same for v).")
        try:
            got = fn(**args)
        except Exception as exc:
            return wrong(f"your function raised {type(exc).__name__}: {exc} {where}.{gqa}")
        expected = dense_attention(case["q"], case["k"], case["v"])  # (heads, head_dim)
        if not isinstance(got, torch.Tensor):
            return wrong(f"your function returned {type(got).__name__}; return a tensor (heads, head_dim).")
        if tuple(got.shape) != tuple(expected.shape):
            return wrong(f"your function returned shape {tuple(got.shape)} {where}; the output is one vector per "
                         f"query head, (heads, head_dim) = {tuple(expected.shape)}.{gqa}")
        got = got.detach().to(expected.dtype)
        if torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
            continue
        for variant, why in PAGED_SLIPS:
            slip = _paged_attention_variant(**{k: v for k, v in case.items() if k not in ("k", "v")}, **variant)
            if not torch.allclose(slip, expected, rtol=1e-4, atol=1e-5) and torch.allclose(got, slip, rtol=1e-4,
                                                                                          atol=1e-5):
                return wrong(f"{where}: {why}")
        err = (got - expected).abs().max().item()
        if gqa:
            return wrong(f"{where}, your output differs from dense attention on the contiguous K/V by up to "
                         f"{err:.3g}, though it was right in every case with as many K/V heads as query "
                         f"heads.{gqa}")
        return wrong(f"{where}, your output differs from dense attention on the contiguous K/V by up to {err:.3g}. "
                     "Gather k_blocks[block_table] in token order, keep seq_len tokens, scores q·k / sqrt(head_dim), "
                     "softmax over the tokens, then the weighted sum of the values.")
    grouped = sorted({c["q"].shape[0] // c["k_blocks"].shape[2] for c in cases} - {1})
    return right(f"the same as dense attention on the contiguous keys and values in all {len(cases)} cases "
                 "(block tables out of order, last blocks partly filled, "
                 f"{' and '.join(map(str, grouped))} query heads per K/V head in the grouped ones). This "
                 "gather is what paging costs attention; vLLM's kernels read each block where it lies instead "
                 "of copying it.")
