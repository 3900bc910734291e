"""Checks on the KV pool that several engine tests share."""


def assert_preempted_cached_and_drained(stats) -> None:
    """The run preempted and hit the prefix cache, and once every request ended no block is in use and the pool's
    counts add up."""
    assert stats.num_preempted_total > 0 and stats.cached_prompt_tokens_total > 0
    assert stats.kv_blocks_used == 0
    assert stats.kv_blocks_used + stats.kv_blocks_cached + stats.kv_blocks_free == stats.kv_blocks_total
