"""The OpenAI-compatible endpoint, over loopback with the official ``openai`` client, on a tiny model."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import API_SOURCE, ApiConfig, ApiConfigError, ApiServer, AsyncEngine, Engine, EngineConfig, SamplingParams
from engine.api import ServerStartError
from engine.api.protocol import CHAT_FIELDS, COMPLETION_FIELDS

pytestmark = pytest.mark.timeout(60)  # nothing here may hang the run
MAX_MODEL_LEN = 512
SYSTEM = "You are a careful assistant. " * 30  # a long shared prefix (more than ten KV blocks)


def tiny_config(model) -> EngineConfig:
    return EngineConfig(model=str(model), num_kv_blocks=128, max_model_len=MAX_MODEL_LEN)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    engine = AsyncEngine(tiny_config(tiny_llama))
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def oracle(tiny_llama):
    """The same model in a plain Engine: what the API must return, token for token, when greedy."""
    return Engine(tiny_config(tiny_llama))


@pytest.fixture(scope="module")
def server(engine):
    server = ApiServer(lambda: engine, ApiConfig(port=0))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)


@pytest.fixture(scope="module")
def model(engine):
    return engine.stats().model_name


def chat(text: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]


def wait_until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def raw(server: ApiServer, method: str, path: str, body=None, headers: dict | None = None):
    """(status, parsed JSON body) of one request sent without the openai client."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    connection.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, json.loads(payload) if payload else None


# -- the happy paths --------------------------------------------------------------------------------------


def test_models_lists_the_served_model(client, model):
    assert [m.id for m in client.models.list().data] == [model]
    assert client.models.retrieve(model).id == model


