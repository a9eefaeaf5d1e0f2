"""Exercises of notebook 08 (preemption, prefix caching, chunked prefill): checkers, questions and folded solutions."""
from __future__ import annotations

from typing import Any

from .framework import Feedback, check_number, exercise

NOTEBOOK = "08_prefix_and_chunks.ipynb"
EX08_PROMPT, EX08_WRITTEN = 40, 25  # the preempted request of exercise 08.1


def tokens_recomputed_after_preemption(prompt_tokens: int = EX08_PROMPT, written_tokens: int = EX08_WRITTEN) -> int:
    """Tokens computed a second time when a sequence preempted after writing ``written_tokens`` is readmitted.

    When it was preempted, the K/V of its prompt and of every written token but the newest had been
    computed (the newest is computed by the step that would have written the next one). Readmitted,
    it computes all ``prompt_tokens + written_tokens`` again in one prefill; all but the newest were
    computed once already. ``tests/test_experiments_serving.py`` checks this against the engine's
    own count (``kvlab.experiments.prefix_and_chunks.recomputed_tokens``).
    """
    return prompt_tokens + written_tokens - 1


@exercise(NOTEBOOK, solution=tokens_recomputed_after_preemption(), wrong=EX08_PROMPT + EX08_WRITTEN,
          title="the price of one preemption",
          question=f"""A request with a {EX08_PROMPT}-token prompt has written {EX08_WRITTEN} tokens when the pool runs out and
the engine preempts it (by recompute). Later it is admitted again. How many tokens does the engine
compute a second time, that is, tokens whose K/V it had already computed once before the preemption?
(This is what `recomputed_tokens` adds up in the tables above.)""",
          code="""check_recomputed_tokens(None)   # replace None with a whole number""",
          explanation=f"""Readmitted, the request runs one prefill over its prompt and everything it wrote:
{EX08_PROMPT} + {EX08_WRITTEN} = {EX08_PROMPT + EX08_WRITTEN} tokens. Before the preemption the engine had computed the K/V
of all of them but the newest written token (that one goes through the model in the step that writes
the next token). So **{tokens_recomputed_after_preemption()}** tokens are computed a second time; the newest would have gone
through the model anyway.""")
def check_recomputed_tokens(answer: Any) -> Feedback:
    """Tokens computed again when a request (EX08_PROMPT prompt, EX08_WRITTEN written) is readmitted after preemption."""
    truth = tokens_recomputed_after_preemption()
    return check_number(
        answer, truth, what="tokens computed again", rel=0,
        mistakes=[(EX08_PROMPT + EX08_WRITTEN, "that is every token the readmitted request computes, but the newest "
                                               "written token had never gone through the model: its K/V is computed "
                                               "for the first time."),
                  (EX08_WRITTEN, "the prompt's K/V was freed too: recompute starts again from the first prompt "
                                 "token."),
                  (EX08_PROMPT, "the tokens it had written are part of the sequence now, and their K/V was freed "
                                "with the rest.")],
        hint="count the tokens whose K/V had been computed when the blocks were freed.",
        confirm=f"the readmitted request computes {EX08_PROMPT + EX08_WRITTEN} tokens; all but the newest, {truth}, "
                "had been computed before. Preemption by recompute trades memory for this work.")


def prefix_hit_tokens(system_tokens: int = 250, prompt_tokens: int = 300, block_size: int = 16) -> int:
    """Prompt tokens of a second request found in the prefix cache after a first with the same system prompt."""
    from ..serving.block_manager import BlockManager
    from ..serving.sequence import SamplingParams, Sequence as EngineSequence

    system = list(range(system_tokens))
    own = prompt_tokens - system_tokens
    first = EngineSequence(0, system + [1000 + i for i in range(own)], 1, SamplingParams(), None, 0.0)
    second = EngineSequence(1, system + [2000 + i for i in range(own)], 1, SamplingParams(), None, 0.0)
    bm = BlockManager(2 * -(-prompt_tokens // block_size) + 1, block_size)
    bm.allocate(first)
    first.num_computed_tokens = first.num_tokens  # its prompt was computed: its full blocks become cacheable
    bm.cache_full_blocks(first)
    return len(bm.match_prefix(second)) * block_size


@exercise(NOTEBOOK, solution=prefix_hit_tokens(), wrong=250,
          title='what can be reused?',
          question="""A 250-token system prompt, blocks of 16, and a request whose prompt is that system prompt
followed by 50 words of its own. How many of its prompt tokens can come from the prefix cache?""",
          code="""check_prefix_hit(None)   # replace None with a whole number""",
          explanation="""250 // 16 = 15 full blocks hold nothing but system prompt: **240** tokens. The 16th block holds
the last 10 system-prompt tokens and the first 6 of the user's own, so its hash differs from
any other request's.""")
def check_prefix_hit(answer: Any) -> Feedback:
    """Prompt tokens of a 300-token request (250-token system prompt + its own) reused from the prefix cache."""
    system_tokens, block_size = 250, 16
    truth = prefix_hit_tokens(system_tokens, 300, block_size)
    return check_number(
        answer, truth, what="tokens reused", rel=0,
        mistakes=[(system_tokens, "only whole blocks are shared; the block that mixes system prompt and the "
                                  "user's tokens is not."),
                  (-(-system_tokens // block_size) * block_size, "that rounds up; the last system-prompt block also "
                                                                 "holds the user's tokens, so its hash differs.")],
        hint=f"count the blocks of {block_size} tokens that hold nothing but the system prompt.",
        confirm=f"{system_tokens} // {block_size} = {truth // block_size} full blocks hold only system prompt: "
                f"{truth} tokens reused. The next block mixes system prompt and the user's words, so its hash differs.")
