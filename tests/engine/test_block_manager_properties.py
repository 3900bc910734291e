"""Property tests of the block manager: random traffic of several sequences, every invariant after every step.

A state machine plays sequences that match the prefix cache, grow, compute tokens (writing them into a model of
the KV pool), register their full blocks, and free them, plus hogs that force cached blocks to be evicted and
overwritten. After each step the pool's bookkeeping must be consistent, and every block the prefix cache hands
out must hold exactly the tokens it is served for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.serving.block_manager import BlockManager
from tests.helpers.paged_kv import FakeKV, check_pool, hash_chain

TOKENS = st.integers(0, 2)  # a tiny vocabulary, so blocks collide often
STEMS = ([], [0, 1, 2, 0, 1, 2, 0, 1], [2, 2, 1, 1, 0, 0, 2, 2, 1, 1, 0, 0])  # shared system prompts
PROMPTS = st.builds(lambda stem, tail: stem + tail, st.sampled_from(STEMS), st.lists(TOKENS, min_size=1, max_size=8))
CACHING = (True, True, True, False)  # prefix caching mostly on: that is where the bookkeeping is subtle
HOG_TOKEN = -1  # what a hog writes: never a prompt token, so a stale block served from cache shows up


@dataclass
class Holder:
    """A test sequence: its tokens, how many of them are in the KV cache, its block table and hash chain."""

    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_computed: int = 0

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed


class BlockManagerMachine(RuleBasedStateMachine):
    """Random traffic on one pool; ``check_pool`` runs after every rule."""

    @initialize(num_blocks=st.integers(4, 16), block_size=st.integers(1, 4), caching=st.sampled_from(CACHING))
    def make_pool(self, num_blocks: int, block_size: int, caching: bool) -> None:
        self.bm = BlockManager(num_blocks, block_size, enable_prefix_caching=caching)
        self.kv = FakeKV(num_blocks, block_size)
        self.holders: list[Holder] = []

    def pick(self, index: int) -> Holder:
        """A live sequence chosen by a drawn index (any integer: it wraps)."""
        return self.holders[index % len(self.holders)]

    @rule(token_ids=PROMPTS)
    def admit(self, token_ids: list[int]) -> None:
        """A new sequence takes the cached prefix of its prompt; the blocks it gets must hold that prefix."""
        match = self.bm.match_prefix(token_ids)
        bs = self.bm.block_size
        # Held before checking, so that a failed check is reported as itself rather than as a leak at teardown.
        self.holders.append(Holder(list(token_ids), match.block_ids, match.hashes, len(match.block_ids) * bs))
        assert len(match.block_ids) * bs < len(token_ids), "the last prompt token was served from cache"
        assert match.hashes == hash_chain(token_ids, bs, len(match.block_ids))
        assert self.kv.read(match.block_ids, len(match.block_ids) * bs) == token_ids[: len(match.block_ids) * bs]
        if not self.bm.enable_prefix_caching:
            assert match.block_ids == []
        if match.block_ids:
            event("prefix hit")

    @precondition(lambda self: self.holders)
    @rule(index=st.integers(0, 15), token_ids=st.lists(TOKENS, min_size=1, max_size=6))
    def grow(self, index: int, token_ids: list[int]) -> None:
        """A sequence gains tokens (generated ones, or the next turn of a conversation); none are computed yet."""
        self.pick(index).token_ids.extend(token_ids)

    @precondition(lambda self: any(h.num_uncomputed for h in self.holders))
    @rule(index=st.integers(0, 15), num_tokens=st.integers(1, 12))
    def compute(self, index: int, num_tokens: int) -> None:
        """Allocate blocks for the next tokens of a sequence and write their KV, as a forward pass does."""
        holder = self.pick(index)
        num_tokens = min(num_tokens, holder.num_uncomputed)
        if num_tokens:
            self._compute(holder, num_tokens)

    def _compute(self, holder: Holder, num_tokens: int) -> bool:
        end = holder.num_computed + num_tokens
        missing = self.bm.blocks_for(end) - len(holder.block_table)
        free_before, available_before = len(self.bm._free), self.bm.num_available
        table_before = list(holder.block_table)
        allocated = self.bm.allocate(holder.block_table, end)
        assert allocated == (missing <= available_before)
        if not allocated:
            assert holder.block_table == table_before, "a failed allocation changed the block table"
            event("allocation refused")
            return False
        if missing > free_before:
            event("allocation evicted cached blocks")
        self._write(holder, end)
        return True

    def _write(self, holder: Holder, end: int) -> None:
        """Write tokens ``num_computed .. end - 1``; a block being written must be exclusive and unregistered."""
        for position in range(holder.num_computed, end):
            block = self.bm.blocks[self.kv.locate(holder.block_table, position)[0]]
            assert block.ref_count == 1, f"writing into block {block.block_id} that others hold too"
            assert block.hash is None, f"writing into block {block.block_id} that the prefix cache serves"
        self.kv.write(holder.block_table, holder.num_computed, holder.token_ids[holder.num_computed : end])
        holder.num_computed = end

    @precondition(lambda self: self.holders)
    @rule(index=st.integers(0, 15))
    def commit(self, index: int) -> None:
        """Register a sequence's full computed blocks; its hash chain must then cover exactly those blocks."""
        holder = self.pick(index)
        self.bm.commit_full_blocks(holder.block_table, holder.block_hashes, holder.token_ids, holder.num_computed)
        bs = self.bm.block_size
        expected = min(holder.num_computed // bs, len(holder.block_table)) if self.bm.enable_prefix_caching else 0
        assert holder.block_hashes == hash_chain(holder.token_ids, bs, max(expected, len(holder.block_hashes)))
        assert len(holder.block_hashes) >= expected

    @precondition(lambda self: self.holders)
    @rule(index=st.integers(0, 15))
    def free(self, index: int) -> None:
        """A sequence ends: its references go, and its registered blocks stay cached."""
        holder = self.holders.pop(index % len(self.holders))
        self.bm.free(holder.block_table)
        assert holder.block_table == []

    @precondition(lambda self: self.holders)
    @rule(index=st.integers(0, 15), token_ids=st.lists(TOKENS, min_size=1, max_size=6))
    def follow_up(self, index: int, token_ids: list[int]) -> None:
        """The next turn of a conversation: a new sequence whose prompt re-sends a live one's tokens and more."""
        self.admit(self.pick(index).token_ids + token_ids)

    @precondition(lambda self: any(h.num_uncomputed for h in self.holders))
    @rule(index=st.integers(0, 15))
    def prefill(self, index: int) -> None:
        """Compute every remaining token of a sequence and register its full blocks, as one whole prefill."""
        holder = self.pick(index)
        if holder.num_uncomputed and self._compute(holder, holder.num_uncomputed):
            self.commit(index)

    @rule(token_ids=PROMPTS)
    def visit(self, token_ids: list[int]) -> None:
        """A whole short request: admitted, prefilled, registered and freed, leaving its prefix cached."""
        self.admit(token_ids)
        holder = self.holders[-1]
        if self._compute(holder, holder.num_uncomputed):
            self.commit(len(self.holders) - 1)
        self.free(len(self.holders) - 1)

    @rule(num_blocks=st.integers(1, 8), keep=st.booleans())
    def hog(self, num_blocks: int, keep: bool) -> None:
        """Eviction pressure: a sequence of junk tokens takes fresh blocks (evicting cached ones) and fills them."""
        holder = Holder([HOG_TOKEN] * num_blocks * self.bm.block_size)
        if self._compute(holder, len(holder.token_ids)):
            if keep:
                self.holders.append(holder)
            else:
                self.bm.free(holder.block_table)

    @invariant()
    def pool_is_consistent(self) -> None:
        check_pool(self.bm, [holder.block_table for holder in self.holders], self.kv)

    def teardown(self) -> None:
        """Freeing every sequence leaves nothing used, whatever happened before."""
        if not hasattr(self, "bm"):
            return
        for holder in self.holders:
            self.bm.free(holder.block_table)
        check_pool(self.bm, [], self.kv)
        assert self.bm.counts().used == 0


BlockManagerMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_block_manager_state_machine = BlockManagerMachine.TestCase