def test_greedy_chat_equals_engine_generate(client, model, oracle):
    messages = chat("Tell me about the sea.")
    expected = oracle.generate([messages], SamplingParams(max_tokens=20, temperature=0.0))[0]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=20, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == {"stop": "stop", "length": "length"}[expected.finish_reason]
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and reply.model == model
    assert reply.usage.prompt_tokens == len(oracle.encode_prompt(messages))
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_streamed_chat_sends_the_same_text_then_usage(client, model, oracle):
    messages = chat("Count to ten.")
    expected = oracle.generate([messages], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    chunks = list(client.chat.completions.create(
        model=model, messages=messages, max_tokens=24, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_take_text_or_token_ids(client, model, oracle):
    prompt = "Once upon a time"
    expected = oracle.generate([prompt], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))[0]
    reply = client.completions.create(model=model, prompt=prompt, max_tokens=10, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert reply.object == "text_completion" and reply.choices[0].text == expected.text
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 10
    ids = oracle.encode_prompt(prompt)
    streamed = client.completions.create(model=model, prompt=ids, max_tokens=10, temperature=0, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed if c.choices) == expected.text


def test_completions_default_to_16_tokens_as_openai_does(client, model):
    reply = client.completions.create(model=model, prompt="Hello", temperature=0, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 16 and reply.choices[0].finish_reason == "length"


def test_a_shared_prefix_is_reported_as_cached_tokens(client, model, engine):
    first = client.chat.completions.create(model=model, messages=chat("First question?"), max_tokens=2)
    second = client.chat.completions.create(model=model, messages=chat("Second question?"), max_tokens=2)
    block = engine.stats().block_size
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens > 10 * block
    assert cached >= 10 * block and cached % block == 0 and cached < second.usage.prompt_tokens


def test_stop_strings_end_the_reply_before_them(client, model):
    messages = chat("Write something.")
    full = client.chat.completions.create(model=model, messages=messages, max_tokens=30, temperature=0,
                                          extra_body={"ignore_eos": True}).choices[0].message.content
    stop = full[10:13]
    assert len(stop) == 3 and stop.strip()
    for value in (stop, [stop, "never-generated-text"]):
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=30, temperature=0,
                                               stop=value, extra_body={"ignore_eos": True})
        assert reply.choices[0].message.content == full[: full.index(stop)]
        assert reply.choices[0].finish_reason == "stop"


def test_a_seed_makes_sampling_reproducible(client, model):
    def sample(seed):
        return client.chat.completions.create(model=model, messages=chat("Surprise me."), max_tokens=16,
                                              temperature=1.0, seed=seed,
                                              extra_body={"ignore_eos": True}).choices[0].message.content

    assert sample(7) == sample(7)
    assert sample(7) != sample(8)




def test_n_replies_run_together_each_with_its_own_seed(client, model, oracle):
    ask = dict(model=model, messages=chat("Name a colour."), max_tokens=8, temperature=1.0, seed=11,
               extra_body={"ignore_eos": True})
    reply = client.chat.completions.create(n=3, **ask)
    texts = [c.message.content for c in reply.choices]
    assert [c.index for c in reply.choices] == [0, 1, 2] and len(set(texts)) > 1
    assert texts[0] == client.chat.completions.create(**ask).choices[0].message.content  # choice 0 keeps the seed
    assert reply.usage.completion_tokens == 3 * 8
    assert reply.usage.prompt_tokens == len(oracle.encode_prompt(ask["messages"]))
    streamed = {0: "", 1: "", 2: ""}
    finishes = {}
    for chunk in client.chat.completions.create(n=3, stream=True, stream_options={"include_usage": True}, **ask):
        for choice in chunk.choices:
            streamed[choice.index] += choice.delta.content or ""
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
        usage = chunk.usage
    assert list(streamed.values()) == texts and finishes == {0: "length", 1: "length", 2: "length"}
    assert usage.completion_tokens == 24
    completions = client.completions.create(model=model, prompt="Once", n=2, max_tokens=4, temperature=0)
    assert len({c.text for c in completions.choices}) == 1 and len(completions.choices) == 2  # greedy: the same

def test_the_engine_keeps_a_requests_source_in_its_snapshot(oracle):
    window = oracle.add_request("from the window", SamplingParams(max_tokens=2))
    api = oracle.add_request("from a client", SamplingParams(max_tokens=2), source=API_SOURCE)
    assert {r.request_id: r.source for r in oracle.stats().requests} == {window: "", api: API_SOURCE}
    while oracle.has_unfinished():
        oracle.step()
    with pytest.raises(TypeError, match="source must be a string"):
        oracle.add_request("hi", source=3)
    assert not oracle.stats().requests

def test_api_requests_carry_their_source_to_the_stats(client, model, engine):
    seen = []
    for _chunk in client.chat.completions.create(model=model, messages=chat("Go on."), max_tokens=100, stream=True,
                                                extra_body={"ignore_eos": True}):
        seen += [r.source for r in engine.stats().requests]
    assert API_SOURCE in seen



def test_metrics_expose_kv_usage_and_prefix_cache_counters(server, engine, client, model):
    for question in ("One?", "Two?"):  # the second reads the first's cached system prompt
        client.chat.completions.create(model=model, messages=chat(question), max_tokens=1)
    status, text = raw_text(server, "/metrics")
    stats = engine.stats()
    samples = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("kvasir:")}
    assert status == 200 and f'model_name="{stats.model_name}"' in text
    assert samples["kvasir:kv_cache_usage_perc"] == stats.kv_usage
    assert samples["kvasir:prefix_cache_hits_total"] == stats.cached_prompt_tokens_total > 0
    assert samples["kvasir:kv_blocks_total"] == stats.kv_blocks_total
    assert "# TYPE kvasir:prefix_cache_queries_total counter" in text
    assert samples["kvasir:spec_decode_num_draft_tokens_total"] == stats.speculation.draft_tokens_total
    assert "# TYPE kvasir:spec_decode_num_accepted_tokens_total counter" in text


def test_metrics_export_speculation_under_vllm_names():
    from engine.api.metrics import prometheus_text
    from engine.serving.metrics import SpeculationStats
    from tests.helpers.fake_engine import fake_stats

    stats = fake_stats(speculation=SpeculationStats("auto", True, "", 7, 30, 21, 1.8))
    lines = prometheus_text(stats).splitlines()
    assert 'kvasir:spec_decode_num_drafts_total{model_name="Fake-1M"} 7.0' in lines
    assert 'kvasir:spec_decode_num_draft_tokens_total{model_name="Fake-1M"} 30.0' in lines
    assert 'kvasir:spec_decode_num_accepted_tokens_total{model_name="Fake-1M"} 21.0' in lines
    assert 'kvasir:spec_decode_num_drafts_total{model_name="Fake-1M"} 0.0' in prometheus_text(fake_stats()).splitlines()


def raw_text(server: ApiServer, path: str) -> tuple[int, str]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.request("GET", path)
    response = connection.getresponse()
    text = response.read().decode()
    connection.close()
    return response.status, text

# -- errors -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "param"), [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_k": -3}, "top_k"),
    ({"seed": 1.5}, "seed"),
    ({"stop": [1, 2]}, "stop"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_completion_tokens": "many"}, "max_completion_tokens"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),
    ({"n": 1.5}, "n"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"logprobs": True}, "logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "two words"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function",
      "function": {"name": "g"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}},
     "response_format"),
    ({"guided_regex": "([a-"}, "guided_regex"),
    ({"messages": [{"role": "tool", "content": "18 C"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function",
      "function": {"name": "f", "arguments": "{oops"}}]}]}, "messages[0].tool_calls[0].function.arguments"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "lone \ud800 surrogate"}]}, "messages"),
    ({"model": None}, "model"),
    ({"bogus_field": 1}, "bogus_field"),
])
def test_a_bad_field_is_a_400_that_names_it(server, model, change, param):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **change}
    status, reply = raw(server, "POST", "/v1/chat/completions", body)
    assert status == 400, reply
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error"
    assert reply["error"]["message"]


