"""Greedy output of the engine equals transformers' generate, token for token, on every architecture."""

import random

import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.helpers.oracle import load_reference, reference_greedy
from tests.helpers.tiny_models import ARCHITECTURES

NEW_TOKENS = 48


def chat_prompts(engine, n=8, seed=0):
    """``n`` chats of clearly different lengths, as token ids through the chat template."""
    rng = random.Random(seed)
    words = "kvasir paged cache block prefix batch token stream model quant river mountain".split()
    prompts = []
    for i in range(n):
        text = " ".join(rng.choice(words) for _ in range(3 + 9 * i))
        prompts.append(engine.encode_prompt([{"role": "user", "content": text}]))
    return prompts


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_eight_concurrent_chats_match_generate(arch, tiny_model_dirs):
    folder = tiny_model_dirs[arch]
    engine = Engine(EngineConfig(model=str(folder), num_kv_blocks=256))
    prompts = chat_prompts(engine)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0))
    reference = load_reference(folder)
    eos = engine.loaded.eos_token_ids
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == reference_greedy(reference, prompt, NEW_TOKENS, eos)
    assert engine.stats().kv_blocks_used == 0


def test_chunked_prefill_mixed_with_decode_matches_generate(tiny_llama):
    """A small token budget forces long prompts into chunks that share steps with other requests' decodes."""
    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=256, max_num_batched_tokens=24))
    prompts = chat_prompts(engine, n=6, seed=3)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0))
    reference = load_reference(tiny_llama)
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == reference_greedy(reference, prompt, 24, engine.loaded.eos_token_ids)


def test_requests_arriving_mid_generation_match_generate(tiny_llama):
    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=256))
    prompts = chat_prompts(engine, n=4, seed=5)
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    finals = {}
    ids = [engine.add_request(prompts[0], params)]
    for step in range(40):
        if step in (2, 5, 9):
            ids.append(engine.add_request(prompts[len(ids)], params))
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    reference = load_reference(tiny_llama)
    for rid, prompt in zip(ids, prompts):
        assert finals[rid].token_ids == reference_greedy(reference, prompt, 20)
