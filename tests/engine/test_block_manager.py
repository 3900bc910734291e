"""The block manager by itself: ref counts, the prefix-cache hash chain, LRU eviction, the invariant."""

import random

import pytest

from engine.serving.block_manager import ROOT_HASH, BlockManager, chain_hash

BS = 4


def full_counts(bm):
    c = bm.counts()
    assert c.used + c.cached + c.free == c.total
    return c


def admit(bm, tokens):
    """Match the cached prefix, allocate the rest, mark everything computed (as a finished prefill)."""
    match = bm.match_prefix(tokens)
    table, hashes = match.block_ids, match.hashes
    cached_tokens = len(table) * BS
    assert bm.allocate(table, len(tokens))
    bm.commit_full_blocks(table, hashes, tokens, len(tokens))
    return table, hashes, cached_tokens


def test_allocate_and_free_counts():
    bm = BlockManager(8, BS)
    table = []
    assert bm.allocate(table, 9)  # 3 blocks
    assert len(table) == 3 and full_counts(bm).used == 3
    assert bm.allocate(table, 12)  # still 3 blocks
    assert len(table) == 3
    bm.free(table)
    assert table == [] and full_counts(bm).free == 8


def test_allocate_fails_without_change_when_pool_is_short():
    bm = BlockManager(4, BS)
    a, b = [], []
    assert bm.allocate(a, 12)
    assert not bm.allocate(b, 8)
    assert b == [] and full_counts(bm).used == 3


def test_prefix_reuse_takes_references_and_counts_shared():
    bm = BlockManager(16, BS)
    tokens = list(range(11))  # two full blocks and a partial one
    t1, _, cached1 = admit(bm, tokens)
    assert cached1 == 0
    t2, _, cached2 = admit(bm, tokens)
    assert cached2 == 8 and t2[:2] == t1[:2] and t2[2] != t1[2]
    c = full_counts(bm)
    assert c.shared == 2 and c.used == 4
    assert bm.blocks[t1[0]].ref_count == 2


def test_last_token_is_never_served_from_cache():
    bm = BlockManager(16, BS)
    tokens = list(range(8))  # exactly two full blocks
    admit(bm, tokens)
    match = bm.match_prefix(tokens)
    assert len(match.block_ids) == 1  # the block holding the last token is recomputed


def test_chain_depends_on_everything_before_the_block():
    bm = BlockManager(16, BS)
    admit(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    match = bm.match_prefix([0, 2, 3, 4, 5, 6, 7, 8, 9])  # same second block, different first one
    assert match.block_ids == []


def test_hash_collision_is_caught_by_stored_tokens():
    bm = BlockManager(16, BS)
    table, hashes, _ = admit(bm, [1, 2, 3, 4, 5])
    # Forge a collision: map the key of other tokens onto the existing block.
    other = (9, 9, 9, 9)
    bm._by_hash[chain_hash(ROOT_HASH, other)] = table[0]
    assert bm.match_prefix(list(other) + [1]).block_ids == []


def test_freed_hashed_blocks_stay_cached_and_are_reused():
    bm = BlockManager(8, BS)
    tokens = list(range(9))
    table, _, _ = admit(bm, tokens)
    first_two = table[:2]
    bm.free(table)
    c = full_counts(bm)
    assert c.cached == 2 and c.used == 0 and c.free == 6
    again, _, cached = admit(bm, tokens)
    assert cached == 8 and again[:2] == first_two
    assert full_counts(bm).cached == 0


def test_eviction_is_least_recently_used_and_prefix_goes_last():
    bm = BlockManager(6, BS)
    a, _, _ = admit(bm, list(range(100, 109)))  # blocks a0 a1 (hashed) + a partial one
    bm.free(a)
    b, _, _ = admit(bm, list(range(200, 209)))
    bm.free(b)
    # Cached, least recent first: a1 a0 b1 b0 (a sequence's tail is freed first). Two blocks are free.
    assert full_counts(bm).cached == 4 and full_counts(bm).free == 2
    table = []
    assert bm.allocate(table, 12)  # takes the 2 free blocks, then evicts a1
    assert len(bm.match_prefix(list(range(100, 109))).block_ids) == 1  # a0 survived
    assert len(bm.match_prefix(list(range(200, 209))).block_ids) == 2


def test_generated_blocks_are_hashed_as_they_fill():
    bm = BlockManager(16, BS)
    tokens = [5, 6, 7]
    table, hashes = [], []
    for step in range(10):  # decode one token at a time
        assert bm.allocate(table, len(tokens))
        bm.commit_full_blocks(table, hashes, tokens, len(tokens))
        tokens.append(100 + step)
    assert len(hashes) == len(tokens[:-1]) // BS
    # A new request that re-sends the whole exchange finds it cached.
    assert len(bm.match_prefix(tokens + [1]).block_ids) == len(hashes)


def test_no_prefix_caching_means_no_reuse():
    bm = BlockManager(16, BS, enable_prefix_caching=False)
    tokens = list(range(9))
    table, _, _ = admit(bm, tokens)
    bm.free(table)
    assert full_counts(bm).cached == 0
    assert bm.match_prefix(tokens).block_ids == []


def test_double_free_is_an_error():
    bm = BlockManager(4, BS)
    table = []
    bm.allocate(table, 1)
    block = table[0]
    bm.free(table)
    with pytest.raises(RuntimeError):
        bm.free([block])


def test_invariant_holds_under_random_traffic():
    rng = random.Random(7)
    bm = BlockManager(24, BS)
    live = []
    prefixes = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    for _ in range(500):
        if live and rng.random() < 0.4:
            table = live.pop(rng.randrange(len(live)))
            bm.free(table)
        else:
            tokens = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
            match = bm.match_prefix(tokens)
            table, hashes = match.block_ids, match.hashes
            if bm.allocate(table, len(tokens)):
                bm.commit_full_blocks(table, hashes, tokens, len(tokens))
                live.append(table)
            else:
                bm.free(table)
        c = full_counts(bm)
        refs = sum(b.ref_count for b in bm.blocks)
        assert refs == sum(len(t) for t in live)
        assert c.used == sum(1 for b in bm.blocks if b.ref_count > 0)
        assert c.shared == sum(1 for b in bm.blocks if b.ref_count > 1)
    for table in live:
        bm.free(table)
    assert full_counts(bm).used == 0
