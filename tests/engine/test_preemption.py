"""A pool too small for every request at once: preemption by recompute, same outputs, nothing leaked."""

from engine import Engine, EngineConfig, SamplingParams


def long_prompts(engine, n=8):
    return [
        engine.encode_prompt(" ".join(f"item {i}-{j} in the list of things to remember" for j in range(30)))[:260]
        for i in range(n)
    ]


def test_small_pool_preempts_and_still_matches_a_large_pool(tiny_llama):
    params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    small = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=40, block_size=16))
    large = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=1024, block_size=16))
    prompts = long_prompts(small)
    assert all(len(p) == 260 for p in prompts)
    got = small.generate(prompts, params)
    want = large.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 64 for o in got)
    stats = small.stats()
    assert stats.num_preempted_total > 0
    assert stats.kv_blocks_used == 0
    assert large.stats().num_preempted_total == 0