def test_the_openai_client_sees_errors_as_its_own_exceptions(client, model):
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model, messages=chat("hi"), temperature=-1)
    assert bad.value.status_code == 400 and bad.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="no-such-model", messages=chat("hi"))
    assert missing.value.body["param"] == "model" and missing.value.body["code"] == "model_not_found"


def test_a_prompt_longer_than_the_context_is_a_clear_400(client, model):
    with pytest.raises(openai.BadRequestError) as long_prompt:
        client.completions.create(model=model, prompt=[5] * (MAX_MODEL_LEN + 10), max_tokens=4)
    error = long_prompt.value.body
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in error["message"]
    with pytest.raises(openai.BadRequestError) as too_many:
        client.completions.create(model=model, prompt="Hello", max_tokens=MAX_MODEL_LEN)
    assert too_many.value.body["param"] == "max_tokens" and "you requested" in too_many.value.body["message"]


def test_a_prompt_with_more_characters_than_the_context_can_hold_is_a_400_before_tokenising(client, model):
    with pytest.raises(openai.BadRequestError) as huge:
        client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x" * 4_000_000}])
    error = huge.value.body
    assert error["param"] == "messages" and error["code"] == "context_length_exceeded"
    assert error["message"].startswith(f"the messages are 4,000,000 characters: more than the model's "
                                       f"{MAX_MODEL_LEN}-token context can hold")


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("POST", "/v1/chat/completions", b"{not json", 400),
    ("POST", "/v1/chat/completions", b"[1, 2]", 400),
    ("POST", "/v1/chat/completions", b"\xff\xfe", 400),
    ("POST", "/v1/completions", b"[" * 100_000, 400),
    ("GET", "/v1/chat/completions", None, 405),
    ("DELETE", "/v1/models", None, 405),
    ("GET", "/v1/nowhere", None, 404),
    ("GET", "/v1/models/other-model", None, 404),
])
def test_protocol_errors_have_openai_shape_and_status(server, method, path, body, status):
    got, reply = raw(server, method, path, body)
    assert got == status
    assert set(reply["error"]) == {"message", "type", "param", "code"} and reply["error"]["message"]


def test_browser_origins_and_foreign_host_names_are_refused_on_loopback(server, model):
    assert raw(server, "GET", "/v1/models", headers={"Origin": "https://evil.example"})[0] == 403
    assert raw(server, "GET", "/v1/models", headers={"Host": "rebound.example:80"})[0] == 403
    assert raw(server, "GET", "/v1/models", headers={"Origin": "http://localhost:3000"})[0] == 403  # another port
    own = f"127.0.0.1:{server.port}"
    assert raw(server, "GET", "/v1/models", headers={"Origin": f"http://{own}", "Host": own})[0] == 200
    assert raw(server, "GET", "/v1/models", headers={"Origin": "null"})[0] == 403  # a file opened in a browser


# -- security and start-up --------------------------------------------------------------------------------


