"""A thinking model behind the endpoint: ``reasoning_content`` apart from ``content`` (whole and streamed, as vLLM
and llama-server send it), ``chat_template_kwargs`` to turn thinking off, and completions left as written."""

from __future__ import annotations

import http.client
import json

import pytest

from engine import Chat, Engine, EngineConfig, SamplingParams
from tests.helpers.api_serving import serving
from tests.helpers.reasoning_models import THINK_TEMPLATE, closing_model, with_template

pytestmark = pytest.mark.timeout(120)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
TOKENS = 16


def config(model) -> EngineConfig:
    return EngineConfig(model=str(model), num_kv_blocks=64, kv_disk_cache=False, speculation="off")


@pytest.fixture(scope="module")
def thinking(tiny_llama, tmp_path_factory):
    """A model that reasons, then closes its block and answers: (its folder, an Engine on it)."""
    root = tmp_path_factory.mktemp("api-think")
    think = with_template(tiny_llama, root / "think", THINK_TEMPLATE)
    plain = Engine(config(think))
    prompt_ids = plain.encode_prompt(Chat(QUESTION))
    ids = plain.generate([prompt_ids], SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True))[0]
    folder, _ = closing_model(think, root / "closing", prompt_ids, ids.token_ids)
    return folder, Engine(config(folder))


@pytest.fixture(scope="module")
def served(thinking):
    with serving(config(thinking[0])) as pair:
        yield pair


@pytest.fixture(scope="module")
def server(served):
    return served[0]


@pytest.fixture(scope="module")
def client(served):
    return served[1]


def expected(engine, options=None, split=True):
    params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True, split_reasoning=split)
    return engine.generate([Chat(QUESTION, options or {})], params)[0]


def ask(client, **extra):
    return client.chat.completions.create(model=client.models.list().data[0].id, messages=QUESTION,
                                          max_tokens=TOKENS, temperature=0, extra_body={"ignore_eos": True, **extra})


def test_a_reply_carries_its_reasoning_apart_from_its_answer(client, thinking):
    want = expected(thinking[1])
    assert want.reasoning and want.text  # the model reasons, then answers
    message = ask(client).choices[0].message
    assert (message.reasoning_content, message.content) == (want.reasoning, want.text)


def test_streamed_reasoning_comes_first_in_its_own_deltas(client, thinking):
    want = expected(thinking[1])
    chunks = list(client.chat.completions.create(
        model=client.models.list().data[0].id, messages=QUESTION, max_tokens=TOKENS, temperature=0, stream=True,
        extra_body={"ignore_eos": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = [getattr(d, "reasoning_content", None) or "" for d in deltas]
    content = [d.content or "" for d in deltas]
    assert "".join(reasoning) == want.reasoning and "".join(content) == want.text
    assert not any(r and c for r, c in zip(reasoning, content))  # one channel per chunk
    last_reasoning = max(i for i, r in enumerate(reasoning) if r)
    assert all(not c for c in content[:last_reasoning])


def test_chat_template_kwargs_turn_thinking_off(client, thinking):
    want = expected(thinking[1], {"enable_thinking": False})
    assert want.reasoning == "" and want.text
    message = ask(client, chat_template_kwargs={"enable_thinking": False}).choices[0].message
    assert message.content == want.text and getattr(message, "reasoning_content", None) is None


def test_a_completion_is_the_text_as_written(client, thinking):
    engine = thinking[1]
    prompt = engine.tokenizer.decode(engine.encode_prompt(Chat(QUESTION)))
    want = expected(engine, split=False)
    assert "</think>" in want.text
    reply = client.completions.create(model=client.models.list().data[0].id, prompt=prompt, max_tokens=TOKENS,
                                      temperature=0, extra_body={"ignore_eos": True})
    assert reply.choices[0].text == want.text


@pytest.mark.parametrize(("change", "param"), [
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo", "reasoning_content": 5},
                   {"role": "user", "content": "and?"}]}, "messages[1].reasoning_content"),
])
def test_bad_template_options_or_reasoning_are_a_400_naming_them(server, change, param):
    body = {"model": "x", "messages": QUESTION, "max_tokens": 4, **change}
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("POST", "/v1/chat/completions", body=json.dumps(body),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    reply = json.loads(response.read())
    connection.close()
    assert response.status == 400 and reply["error"]["param"] == param, reply


def test_a_remote_kvasir_streams_reasoning_and_takes_the_chats_options(server, thinking):
    import asyncio

    from engine.remote import RemoteClient, RemoteConfig

    async def reply(options):
        client = RemoteClient(RemoteConfig(server.url))
        try:
            params = SamplingParams(max_tokens=TOKENS, temperature=0.0, ignore_eos=True)
            model = (await client.models())[0].id
            return [o async for o in client.stream_chat(Chat(QUESTION, options), params, model)]
        finally:
            await client.aclose()

    thinking_on, thinking_off = asyncio.run(reply({})), asyncio.run(reply({"enable_thinking": False}))
    want, want_off = expected(thinking[1]), expected(thinking[1], {"enable_thinking": False})
    final = thinking_on[-1]
    assert (final.reasoning, final.text) == (want.reasoning, want.text)
    assert "".join(o.delta_reasoning for o in thinking_on) == want.reasoning
    assert thinking_off[-1].text == want_off.text and thinking_off[-1].reasoning == ""
