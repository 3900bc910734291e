"""Request life cycle: abort, refusal of what can't fit, stop strings and token ids, seeds, stats."""

import random

import pytest

from engine import Engine, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=128, max_model_len=512))


def drain(engine):
    finals = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


def test_abort_mid_stream_frees_blocks_at_once(engine):
    rid = engine.add_request("a long story about paged caches", SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(3):
        engine.step()
    assert engine.stats().kv_blocks_used > 0
    engine.abort(rid)
    assert engine.stats().kv_blocks_used == 0
    (out,) = engine.step()
    assert out.finished and out.finish_reason == "abort" and len(out.token_ids) == 3
    assert not engine.has_unfinished()


def test_too_long_request_is_refused_and_others_carry_on(engine):
    ok = engine.add_request("short and fine", SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    too_long = engine.add_request("hello " * 600, SamplingParams(max_tokens=8))
    too_many = engine.add_request("hello", SamplingParams(max_tokens=600))
    finals = drain(engine)
    for rid in (too_long, too_many):
        assert finals[rid].finish_reason == "error"
        assert "context of 512" in finals[rid].error
    assert finals[ok].finish_reason == "length" and len(finals[ok].token_ids) == 8


def test_request_larger_than_the_pool_is_refused(tiny_llama):
    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=4, block_size=16))
    (out,) = engine.generate(["x " * 60], SamplingParams(max_tokens=10))
    assert out.finish_reason == "error" and "whole pool holds 64" in out.error


def test_empty_prompt_is_refused(engine):
    (out,) = engine.generate([[]], SamplingParams(max_tokens=4))
    assert out.finish_reason == "error" and "empty" in out.error


def test_out_of_vocabulary_token_ids_are_rejected(engine):
    with pytest.raises(ValueError, match="token ids"):
        engine.add_request([1, 2, 10**9])


def test_stop_string_ends_the_reply_and_is_not_shown(engine):
    prompt = "the river and the mountain"
    (free,) = engine.generate([prompt], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    text = free.text
    assert len(text) > 10
    stop = text[6:9]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True, stop=(stop,))
    rid = engine.add_request(prompt, params)
    deltas, final = [], None
    while engine.has_unfinished():
        for out in engine.step():
            deltas.append(out.delta_text)
            final = out
    assert final.request_id == rid and final.finish_reason == "stop"
    assert final.text == text[: text.index(stop)]
    assert "".join(deltas) == final.text
    assert stop not in final.text


def test_stop_token_id_ends_the_reply(engine):
    (free,) = engine.generate(["count with me"], SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    target = free.token_ids[4]
    first = free.token_ids.index(target)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, stop_token_ids=(target,))
    (out,) = engine.generate(["count with me"], params)
    assert out.finish_reason == "stop" and out.token_ids == free.token_ids[: first + 1]


def test_same_seed_same_text_whatever_else_is_in_the_batch(engine):
    seeded = SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=1234, ignore_eos=True)
    (alone,) = engine.generate(["tell me something"], seeded)
    noise = [SamplingParams(max_tokens=16, temperature=1.0, ignore_eos=True)] * 3
    crowded = engine.generate(["other", "tell me something", "more other"], [noise[0], seeded, noise[1]])
    assert crowded[1].token_ids == alone.token_ids
    (other_seed,) = engine.generate(["tell me something"], SamplingParams(
        max_tokens=16, temperature=1.0, top_p=0.9, seed=99, ignore_eos=True))
    assert other_seed.token_ids != alone.token_ids


def test_streamed_deltas_add_up_to_the_text(engine):
    rid = engine.add_request("once upon a time", SamplingParams(max_tokens=40, temperature=0.8, seed=3))
    pieces, tokens, final = [], [], None
    while engine.has_unfinished():
        for out in engine.step():
            pieces.append(out.delta_text)
            tokens += out.delta_token_ids
            final = out
    assert final.request_id == rid
    assert "".join(pieces) == final.text
    assert tokens == final.token_ids
    assert final.text == engine.tokenizer.decode(final.token_ids, skip_special_tokens=True)
    m = final.metrics
    assert m.output_tokens == len(final.token_ids) and m.ttft_s > 0 and m.queue_time_s >= 0