def test_an_api_key_is_required_once_set(engine, model):
    server = ApiServer(lambda: engine, ApiConfig(port=0, api_key="s3cret"))
    server.start()
    try:
        status, reply = raw(server, "GET", "/v1/models")
        assert status == 401 and "API key" in reply["error"]["message"]
        assert raw(server, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
        assert raw(server, "GET", "/v1/models", headers={"Authorization": "Bearer s3cret"})[0] == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.url, api_key="wrong", max_retries=0).models.list()
        keyed = openai.OpenAI(base_url=server.url, api_key="s3cret", max_retries=0)
        assert keyed.chat.completions.create(model=model, messages=chat("hi"), max_tokens=2).usage.completion_tokens
    finally:
        server.stop()


def test_other_addresses_need_an_api_key():
    with pytest.raises(ApiConfigError, match="needs an API key"):
        ApiConfig(host="0.0.0.0")
    assert ApiConfig(host="0.0.0.0", api_key="k").api_key == "k"
    assert ApiConfig(host="::1").loopback and ApiConfig(host="localhost").loopback


def test_a_port_in_use_is_a_clear_error(engine, server):
    with pytest.raises(ServerStartError, match=f"port {server.port} on 127.0.0.1 is already in use"):
        ApiServer(lambda: engine, ApiConfig(port=server.port)).start()


def test_no_engine_yet_is_a_503(model):
    server = ApiServer(lambda: None, ApiConfig(port=0))
    server.start()
    try:
        status, reply = raw(server, "POST", "/v1/chat/completions", {"model": model, "messages": chat("hi")})
        assert status == 503 and "no model is loaded" in reply["error"]["message"]
    finally:
        server.stop()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1)  # the port is closed again


# -- sharing the engine -----------------------------------------------------------------------------------


def test_eight_concurrent_clients_batch_and_each_gets_its_own_reply(client, model, engine, oracle):
    prompts = [chat(f"Question number {i}?") for i in range(8)]
    expected = oracle.generate(prompts, SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))
    batches = []

    def record(e):
        step = e.step

        def recording_step():
            batches.append(sum(1 for r in e.stats().requests if r.running and r.source == API_SOURCE))
            return step()

        e.step = recording_step

    engine.call(record).result()
    try:
        with ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda m: client.chat.completions.create(
                model=model, messages=m, max_tokens=48, temperature=0, extra_body={"ignore_eos": True}), prompts))
    finally:
        engine.call(lambda e: vars(e).pop("step", None)).result()
    assert [r.choices[0].message.content for r in replies] == [e.text for e in expected]
    assert max(batches) >= 4  # several API requests ran in the same forward pass


def test_window_and_api_requests_batch_together_and_share_the_prefix_cache(client, model, engine):
    """A chat of the window (source "") and an API request with the same system prompt: one forward pass
    serves both, and the API request reads the window's cached prefix."""
    sources_per_step = []

    def record(e):
        step = e.step
        e.step = lambda: (sources_per_step.append({r.source for r in e.stats().requests if r.running}), step())[1]

    window_prompt = [{"role": "system", "content": SYSTEM + "Shared."}, {"role": "user", "content": "From the window"}]
    api_prompt = [{"role": "system", "content": SYSTEM + "Shared."}, {"role": "user", "content": "From a client"}]

    async def window_chat():
        async for _ in engine.stream(window_prompt, SamplingParams(max_tokens=120, ignore_eos=True)):
            pass

    engine.call(record).result()
    try:
        window = threading.Thread(target=lambda: asyncio.run(window_chat()))
        window.start()
        wait_until(lambda: any(r.output_tokens > 0 and r.source == "" for r in engine.stats().requests))
        reply = client.chat.completions.create(model=model, messages=api_prompt, max_tokens=8,
                                               extra_body={"ignore_eos": True})
        window.join(30)
    finally:
        engine.call(lambda e: vars(e).pop("step", None)).result()
    assert {"", API_SOURCE} in sources_per_step
    assert reply.usage.prompt_tokens_details.cached_tokens >= 10 * engine.stats().block_size


