"""A hostile chat template or a huge prompt is refused in words and never stalls the streams already running."""

from __future__ import annotations

import asyncio
import shutil
import threading

import pytest

from engine import AsyncEngine, Engine, EngineConfig, ModelLoadError, PromptTooLong, SamplingParams
from engine.templates.sandbox import RENDER_TIMEOUT_S, TemplateLimitError

pytestmark = pytest.mark.timeout(180)
MAX_MODEL_LEN = 256
# Fast for any chat without the word; for one with it, ten billion loop turns (hours)
SLOW_ON_A_WORD = ("{% if 'SLOWLY' in messages[-1]['content'] %}{% for a in range(100000) %}{% for b in range(100000) %}"
                  "{% endfor %}{% endfor %}{% endif %}")
FOR_EVER = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


def with_template(tmp_path, tiny_llama, template: str, prepend: bool = True):
    """A copy of the tiny model whose chat template is ``template`` (before its own, with ``prepend``)."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder)
    jinja = folder / "chat_template.jinja"
    jinja.write_text(template + (jinja.read_text() if prepend else ""))
    return folder


def config(model) -> EngineConfig:
    return EngineConfig(model=str(model), num_kv_blocks=64, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine(config(tiny_llama))


def test_a_template_that_never_finishes_on_a_sample_chat_is_refused_when_the_model_loads(tmp_path, tiny_llama):
    with pytest.raises(ModelLoadError, match=f"took longer than {RENDER_TIMEOUT_S:g} s for a 1-message chat"):
        Engine(config(with_template(tmp_path, tiny_llama, FOR_EVER)))


def test_a_template_slow_on_one_chat_fails_that_request_and_the_others_stream_on(tmp_path, tiny_llama):
    engine = AsyncEngine(config(with_template(tmp_path, tiny_llama, SLOW_ON_A_WORD)))
    finished = []

    async def reply(text: str):
        try:
            reasons = [out.finish_reason async for out in engine.stream([{"role": "user", "content": text}], GREEDY)]
            finished.append(("done", text, reasons[-1]))
        except TemplateLimitError as exc:
            finished.append(("refused", text, str(exc)))

    async def main():
        await asyncio.gather(reply("Please answer SLOWLY"), reply("Hello"), reply("Goodbye"))

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    assert finished[:2] in ([("done", "Hello", "length"), ("done", "Goodbye", "length")],
                            [("done", "Goodbye", "length"), ("done", "Hello", "length")])
    assert finished[2] == ("refused", "Please answer SLOWLY", f"the model's chat template took longer than "
                                                             f"{RENDER_TIMEOUT_S:g} s")


def test_prompts_are_templated_and_tokenised_off_the_engine_thread(tiny_llama, monkeypatch):
    engine = AsyncEngine(config(tiny_llama))
    threads = []
    encode = engine._engine.prompts.encode

    def spied_encode(prompt):
        if not all(isinstance(t, int) for t in prompt):  # text or messages; the engine thread only checks ids
            threads.append(threading.current_thread().name)
        return encode(prompt)

    monkeypatch.setattr(engine._engine.prompts, "encode", spied_encode)

    async def main():
        async for _ in engine.stream([{"role": "user", "content": "Hi"}], GREEDY):
            pass
        return await engine.encode("Hi")

    try:
        ids = asyncio.run(main())
    finally:
        engine.shutdown()
    assert ids and len(threads) == 2
    assert all(name.startswith("kvasir-prompts") for name in threads), threads


def test_a_request_stopped_while_its_prompt_is_encoded_never_starts(tiny_llama, monkeypatch):
    engine = AsyncEngine(config(tiny_llama))
    encoding, release, encoded = threading.Event(), threading.Event(), threading.Event()
    encode = engine._engine.prompts.encode

    def held_encode(prompt):
        encoding.set()
        release.wait(60)
        try:
            return encode(prompt)
        finally:
            encoded.set()

    monkeypatch.setattr(engine._engine.prompts, "encode", held_encode)

    async def main():
        stream = engine.stream([{"role": "user", "content": "Hi"}], GREEDY)
        await asyncio.to_thread(encoding.wait, 60)
        stream.abort()
        release.set()
        await asyncio.to_thread(encoded.wait, 60)
        return await engine.run(lambda e: (len(e._sequences), e.counters.prompt_tokens_total))

    try:
        assert asyncio.run(main()) == (0, 0)
    finally:
        engine.shutdown()


def test_text_longer_than_the_context_can_hold_is_refused_before_any_tokenising(engine, monkeypatch):
    calls = []
    monkeypatch.setattr(engine.tokenizer, "encode", lambda *a, **k: calls.append(a))
    limit = engine.prompts.max_chars
    assert limit == MAX_MODEL_LEN * max(map(len, engine.tokenizer.get_vocab()))
    with pytest.raises(PromptTooLong, match=f"the prompt is {limit + 1:,} characters: more than the model's "
                                            f"{MAX_MODEL_LEN}-token context can hold"):
        engine.encode_prompt("x" * (limit + 1))
    with pytest.raises(PromptTooLong, match="the messages are"):
        engine.encode_prompt([{"role": "user", "content": "x" * limit}, {"role": "user", "content": "y"}])
    with pytest.raises(PromptTooLong, match=f"the chat has {MAX_MODEL_LEN + 1} messages"):
        engine.encode_prompt([{"role": "user", "content": "hi"}] * (MAX_MODEL_LEN + 1))
    assert calls == []


def test_text_just_inside_the_limit_is_tokenised_and_left_to_the_context_check(engine):
    ids = engine.encode_prompt("x" * engine.prompts.max_chars)
    assert len(ids) > MAX_MODEL_LEN  # refused later by the context check, with the token count


def test_a_template_that_blows_a_chat_past_the_limit_is_refused_saying_so(tmp_path, tiny_llama):
    repeat = "{% for i in range(100000) %}{{ messages[0]['content'] }}{% endfor %}"
    engine = Engine(config(with_template(tmp_path, tiny_llama,
                                         "{% if messages[0]['content'] == 'repeat' %}" + repeat + "{% endif %}")))
    with pytest.raises(PromptTooLong, match=r"once the model's template has laid it out, is 600,\d{3} characters"):
        engine.encode_prompt([{"role": "user", "content": "repeat"}])
