"""Exercises of notebook 08 (preemption, prefix caching, chunked prefill): checkers, questions and folded solutions."""
from __future__ import annotations

from typing import Any, Callable

from kvlab.lessons.common.exercises import Feedback, check_number, exercise, right, method_source, solution_code, wrong
from kvlab.experiments.presets import LESSON_SPEC

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


def prefix_hit_tokens(system_tokens: int = 250, prompt_tokens: int = 300) -> int:
    """Prompt tokens of a second request found in the prefix cache after a first with the same system prompt, in
    the lessons' blocks (``LESSON_SPEC.block_size``)."""
    from kvlab.clocks import RequestRecord
    from kvlab.serving.block_manager import BlockManager
    from kvlab.serving.sequence import SamplingParams, Sequence as EngineSequence

    system = list(range(system_tokens))
    own = prompt_tokens - system_tokens
    first = EngineSequence(0, system + [1000 + i for i in range(own)], 1, SamplingParams(),
                           RequestRecord(0, prompt_tokens, 1, scheduled_s=0.0), 0.0)
    second = EngineSequence(1, system + [2000 + i for i in range(own)], 1, SamplingParams(),
                            RequestRecord(1, prompt_tokens, 1, scheduled_s=0.0), 0.0)
    block_size = LESSON_SPEC.block_size
    bm = BlockManager(2 * -(-prompt_tokens // block_size) + 1, block_size)
    bm.allocate(first)
    first.num_computed_tokens = first.num_tokens  # its prompt was computed: its full blocks become cacheable
    bm.cache_full_blocks(first)
    return len(bm.match_prefix(second)) * block_size


@exercise(NOTEBOOK, solution=prefix_hit_tokens(), wrong=250,
          title='what can be reused?',
          question="""A 250-token system prompt, blocks of 16, and a request whose prompt is that system prompt
followed by 50 tokens of its own. How many of its prompt tokens can come from the prefix cache?""",
          code="""check_prefix_hit(None)   # replace None with a whole number""",
          explanation="""250 // 16 = 15 full blocks hold nothing but system prompt: **240** tokens. The 16th block holds
the last 10 system-prompt tokens and the first 6 of the user's own, so its hash differs from
any other request's.""")
def check_prefix_hit(answer: Any) -> Feedback:
    """Prompt tokens of a 300-token request (250-token system prompt + its own) reused from the prefix cache."""
    system_tokens, block_size = 250, LESSON_SPEC.block_size
    truth = prefix_hit_tokens(system_tokens, 300)
    return check_number(
        answer, truth, what="tokens reused", rel=0,
        mistakes=[(system_tokens, "only whole blocks are shared; the block that mixes system prompt and the "
                                  "user's tokens is not."),
                  (-(-system_tokens // block_size) * block_size, "that rounds up; the last system-prompt block also "
                                                                 "holds the user's tokens, so its hash differs.")],
        hint=f"count the blocks of {block_size} tokens that hold nothing but the system prompt.",
        confirm=f"{system_tokens} // {block_size} = {truth // block_size} full blocks hold only system prompt: "
                f"{truth} tokens reused. The next block mixes system prompt and the user's words, so its hash differs.")


# -- exercise: write the block table -------------------------------------------------------------------
# The learner writes a small block allocator with prefix sharing; the checker runs scripted scenarios
# on it and on kvlab's own BlockManager (the oracle, behind the same interface) and compares what both
# show after every operation: each live sequence's number of blocks, which blocks are shared, and the
# free count. Block ids may differ; the structure may not.

class SolutionBlockTable:
    """The reference answer of 'write the block table': blocks by reference count, full prefix blocks shared."""

    def __init__(self, num_blocks, block_size):
        self.block_size = block_size
        self.free_blocks = list(range(num_blocks))  # ids of the blocks no sequence uses
        self.ref_count = [0] * num_blocks  # how many sequences use each block
        self.tables = {}  # seq_id -> block ids, in token order
        self.tokens = {}  # seq_id -> its token ids
        self.full_blocks = {}  # tuple(tokens from the first up to the end of a full block) -> block id

    @property
    def num_free_blocks(self):
        return len(self.free_blocks)

    def _take(self):
        block = self.free_blocks.pop(0)
        self.ref_count[block] = 1
        return block

    def _register(self, seq_id, i):
        """Block i of seq_id is full: offer it to later prompts with the same tokens up to its end."""
        key = tuple(self.tokens[seq_id][:(i + 1) * self.block_size])
        self.full_blocks.setdefault(key, self.tables[seq_id][i])

    def allocate(self, seq_id, token_ids):
        bs, tokens = self.block_size, list(token_ids)
        shared = []
        for i in range(len(tokens) // bs):  # full blocks only, from the first, until one is not found
            block = self.full_blocks.get(tuple(tokens[:(i + 1) * bs]))
            if block is None:
                break
            shared.append(block)
        new = -(-len(tokens) // bs) - len(shared)
        if new > len(self.free_blocks):
            raise MemoryError(f"sequence {seq_id} needs {new} new blocks, {len(self.free_blocks)} are free")
        for block in shared:
            self.ref_count[block] += 1
        self.tables[seq_id] = shared + [self._take() for _ in range(new)]
        self.tokens[seq_id] = tokens
        for i in range(len(shared), len(tokens) // bs):
            self._register(seq_id, i)
        return self.tables[seq_id]

    def append(self, seq_id, token_id):
        tokens, table = self.tokens[seq_id], self.tables[seq_id]
        if len(tokens) == len(table) * self.block_size:  # every slot taken: the new token needs a new block
            if not self.free_blocks:
                raise MemoryError(f"no free block for sequence {seq_id}'s next token")
            table.append(self._take())
        tokens.append(token_id)
        if len(tokens) % self.block_size == 0:  # its last block just filled up
            self._register(seq_id, len(table) - 1)

    def free(self, seq_id):
        for block in self.tables.pop(seq_id):
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:  # its last user: free again, and its prefix forgotten
                self.free_blocks.append(block)
                self.full_blocks = {k: b for k, b in self.full_blocks.items() if b != block}
        del self.tokens[seq_id]


class FreesSharedBlocks(SolutionBlockTable):
    """A slip (the registered wrong answer): free returns every block, even one another sequence still uses."""

    def free(self, seq_id):
        for block in self.tables.pop(seq_id):
            if block not in self.free_blocks:
                self.ref_count[block] = 0
                self.free_blocks.append(block)
                self.full_blocks = {k: b for k, b in self.full_blocks.items() if b != block}
        del self.tokens[seq_id]


class EngineBlockTable:
    """kvlab's BlockManager behind the exercise's interface: the checker's oracle.

    The engine registers a block for reuse once its K/V is computed (``cache_full_blocks``); here a prompt's or an
    appended token's K/V counts as computed at once. Two differences from the exercise the scenarios stay clear of: the
    engine reuses at most the full blocks within a prompt's first ``len - 1`` tokens (the last prompt token is always
    computed, for its logits), and it keeps a freed block's prefix until the block is handed out again.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        from kvlab.serving.block_manager import BlockManager

        self.block_size = block_size
        self.manager = BlockManager(num_blocks, block_size, enable_prefix_caching=True)
        self.sequences: dict = {}

    @property
    def num_free_blocks(self) -> int:
        return self.manager.num_free_blocks

    @property
    def tables(self) -> dict:
        return {s: list(seq.block_table) for s, seq in self.sequences.items()}

    def allocate(self, seq_id, token_ids) -> list[int]:
        from kvlab.clocks import RequestRecord
        from kvlab.serving.sequence import SamplingParams, Sequence as EngineSequence

        seq = EngineSequence(seq_id, list(token_ids), 1, SamplingParams(),
                             RequestRecord(seq_id, len(token_ids), 1, scheduled_s=0.0), 0.0)
        if not self.manager.can_allocate(seq):
            raise MemoryError(f"not enough free blocks for sequence {seq_id}")
        self.manager.allocate(seq)
        seq.num_computed_tokens = seq.num_tokens  # its prompt's K/V written: its full blocks become reusable
        self.manager.cache_full_blocks(seq)
        self.sequences[seq_id] = seq
        return list(seq.block_table)

    def append(self, seq_id, token_id) -> None:
        seq = self.sequences[seq_id]
        seq.token_ids.append(token_id)
        if not self.manager.can_append(seq):
            seq.token_ids.pop()
            raise MemoryError(f"no free block for sequence {seq_id}'s next token")
        self.manager.append_slot(seq)
        seq.num_computed_tokens = seq.num_tokens
        self.manager.cache_full_blocks(seq)

    def free(self, seq_id) -> None:
        self.manager.free(self.sequences.pop(seq_id))


def _t(start: int, stop: int) -> list[int]:
    return list(range(start, stop))


_A = _t(0, 10)  # the shared prompt of scenario 2: two full blocks of 4 and half of a third
BLOCK_TABLE_SCENARIOS = (  # (what it exercises, num_blocks, block_size, operations)
    ("allocate, append and free", 16, 4, [
        ("allocate", 0, _t(0, 10)), ("allocate", 1, _t(100, 108)), ("allocate", 2, _t(200, 207)),
        ("append", 2, 207), ("append", 2, 208), ("append", 2, 209), ("append", 2, 210), ("append", 2, 211),
        ("append", 2, 212), ("free", 2), ("free", 0), ("free", 1)]),
    ("shared prefixes and reference counts", 16, 4, [
        ("allocate", 0, _A), ("allocate", 1, _A[:8] + _t(50, 53)), ("allocate", 2, list(_A)),
        ("allocate", 3, _t(90, 94) + _A[4:8] + _t(60, 62)),
        ("append", 0, 10), ("append", 0, 11), ("allocate", 4, _A + [10, 11, 70]),
        ("free", 0), ("free", 1), ("free", 4), ("free", 2), ("free", 3)]),
    ("a freed prefix whose blocks were handed out again", 6, 4, [
        ("allocate", 0, _t(0, 9)), ("allocate", 9, _t(500, 512)), ("free", 0), ("allocate", 1, _t(300, 312)),
        ("free", 9), ("allocate", 2, _t(0, 9)), ("free", 1), ("free", 2)]),
    ("a pool that runs out", 4, 4, [
        ("allocate", 0, _t(0, 12)), ("allocate", 1, _t(100, 108)), ("append", 0, 12), ("append", 0, 13),
        ("append", 0, 14), ("append", 0, 15), ("append", 0, 16), ("free", 0), ("allocate", 1, _t(100, 108))]),
)


def _blocks_of(table: Any) -> list:
    return list(table) if table is not None else []


def _sharing_slip(tables: dict, tokens: dict, bs: int, freed: dict) -> str | None:
    """What is wrong with the blocks the learner's live sequences share, if anything (None: all legitimate)."""
    users: dict = {}
    for s, table in tables.items():
        for i, block in enumerate(table):
            users.setdefault(block, []).append((s, i))
    for block, holders in users.items():
        for (s, i), (t, j) in ((holders[0], h) for h in holders[1:]):
            if s == t:
                return f"block {block} appears twice in sequence {s}'s table: take each new block from the free list."
            if i == j and tokens[s][:(i + 1) * bs] == tokens[t][:(i + 1) * bs]:
                if min(len(tokens[s]), len(tokens[t])) >= (i + 1) * bs:
                    continue  # a full block after the same tokens: shared as it should be
                filled = len(tokens[s]) - i * bs
                return (f"sequences {s} and {t} share block {block}, at position {i} of both tables, which is only partly filled "
                        f"({filled} of {bs} slots): each one's next token would be written into the same free "
                        "slot, over the other's. Share full blocks only; a partly filled last block is always the "
                        "sequence's own.")
            if tokens[s][i * bs:(i + 1) * bs] == tokens[t][j * bs:(j + 1) * bs]:
                return (f"sequences {s} and {t} share block {block}: it holds the same {bs} tokens in both, but after "
                        "different tokens. You matched a block by its own tokens only; its keys and values depend on "
                        "every token before it too. Look a block up by the whole prefix up to its end, from the "
                        "first token (kvlab chains the hashes: hash(parent's hash, the block's tokens)).")
            stale = any(tuple(tokens[u][:(k + 1) * bs]) in freed.get(block, ()) for u, k in ((s, i), (t, j)))
            if stale:
                return (f"sequences {s} and {t} share block {block} but hold different tokens in it: it was found under "
                        "a prefix whose last user had freed it, after the pool had handed it to another sequence. "
                        "When a block's last user frees it, drop it from your prefix lookup (or forget its prefix "
                        "when the block is taken again, as kvlab's BlockManager does).")
            return (f"sequences {s} and {t} both use block {block}, and they hold different tokens in it: a block in "
                    "use was handed out again. Take new blocks only from the free list, and put a block back only "
                    "when no sequence uses it.")
    return None


def _compare(mine: Any, oracle: EngineBlockTable, op: tuple, tokens: dict, prompts: dict, bs: int,
             freed: dict, num_blocks: int) -> str | None:
    """The learner's slip after ``op``, judged against the oracle's state; None when they agree."""
    kind, seq = op[0], op[1]
    want = oracle.tables
    try:
        tables = {s: _blocks_of(mine.tables.get(s)) for s in want}
        free = mine.num_free_blocks
    except Exception as exc:
        return f"reading tables[seq_id] or num_free_blocks raised {type(exc).__name__}: {exc}; keep the skeleton's."
    for s in want:
        got, need = len(tables[s]), len(want[s])
        if got == need:
            continue
        n = len(tokens[s])
        if kind == "append" and s == seq:
            if got > need:
                return (f"sequence {s} got a new block for its token {n} while its last block still had a free "
                        f"slot ({n - 1} tokens in {got - 1} blocks of {bs}): add a block only when the last one is "
                        "full, len(tokens) == len(table) * block_size, before storing the token.")
            return (f"token {n} of sequence {s} has no slot: {n - 1} tokens filled its {got} blocks of {bs} "
                    "exactly, so this token needs a new block (an off-by-one on a full block).")
        if got < need:
            return (f"sequence {s} holds {n} tokens in {got} blocks; it needs ceil({n} / {bs}) = {need}: the last, "
                    "partly filled block counts too.")
        if n % bs == 0:
            return (f"sequence {s}'s {n} tokens fill exactly {need} blocks of {bs}, but it holds {got}: no block is "
                    "needed for a token that has not arrived yet (append adds it when it does).")
        return f"sequence {s} holds {n} tokens in {got} blocks where ceil({n} / {bs}) = {need} are needed."
    slip = _sharing_slip(tables, tokens, bs, freed)
    if slip:
        return slip
    used = len({b for t in tables.values() for b in t})
    used_oracle = len({b for t in want.values() for b in t})
    if kind == "allocate" and used > used_oracle and seq in want:
        others = {b for s, t in want.items() if s != seq for b in t}
        should = [i for i, b in enumerate(want[seq]) if b in others]
        mine_others = {b for s, t in tables.items() if s != seq for b in t}
        did = [i for i, b in enumerate(tables[seq]) if b in mine_others]
        missing = [i for i in should if i not in did]
        owner = next(s for s, t in want.items() if s != seq and missing and len(t) > missing[0]
                     and t[missing[0]] == want[seq][missing[0]])
        if any(prompts[owner] < (i + 1) * bs for i in missing):
            return (f"sequence {seq}'s prompt starts with the {(max(should) + 1) * bs} tokens sequence {owner} holds, "
                    f"but it took new blocks for them: sequence {owner} filled its block {missing[-1]} by append, and "
                    "a block that fills up there is as reusable as a prompt's. Offer a block to later prompts as "
                    "soon as it is full, in append as in allocate.")
        return (f"sequence {seq}'s prompt starts with the same {(max(should) + 1) * bs} tokens as sequence {owner}'s "
                f"({len(should)} full blocks of {bs}), but it took {len(missing)} new blocks for them: reuse the "
                "blocks already held for that prefix, one more user on each, instead of computing the same keys "
                "and values again.")
    if kind == "free" and free > oracle.num_free_blocks:
        return (f"freeing sequence {seq} returned blocks another sequence still uses: a block goes back to the "
                "free list only when its last user frees it, or the next allocation overwrites keys and values "
                "someone still attends to. Count the users of every block (a reference count: +1 when a sequence "
                "shares it, -1 when one frees it, free at 0).")
    if kind == "free" and free < oracle.num_free_blocks:
        return (f"after freeing sequence {seq}, {oracle.num_free_blocks - free} block(s) never came back to the "
                "free list: a leak. Each of its blocks loses one user; a block with none left is free again, "
                "shared ones included once their last user leaves.")
    if free != num_blocks - used:
        return (f"num_free_blocks is {free}, but the live sequences use {used} of the {num_blocks} blocks, which "
                f"leaves {num_blocks - used}: every block is either free or in some table (take a block out of the "
                "free list when you hand it out, put it back once, when its last user frees it).")
    if free != oracle.num_free_blocks:
        return (f"num_free_blocks is {free} after {kind} of sequence {seq}; kvlab's BlockManager has "
                f"{oracle.num_free_blocks} free.")
    return None


def _run_scenario(cls: type, name: str, num_blocks: int, bs: int, ops: list) -> str | None:
    try:
        mine = cls(num_blocks, bs)
    except Exception as exc:
        return f"building {cls.__name__}(num_blocks, block_size) raised {type(exc).__name__}: {exc}."
    oracle = EngineBlockTable(num_blocks, bs)
    tokens: dict = {}
    prompts: dict = {}
    freed: dict = {}  # block -> prefixes it held when the learner's sequence using it was freed
    for op in ops:
        kind, seq = op[0], op[1]
        try:
            act: dict[str, Callable[..., Any]] = {"allocate": oracle.allocate, "append": oracle.append,
                                                  "free": oracle.free}
            act[kind](*op[1:])
            fits = True
        except MemoryError:
            fits = False
        before = (mine.num_free_blocks, _blocks_of(mine.tables.get(seq)) if hasattr(mine, "tables") else None)
        if kind == "free":
            table = _blocks_of(getattr(mine, "tables", {}).get(seq))
            for i, block in enumerate(table):
                freed.setdefault(block, set()).add(tuple(tokens[seq][:(i + 1) * bs]))
        try:
            getattr(mine, kind)(*op[1:])
            raised = None
        except Exception as exc:
            raised = exc
        context = f" (scenario '{name}', {kind} of sequence {seq})"
        if not fits:
            need = ("blocks for its prompt" if kind == "allocate" else "a new block for its next token")
            if raised is None:
                return (f"sequence {seq} needs {need} and the pool has {before[0]} free, too few, but {kind} "
                        f"went ahead{context}: raise MemoryError and change nothing.")
            if not isinstance(raised, MemoryError):
                return (f"with too few free blocks {kind} raised {type(raised).__name__}: {raised}{context}; raise "
                        "MemoryError, so the caller can tell a full pool from a bug.")
            after = (mine.num_free_blocks, _blocks_of(mine.tables.get(seq)))
            if after != before:
                return (f"{kind} raised MemoryError but had already changed the pool (free blocks {before[0]} -> "
                        f"{after[0]}){context}: check that enough blocks are free first, then take them.")
            continue
        if raised is not None:
            return f"{kind} raised {type(raised).__name__}: {raised}{context}."
        if kind == "allocate":
            tokens[seq], prompts[seq] = list(op[2]), len(op[2])
        elif kind == "append":
            tokens[seq].append(op[2])
        else:
            del tokens[seq]
        slip = _compare(mine, oracle, op, tokens, prompts, bs, freed, num_blocks)
        if slip:
            return slip + ("" if "scenario '" in slip else context)
    return None


@exercise(NOTEBOOK, kind="build", solution=SolutionBlockTable, wrong=FreesSharedBlocks,
          title="write the block table",
          question="""A block table hands out fixed-size blocks of a pool:
`allocate(seq_id, token_ids)` gives a new sequence blocks for its whole prompt, `append(seq_id,
token_id)` adds one token (a new block only when the last one is full), `free(seq_id)` ends a
sequence. Full blocks are shared: when a new prompt starts with the same tokens as a full block some
live sequence holds, from the first token to that block's end, it reuses that block instead of a new
one, and each block counts its users, so it is free again only when the last one leaves. A partly
filled block is never shared, and when the pool has too few free blocks, `allocate` and `append`
raise `MemoryError` and change nothing. The checker runs scripted scenarios on your class and on
kvlab's own `BlockManager`, and after every call compares each live sequence's number of blocks,
which blocks are shared, and `num_free_blocks` (block ids may differ; it reads `tables` and
`num_free_blocks`).""",
          code='''class MyBlockTable:
    """Fixed-size KV blocks for sequences; full prefix blocks shared, counted by reference."""

''' + method_source(SolutionBlockTable, "__init__", "num_free_blocks") + '''

    def allocate(self, seq_id, token_ids):
        """Blocks for a new sequence's prompt, reusing full blocks held for the same prefix."""
        # TODO: look up the prompt's full blocks in self.full_blocks, from the first, until one is missing;
        #       raise MemoryError if the rest do not fit the free list; one more user on each reused block,
        #       new blocks for the rest; register the prompt's other full blocks in self.full_blocks
        self.tables[seq_id], self.tokens[seq_id] = [], list(token_ids)

    def append(self, seq_id, token_id):
        """One more token: a new block only when the last one is full."""
        # TODO: a new block (or MemoryError) when every slot of the table is taken; store the token;
        #       register the last block once it is full
        self.tokens[seq_id].append(token_id)

    def free(self, seq_id):
        """The sequence ends: each of its blocks loses a user; a block with none left is free again."""
        # TODO: and forget the prefix of a block that becomes free: its next owner writes other tokens into it
        del self.tables[seq_id], self.tokens[seq_id]


check_block_table(MyBlockTable)''',
          explanation=solution_code(SolutionBlockTable, "allocate", "_take", "_register", "append", "free") + """
kvlab's `BlockManager` (`kvlab/serving/block_manager.py`) does the same with two refinements from
vLLM: a block is named by a chain hash, `hash(parent's hash, its tokens)`, instead of the whole
prefix, and a freed block keeps its prefix while it waits in the free list, least recently used
handed out first, so a later prompt can still find it. It also reuses at most the full blocks within
a prompt's first `len − 1` tokens: the last prompt token is computed anyway, for its logits (the
scenarios never depend on that). The slips the checker names: one block too few or too many for a
prompt, a new block one token early or late, a partly filled block shared, a block matched by its
own tokens without its prefix, a block freed while another sequence still uses it, a leak after
free, a prefix found again after its block was handed out, and a `MemoryError` raised too late.""")
def check_block_table(cls: Any) -> Feedback:
    """Run the learner's block table and kvlab's BlockManager through the same scenarios; name the first slip."""
    if not isinstance(cls, type):
        return wrong(f"pass the class itself, check_block_table(MyBlockTable), not {type(cls).__name__} "
                     f"{str(cls)[:40]!r}.")
    calls = 0
    for name, num_blocks, bs, ops in BLOCK_TABLE_SCENARIOS:
        slip = _run_scenario(cls, name, num_blocks, bs, ops)
        if slip:
            return wrong(slip)
        calls += len(ops)
    return right(f"after each of {calls} calls in {len(BLOCK_TABLE_SCENARIOS)} scenarios your tables match kvlab's "
                 "BlockManager: the same number of blocks per sequence, the same blocks shared, the same free "
                 "count. Sharing a prefix's blocks is what prefix caching saves: their keys and values are stored "
                 "and computed once.")
