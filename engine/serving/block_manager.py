"""Paged KV-cache bookkeeping: block allocation, ref counts and the prefix cache. Pure Python, no torch.

A block holds the K/V of ``block_size`` consecutive tokens of one sequence. Blocks are shared by ref count.
A *full* block whose K/V has been computed is registered in the prefix cache under a hash chained over
every token before it, so a later sequence that starts with the same tokens reuses it instead of computing
it again. When its last reference goes, a hashed block keeps its contents and becomes *cached*: still
reusable, but evicted least-recently-used when a fresh block is needed.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass, field

ROOT_HASH = b""


def chain_hash(parent: bytes, token_ids: tuple[int, ...]) -> bytes:
    """The prefix-cache key of a full block: a digest of its parent's key and its own token ids."""
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


@dataclass(slots=True)
class Block:
    """One block of the pool and what the prefix cache knows about its contents."""

    block_id: int
    ref_count: int = 0
    hash: bytes | None = None
    parent_hash: bytes | None = None
    token_ids: tuple[int, ...] = ()
    draft_ok: bool = False  # the draft model's KV of every position is in place too (.draft_model)

    def holds(self, parent_hash: bytes, token_ids: tuple[int, ...]) -> bool:
        """True when this block's stored tokens are exactly ``token_ids`` after ``parent_hash``."""
        return self.parent_hash == parent_hash and self.token_ids == token_ids

    def forget(self) -> None:
        self.hash = None
        self.parent_hash = None
        self.token_ids = ()
        self.draft_ok = False


@dataclass(slots=True)
class BlockCounts:
    """A snapshot of the pool. ``used + cached + free == total``."""

    total: int
    used: int
    cached: int
    free: int
    shared: int


@dataclass(frozen=True, slots=True)
class NewBlock:
    """A block just registered in the prefix cache: where it is and what it holds."""

    block_id: int
    hash: bytes
    parent: bytes
    token_ids: tuple[int, ...]


@dataclass(slots=True)
class PrefixMatch:
    """Blocks found in the prefix cache for the start of a prompt (references already taken)."""

    block_ids: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)


