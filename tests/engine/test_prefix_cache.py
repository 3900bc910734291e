"""Prefix caching: shared system prompts and earlier turns come from the cache, and outputs don't change."""

import pytest

from engine import Engine, EngineConfig, SamplingParams

SYSTEM = " ".join(f"Rule {i}: answer briefly and kindly, citing the paged cache block {i}." for i in range(30))
GREEDY = SamplingParams(max_tokens=24, temperature=0.0)


@pytest.fixture(scope="module")
def engines(tiny_llama):
    on = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=512))
    off = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=512, enable_prefix_caching=False))
    return on, off


def chat(system, *turns):
    messages = [{"role": "system", "content": system}]
    for i, text in enumerate(turns):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return messages


def test_second_conversation_gets_the_system_prompt_from_cache(engines):
    engine, _ = engines
    first = chat(SYSTEM, "What is a block?")
    prompt_len = len(engine.encode_prompt(first))
    system_len = len(engine.encode_prompt([{"role": "system", "content": SYSTEM}]))
    assert system_len > 400
    out1 = engine.generate([first], GREEDY)[0]
    assert out1.metrics.cached_prompt_tokens == 0 and out1.metrics.prompt_tokens == prompt_len
    out2 = engine.generate([chat(SYSTEM, "And what is a token?")], GREEDY)[0]
    block = engine.block_size
    assert out2.metrics.cached_prompt_tokens >= (system_len // block - 1) * block
    assert engine.stats().cached_prompt_tokens_total == out2.metrics.cached_prompt_tokens


def test_turn_two_reuses_turn_one_and_its_reply(engines):
    engine, _ = engines
    turn1 = chat(SYSTEM, "Tell me about rivers.")
    reply = engine.generate([turn1], SamplingParams(max_tokens=40, temperature=0.0))[0]
    turn2 = chat(SYSTEM, "Tell me about rivers.", reply.text, "And mountains?")
    out = engine.generate([turn2], GREEDY)[0]
    assert out.metrics.cached_prompt_tokens >= 0.9 * out.metrics.prompt_tokens


def test_outputs_are_identical_with_prefix_caching_on_and_off(engines):
    on, off = engines
    convs = [chat(SYSTEM, q) for q in ("One?", "Two?", "Three, please?", "Four?")]
    first_on = on.generate(convs[:2], GREEDY)
    later_on = on.generate(convs, GREEDY)  # all four now find the system prompt cached
    first_off = off.generate(convs[:2], GREEDY)
    later_off = off.generate(convs, GREEDY)
    assert sum(o.metrics.cached_prompt_tokens for o in later_on) > 0
    assert all(o.metrics.cached_prompt_tokens == 0 for o in later_off)
    assert [o.token_ids for o in first_on] == [o.token_ids for o in first_off]
    assert [o.token_ids for o in later_on] == [o.token_ids for o in later_off]
    assert [o.token_ids for o in later_on[:2]] == [o.token_ids for o in first_on]


def test_hit_rate_and_shared_blocks_are_reported(engines):
    engine, _ = engines
    a = engine.add_request(chat(SYSTEM, "Shared one"), GREEDY)
    engine.step()
    b = engine.add_request(chat(SYSTEM, "Shared two"), GREEDY)
    engine.step()
    stats = engine.stats()
    assert stats.kv_blocks_shared > 0
    assert 0.0 < stats.prefix_hit_rate <= 1.0
    engine.abort(a)
    engine.abort(b)
    engine.step()
    assert engine.stats().kv_blocks_used == 0
