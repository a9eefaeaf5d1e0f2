"""Exercises of notebook 07 (memory is capacity): checkers, their questions and folded solutions."""
from __future__ import annotations

from typing import Any

from .framework import Feedback, exercise, check_number, right, wrong, _is_number


EX07_LENGTHS = (100, 40, 300, 17, 250, 50)  # tokens each sequence reaches, in arrival order
EX07_BLOCKS, EX07_BLOCK_SIZE, EX07_RESERVE = 48, 16, 512


def _fit_07() -> tuple[int, int]:
    from ..experiments.capacity import block_manager_fit
    return block_manager_fit(EX07_LENGTHS, EX07_BLOCKS, EX07_BLOCK_SIZE), EX07_BLOCKS * EX07_BLOCK_SIZE // EX07_RESERVE


def _fit_07_by_tokens() -> int:
    from ..experiments.capacity import fit_in_order
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
