"""Checks of the block manager's bookkeeping, and a model of the KV pool's contents for property tests.

``FakeKV`` stands for the KV tensors: one value per slot of every block, written through a block table the way
the runner writes K/V through its slot mapping. A test that writes each token's id as its "K/V" can then read
a sequence back through its block table and see whether the cache would have served the right context.
"""

from __future__ import annotations

from collections import Counter

from engine.serving.block_manager import ROOT_HASH, BlockManager, chain_hash

UNWRITTEN = None


class FakeKV:
    """What each slot of each block holds: the token whose K/V was last written there."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.slots: list[list[int | None]] = [[UNWRITTEN] * block_size for _ in range(num_blocks)]

    def write(self, block_table: list[int], start: int, token_ids: list[int]) -> None:
        """Write ``token_ids`` at positions ``start, start + 1, ...`` of the sequence that owns ``block_table``."""
        for position, token in enumerate(token_ids, start):
            block_id, slot = self.locate(block_table, position)
            self.slots[block_id][slot] = token

    def read(self, block_table: list[int], end: int) -> list[int | None]:
        """The values at positions ``0 .. end - 1`` of the sequence that owns ``block_table``."""
        return [self.slots[block_id][slot] for block_id, slot in (self.locate(block_table, p) for p in range(end))]

    def locate(self, block_table: list[int], position: int) -> tuple[int, int]:
        """The block and the slot in it that hold ``position``."""
        return block_table[position // self.block_size], position % self.block_size


def hash_chain(token_ids: list[int], block_size: int, num_blocks: int) -> list[bytes]:
    """The prefix-cache keys of the first ``num_blocks`` full blocks of ``token_ids``, computed from scratch."""
    keys, parent = [], ROOT_HASH
    for index in range(num_blocks):
        parent = chain_hash(parent, tuple(token_ids[index * block_size : (index + 1) * block_size]))
        keys.append(parent)
    return keys


def check_pool(bm: BlockManager, tables: list[list[int]], kv: FakeKV | None = None) -> None:
    """Assert every invariant of ``bm`` given the block tables of all live sequences (and the KV contents)."""
    _check_references(bm, tables)
    _check_partition(bm)
    _check_prefix_cache(bm, kv)


def _check_references(bm: BlockManager, tables: list[list[int]]) -> None:
    holders = Counter()
    for table in tables:
        assert len(set(table)) == len(table), f"a block table holds a block twice: {table}"
        holders.update(table)
    for block in bm.blocks:
        assert block.ref_count >= 0, f"block {block.block_id} has ref count {block.ref_count}"
        assert block.ref_count == holders[block.block_id], (
            f"block {block.block_id}: ref count {block.ref_count} but {holders[block.block_id]} live tables hold it"
        )


def _check_partition(bm: BlockManager) -> None:
    """Every block is exactly one of referenced, cached (evictable) or free, and the counts agree."""
    free, evictable = list(bm._free), list(bm._evictable)
    referenced = {block.block_id for block in bm.blocks if block.ref_count > 0}
    assert len(set(free)) == len(free), f"the free list holds a block twice: {free}"
    assert not referenced & set(free), f"referenced blocks in the free list: {referenced & set(free)}"
    assert not referenced & set(evictable), f"referenced blocks are evictable: {referenced & set(evictable)}"
    assert not set(free) & set(evictable), f"blocks both free and evictable: {set(free) & set(evictable)}"
    assert referenced | set(free) | set(evictable) == set(range(bm.num_blocks)), "a block is lost to the pool"
    counts = bm.counts()
    assert counts.used + counts.cached + counts.free == counts.total == bm.num_blocks
    assert (counts.used, counts.cached, counts.free) == (len(referenced), len(evictable), len(free))
    assert counts.shared == sum(1 for block in bm.blocks if block.ref_count > 1)
    assert bm.num_available == len(free) + len(evictable)
    for block_id in free:
        assert bm.blocks[block_id].hash is None, f"free block {block_id} still carries a prefix-cache key"


def _check_prefix_cache(bm: BlockManager, kv: FakeKV | None) -> None:
    """Every key names the block that holds it, recomputes from the block's tokens, and (with ``kv``) its KV."""
    if not bm.enable_prefix_caching:
        assert not bm._by_hash, "prefix caching is off but blocks were registered"
    for key, block_id in bm._by_hash.items():
        block = bm.blocks[block_id]
        assert block.hash == key, f"key of block {block_id} is not the one it is registered under"
        assert len(block.token_ids) == bm.block_size, f"block {block_id} is registered but not full"
        assert chain_hash(block.parent_hash, block.token_ids) == key, f"block {block_id}'s key does not recompute"
        if kv is not None:
            assert kv.slots[block_id] == list(block.token_ids), (
                f"block {block_id} is cached as {block.token_ids} but its KV holds {kv.slots[block_id]}"
            )
    for block in bm.blocks:
        if block.hash is not None:
            assert bm._by_hash.get(block.hash) == block.block_id, f"block {block.block_id} has a stale key"
    for block_id in bm._evictable:
        assert bm.blocks[block_id].hash is not None, f"evictable block {block_id} holds no prefix"