class BlockManager:
    """Owns the pool of KV blocks: who uses which block, and which freed blocks still hold a prefix."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0, hashed; oldest first
        self._by_hash: dict[bytes, int] = {}
        self._touched = bytearray(num_blocks)  # 1 for a block some sequence has written (its memory is mapped)
        self.num_touched = 0
        self._freed_touched: set[int] = set()  # free blocks whose memory may still be mapped (see take_releasable)
        self._num_used = 0
        self._num_shared = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_available(self) -> int:
        """Blocks that an allocation can take now: free ones plus evictable cached ones."""
        return len(self._free) + len(self._evictable)

    @property
    def num_fresh(self) -> int:
        """Free blocks holding no cached prefix: taking one loses nothing."""
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        """How many blocks hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def counts(self) -> BlockCounts:
        """Used (referenced), cached (reusable), free and shared block counts."""
        return BlockCounts(
            total=self.num_blocks,
            used=self._num_used,
            cached=len(self._evictable),
            free=len(self._free),
            shared=self._num_shared,
        )

    # -- prefix cache -------------------------------------------------------------------------------

    def match_prefix(self, token_ids: list[int]) -> PrefixMatch:
        """Take references on the cached blocks that cover the start of ``token_ids``.

        The last token is never covered: the model must compute at least one position to give logits.
        """
        match = PrefixMatch()
        if not self.enable_prefix_caching:
            return match
        parent = ROOT_HASH
        for start in range(0, len(token_ids) - 1 - self.block_size + 1, self.block_size):
            tokens = tuple(token_ids[start : start + self.block_size])
            key = chain_hash(parent, tokens)
            block_id = self.take_cached(key, parent, tokens)
            if block_id is None:
                break
            match.block_ids.append(block_id)
            match.hashes.append(key)
            parent = key
        return match

    def take_cached(self, key: bytes, parent: bytes, token_ids: tuple[int, ...]) -> int | None:
        """A reference on the cached block ``key`` if it holds exactly ``token_ids`` after ``parent``, else None."""
        block_id = self._by_hash.get(key)
        if block_id is None or not self.blocks[block_id].holds(parent, token_ids):
            return None
        self._take_ref(block_id)
        return block_id

    def register(self, block_id: int, key: bytes, parent: bytes, token_ids: tuple[int, ...]) -> bool:
        """Put block ``block_id`` (full, its K/V in place) in the prefix cache under ``key``; False when the key
        is taken already (another block holds that prefix) or the block has one."""
        block = self.blocks[block_id]
        if block.hash is not None or key in self._by_hash:
            return False
        block.hash, block.parent_hash, block.token_ids = key, parent, token_ids
        self._by_hash[key] = block_id
        return True

    def commit_full_blocks(
        self, block_table: list[int], hashes: list[bytes], token_ids: list[int], num_computed: int
    ) -> list[NewBlock]:
        """Register every block of ``block_table`` that is full and computed but not yet hashed; returns the
        blocks this put in the prefix cache.

        ``hashes`` is the sequence's hash chain so far; it is extended in place.
        """
        if not self.enable_prefix_caching:
            return []
        registered = []
        num_full = min(num_computed // self.block_size, len(block_table))
        for index in range(len(hashes), num_full):
            parent = hashes[-1] if hashes else ROOT_HASH
            start = index * self.block_size
            tokens = tuple(token_ids[start : start + self.block_size])
            key = chain_hash(parent, tokens)
            hashes.append(key)
            # a block already cached (another sequence computed the same prefix first) is not registered again
            if self.register(block_table[index], key, parent, tokens):
                registered.append(NewBlock(block_table[index], key, parent, tokens))
        return registered

    # -- allocation ---------------------------------------------------------------------------------

    def allocate(self, block_table: list[int], num_tokens: int) -> bool:
        """Grow ``block_table`` in place to hold ``num_tokens`` tokens; False (and no change) if it can't."""
        missing = self.blocks_for(num_tokens) - len(block_table)
        if missing > self.num_available:
            return False
        for _ in range(missing):
            block_table.append(self._take_fresh())
        return True

    def free(self, block_table: list[int]) -> None:
        """Drop a sequence's references. Its last blocks go first, so its prefix is evicted last."""
        for block_id in reversed(block_table):
            self._drop_ref(block_id)
        block_table.clear()

    def take_releasable(self) -> list[int]:
        """The free blocks still holding memory (written once, free now), counted as untouched from here on: the
        engine gives their pages back to the system (:func:`.kv_cache.release_pages`)."""
        blocks = [b for b in self._freed_touched if self.blocks[b].ref_count == 0 and self.blocks[b].hash is None
                  and self._touched[b]]
        for block_id in blocks:
            self._touched[block_id] = 0
            self.num_touched -= 1
        self._freed_touched.clear()
        return blocks

    # -- internals ----------------------------------------------------------------------------------

    def _take_fresh(self) -> int:
        if self._free:
            block_id = self._free.popleft()
            if not self._touched[block_id]:
                self._touched[block_id] = 1
                self.num_touched += 1
        else:
            block_id, _ = self._evictable.popitem(last=False)
            block = self.blocks[block_id]
            if self._by_hash.get(block.hash) == block_id:
                del self._by_hash[block.hash]
            block.forget()
        self.blocks[block_id].ref_count = 1
        self._num_used += 1
        return block_id

    def _take_ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._evictable[block_id]
            self._num_used += 1
        elif block.ref_count == 1:
            self._num_shared += 1
        block.ref_count += 1

    def _drop_ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count <= 0:
            raise RuntimeError(f"block {block_id} freed more often than it was taken")
        block.ref_count -= 1
        if block.ref_count == 1:
            self._num_shared -= 1
        elif block.ref_count == 0:
            self._num_used -= 1
            if block.hash is not None and self._by_hash.get(block.hash) == block_id:
                self._evictable[block_id] = None
            else:
                block.forget()
                self._free.append(block_id)
                self._freed_touched.add(block_id)