def _start_generating(server, model, stream: bool, n: int) -> socket.socket:
    """A raw connection with a long request under way (its first token out); the caller drops it."""
    body = json.dumps({"model": model, "messages": chat("Never stop."), "max_tokens": 300, "stream": stream,
                       "n": n, "ignore_eos": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


@pytest.mark.parametrize(("stream", "n"), [(True, 1), (False, 1), (True, 3), (False, 3)])
def test_a_client_that_disconnects_aborts_its_request_and_frees_its_blocks(server, model, engine, stream, n):
    generated_before = engine.stats().generated_tokens_total
    sock = _start_generating(server, model, stream, n)
    if stream:
        received = b""
        while received.count(b"data: ") < n + 2:  # the role chunks and two pieces of text
            piece = sock.recv(4096)
            assert piece, f"the server closed the stream: {received!r}"
            received += piece
        assert received.startswith(b"HTTP/1.1 200")
    wait_until(lambda: sum(r.source == API_SOURCE and r.output_tokens > 2 for r in engine.stats().requests) == n)
    assert engine.stats().kv_blocks_used > 0
    sock.close()
    wait_until(lambda: engine.stats().num_running == 0 and engine.stats().kv_blocks_used == 0
               and not engine.stats().requests)
    assert engine.stats().generated_tokens_total - generated_before < 300 * n  # stopped, not run to max_tokens


def test_the_endpoint_follows_a_model_switch_and_says_when_the_engine_stops(tiny_model_dirs):
    engine = AsyncEngine(tiny_config(tiny_model_dirs["llama"]))
    server = ApiServer(lambda: engine, ApiConfig(port=0))
    server.start()
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
    try:
        before = client.models.list().data[0].id
        asyncio.run(engine.switch_model(tiny_config(tiny_model_dirs["qwen2"])))
        after = client.models.list().data[0].id
        assert (before, after) == ("llama", "qwen2")
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model=before, messages=chat("hi"), max_tokens=2)
        assert client.chat.completions.create(model=after, messages=chat("hi"), max_tokens=2).model == "qwen2"
        # The engine stops mid-reply: the stream ends with the reason, and later requests are 503s.
        stream = client.chat.completions.create(model=after, messages=chat("hi"), max_tokens=300, stream=True,
                                                extra_body={"ignore_eos": True})
        next(stream), next(stream)
        engine.shutdown()
        with pytest.raises(openai.APIError, match="the engine (is shutting down|has stopped)"):
            list(stream)
        with pytest.raises(openai.InternalServerError) as stopped:
            client.models.list()
        assert stopped.value.status_code == 503 and stopped.value.body["code"] == "engine_stopped"
    finally:
        server.stop()
        engine.shutdown()


# -- a bounded fuzz of request bodies ----------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
    | st.sampled_from(["\ud800", "a\udfff", "", "user", "text"]),  # lone surrogates, and words the API knows
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8)
ENDPOINTS = {"/v1/chat/completions": ("messages", [{"role": "user", "content": "hi"}], CHAT_FIELDS),
             "/v1/completions": ("prompt", "hi", COMPLETION_FIELDS)}


@st.composite
def requests(draw, model: str):
    """(path, body): a valid small request with a few of its endpoint's fields (or a stray one) replaced by
    anything JSON can hold; now and then a body that is anything at all."""
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    prompt_field, prompt, fields = ENDPOINTS[path]
    if draw(st.integers(0, 9)) == 0:
        return path, draw(JSON_VALUES)
    body = {"model": model, "max_tokens": 3, prompt_field: prompt}
    names = st.sampled_from(sorted(fields | {"nonsense"}))
    for name in draw(st.lists(names, max_size=3, unique=True)):
        body[name] = draw(JSON_VALUES)
    if draw(st.booleans()):
        body["max_tokens"] = draw(st.integers(1, 4))  # keep accepted requests short
    return path, body


def test_fuzzed_bodies_get_a_reply_or_a_4xx_in_openai_shape_never_a_500(server, model):
    statuses = []

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(request=requests(model))
    def check(request):
        path, body = request
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.request("POST", path, body=json.dumps(body).encode())
        response = connection.getresponse()
        payload = response.read().decode()
        connection.close()
        statuses.append(response.status)
        assert response.status == 200 or 400 <= response.status < 500, (response.status, payload)
        if response.status != 200:
            error = json.loads(payload)["error"]
            assert isinstance(error["message"], str) and error["message"]
            assert set(error) == {"message", "type", "param", "code"}
        elif response.getheader("content-type", "").startswith("text/event-stream"):
            assert payload.endswith("data: [DONE]\n\n") and '"error"' not in payload
        else:
            assert json.loads(payload)["choices"]

    check()
    assert 200 in statuses and 400 in statuses  # both sides of the checks were reached