def test_stats_invariant_after_every_step_of_a_random_run(tiny_llama):
    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=48, block_size=8, max_num_batched_tokens=64))
    rng = random.Random(11)
    system = "You are a careful assistant. " * 6
    live = []
    for _ in range(150):
        if rng.random() < 0.3:
            text = system + " ".join(str(rng.randrange(100)) for _ in range(rng.randrange(1, 30)))
            params = SamplingParams(max_tokens=rng.randrange(1, 40), temperature=rng.choice([0.0, 0.7]))
            live.append(engine.add_request(text, params))
        if live and rng.random() < 0.05:
            engine.abort(live.pop(rng.randrange(len(live))))
        for out in engine.step():
            if out.finished and out.request_id in live:
                live.remove(out.request_id)
        s = engine.stats()
        assert s.kv_blocks_used + s.kv_blocks_cached + s.kv_blocks_free == s.kv_blocks_total
        assert 0 <= s.kv_blocks_shared <= s.kv_blocks_used
        assert s.kv_usage == pytest.approx(s.kv_blocks_used / s.kv_blocks_total)
    drain(engine)
    s = engine.stats()
    assert s.kv_blocks_used == 0 and s.num_running == 0 and s.num_waiting == 0
    assert s.generated_tokens_total > 0 and s.cached_prompt_tokens_total > 0


def test_duplicate_request_id_is_rejected(engine):
    engine.add_request("hi", SamplingParams(max_tokens=2), request_id="same")
    with pytest.raises(ValueError, match="already in use"):
        engine.add_request("hi", SamplingParams(max_tokens=2), request_id="same")
    drain(engine)


@pytest.mark.parametrize(
    "kwargs",
    [dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-1), dict(min_p=2), dict(stop=("",))],
)
def test_bad_sampling_params_are_refused(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_stats_list_live_requests_with_their_blocks(tiny_llama):
    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, block_size=4))
    system = "shared words " * 12
    a = engine.add_request(system + "first", SamplingParams(max_tokens=20, ignore_eos=True))
    engine.step()
    b = engine.add_request(system + "second", SamplingParams(max_tokens=20, ignore_eos=True))
    engine.step()
    stats = engine.stats()
    snapshots = {r.request_id: r for r in stats.requests}
    assert set(snapshots) == {a, b} and all(r.running for r in snapshots.values())
    assert snapshots[b].cached_prompt_tokens > 0 and snapshots[a].output_tokens == 2
    exclusive = sum(r.exclusive_blocks for r in snapshots.values())
    assert exclusive + stats.kv_blocks_shared == stats.kv_blocks_used
    assert all(r.blocks > r.exclusive_blocks for r in snapshots.values())  # both hold the shared prefix
    assert all(r.ttft_s >= r.queue_time_s for r in snapshots.values())  # the first token came after scheduling
    engine.abort(a)
    engine.abort(b)
    engine.step()
    assert engine.stats().requests == ()


def test_chat_ending_with_a_reply_continues_that_reply(tiny_llama):
    """A conversation whose last message is the assistant's (a reply cut at max_tokens) is written on: no end of
    turn after it and no new generation prompt."""
    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=32))
    chat = [{"role": "user", "content": "Tell me a story"}, {"role": "assistant", "content": "It was a dark"}]
    ids = engine.encode_prompt(chat)
    tokenizer = engine.tokenizer
    expected = tokenizer.apply_chat_template(chat, continue_final_message=True, tokenize=True)
    assert ids == list(expected["input_ids"] if hasattr(expected, "keys") else expected)
    assert tokenizer.decode(ids).endswith("It was a dark")
    fresh = engine.encode_prompt(chat[:1])
    assert tokenizer.decode(fresh).rstrip().endswith("assistant")  # a new reply starts after the prompt
