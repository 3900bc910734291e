"""The real default model (SmolLM2-135M-Instruct, GGUF): parity with transformers, prefix reuse, a chat."""

import pytest

from engine import SamplingParams
from tests.helpers.oracle import reference_greedy

pytestmark = pytest.mark.slow

QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Name three colours of the rainbow, please, and say which one you like best.",
    "Explain in one sentence why the sky is blue.",
    "Write a haiku about autumn leaves falling on a quiet pond.",
    "List the planets of the solar system in order from the sun, with one fact about each.",
    "I am planning a trip to Norway in winter. What should I pack, and which cities are worth visiting?",
    "Summarise the plot of a story in which a young engineer builds a chat application that runs "
    "language models locally, fights with memory limits, and finally ships it to happy users.",
]
SYSTEM = (
    "You are Kvasir, a careful assistant. Follow these house rules in every answer. "
    + " ".join(f"Rule {i}: keep answer part {i} short, polite, accurate and free of speculation." for i in range(28))
)


def test_eight_chats_match_transformers_generate(default_engine):
    engine = default_engine
    prompts = [engine.encode_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
    assert len({len(p) for p in prompts}) == len(prompts)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=48, temperature=0.0))
    model = engine.loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        for prompt, out in zip(prompts, outputs):
            assert out.token_ids == reference_greedy(model, prompt, 48, engine.loaded.eos_token_ids)
    finally:
        model.set_attn_implementation(previous)
    assert any(len(o.token_ids) == 48 for o in outputs)
    assert engine.stats().kv_blocks_used == 0


def test_shared_system_prompt_and_second_turn_come_from_cache(default_engine):
    engine = default_engine
    system = [{"role": "system", "content": SYSTEM}]
    assert len(engine.encode_prompt(system)) > 400
    first = system + [{"role": "user", "content": "What is a good name for a cat?"}]
    reply = engine.generate([first], SamplingParams(max_tokens=40, temperature=0.0))[0]
    assert reply.text
    other = system + [{"role": "user", "content": "How many legs does a spider have?"}]
    out = engine.generate([other], SamplingParams(max_tokens=16, temperature=0.0))[0]
    assert out.metrics.cached_prompt_tokens >= 400
    turn2 = first + [{"role": "assistant", "content": reply.text}, {"role": "user", "content": "And for a dog?"}]
    out2 = engine.generate([turn2], SamplingParams(max_tokens=16, temperature=0.0))[0]
    assert out2.metrics.cached_prompt_tokens >= 0.9 * out2.metrics.prompt_tokens


def test_default_model_answers_sensibly(default_engine):
    out = default_engine.generate(
        [[{"role": "user", "content": "What is the capital of France?"}]],
        SamplingParams(max_tokens=20, temperature=0.0),
    )[0]
    assert "Paris" in out.text and out.finish_reason == "stop"
