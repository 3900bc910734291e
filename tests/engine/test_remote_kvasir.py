"""The remote client against another Kvasir: Kvasir's own OpenAI-compatible endpoint (engine/api) serving a
tiny model on a loopback port with an API key, read by the same client the window and the CLI use."""

import asyncio
import json
import time

import jsonschema
import pytest

from engine import ApiConfig, ApiServer, AsyncEngine, Chat, Engine, EngineConfig, SamplingParams
from engine.remote import RemoteClient, RemoteConfig

pytestmark = pytest.mark.timeout(120)
API_KEY = "sk-kvasir-test"
SYSTEM = "You answer in one short sentence. " * 12  # several KV blocks: a second request finds them cached
QUESTION = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where is Paris?"}]


def tiny_config(model) -> EngineConfig:
    return EngineConfig(model=str(model), num_kv_blocks=128, max_model_len=512)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    engine = AsyncEngine(tiny_config(tiny_llama))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def server(engine):
    server = ApiServer(lambda: engine, ApiConfig(port=0, api_key=API_KEY))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def model(engine):
    return engine.stats().model_name


def run(server: ApiServer, job, api_key: str = API_KEY):
    """``await job(client)`` on a fresh client of the server."""
    async def main():
        client = RemoteClient(RemoteConfig(server.url, api_key=api_key))
        try:
            return await job(client)
        finally:
            await client.aclose()
    return asyncio.run(main())


def reply(server, model, messages=QUESTION, **sampling):
    async def job(client):
        return [o async for o in client.stream_chat(messages, SamplingParams(**sampling), model)]
    return run(server, job)


def test_the_server_lists_the_model_it_serves(server, model):
    models = run(server, lambda client: client.models())
    assert [m.id for m in models] == [model]


def test_a_greedy_reply_is_the_engines_own_token_for_token(server, model, tiny_llama):
    outs = reply(server, model, max_tokens=12, temperature=0.0, ignore_eos=True)
    expected = Engine(tiny_config(tiny_llama)).generate([QUESTION], SamplingParams(max_tokens=12, temperature=0.0,
                                                                                  ignore_eos=True))[0]
    final = outs[-1]
    assert final.finished and final.error is None and final.finish_reason == "length"
    assert final.text == expected.text and final.text == "".join(o.delta_text for o in outs)
    assert final.metrics.prompt_tokens == expected.metrics.prompt_tokens
    assert final.metrics.output_tokens == 12 and final.metrics.ttft_s > 0


def test_the_same_prompt_again_reports_its_cached_tokens(server, model):
    reply(server, model, max_tokens=2, temperature=0.0)
    again = reply(server, model, max_tokens=2, temperature=0.0)[-1].metrics
    assert again.cached_prompt_tokens >= 0.5 * again.prompt_tokens > 0


def test_a_stop_string_ends_the_reply_before_it(server, model):
    full = reply(server, model, max_tokens=16, temperature=0.0, ignore_eos=True)[-1].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), full
    cut = reply(server, model, max_tokens=16, temperature=0.0, ignore_eos=True, stop=(stop,))[-1]
    assert cut.finish_reason == "stop" and cut.text == full[:full.index(stop)]


def test_its_metrics_give_kv_usage_and_the_hit_rate(server, model, engine):
    reply(server, model, max_tokens=2, temperature=0.0)
    metrics = run(server, lambda client: client.server_metrics())
    stats = engine.stats()
    assert metrics.server_kind == "Kvasir" and metrics.kv_usage == pytest.approx(stats.kv_usage)
    cached, prompt = metrics.cache_counters
    assert (cached, prompt) == (stats.cached_prompt_tokens_total, stats.prompt_tokens_total)
    assert metrics.prefix_hit_rate == pytest.approx(cached / prompt) and metrics.num_running == 0


def test_a_wrong_key_ends_the_reply_with_the_servers_reason(server, model):
    final = reply_with_key(server, model, "sk-wrong")
    assert final.finish_reason == "error" and "401" in final.error


def reply_with_key(server, model, key):
    async def job(client):
        return [o async for o in client.stream_chat(QUESTION, SamplingParams(max_tokens=2), model)]
    return run(server, job, api_key=key)[-1]


def test_closing_the_stream_stops_the_request_on_the_server(server, model, engine):
    async def job(client):
        stream = client.stream_chat(QUESTION, SamplingParams(max_tokens=400, ignore_eos=True, temperature=0.0),
                                    model).__aiter__()
        got = [await stream.__anext__() for _ in range(3)]
        await stream.aclose()
        return got

    got = run(server, job)
    assert all(not o.finished for o in got)
    deadline = time.monotonic() + 10
    while engine.stats().num_running and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = engine.stats()
    assert stats.num_running == 0 and stats.kv_blocks_used == 0  # aborted, its blocks back in the pool


WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
                   "required": ["city"], "additionalProperties": False}}}


def test_a_forced_tool_call_streams_back_as_a_call_that_fits_the_tools_schema(server, model):
    chat = Chat([{"role": "user", "content": "What is the weather in Paris?"}], tools=[WEATHER])

    async def job(client):
        return [o async for o in client.stream_chat(chat, SamplingParams(max_tokens=80, temperature=1.0, seed=3),
                                                    model, tool_choice="required")]

    final = run(server, job)[-1]
    assert final.finished and final.error is None, final.error
    (call,) = final.tool_calls
    assert call.name == "weather" and call.id
    jsonschema.validate(json.loads(call.arguments), WEATHER["function"]["parameters"])
