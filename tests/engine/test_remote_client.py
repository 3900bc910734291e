"""The remote client against a real loopback server that streams, refuses, stalls, cuts off and garbles.

Every failure ends the reply with finish_reason "error", a reason that says what happened, and the text that
had arrived; a generation is never sent twice."""

import asyncio

import pytest

from engine import Chat, SamplingParams
from engine.remote import RemoteClient, RemoteConfig, RemoteError
from engine.remote.client import EchoFilter, request_body
from engine.remote.tool_call_deltas import ToolCallDeltas
from tests.helpers.openai_stub import StubServer, free_port

# a generator of httpx left suspended and finalised outside its task shows as an unraisable exception
pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
FULL = "Paris is the capital of France."


@pytest.fixture
def stub():
    with StubServer() as server:
        yield server


def collect(config: RemoteConfig, sampling=None, model="stub-model"):
    """Every output of one streamed reply."""
    async def run():
        client = RemoteClient(config)
        try:
            return [out async for out in client.stream_chat(MESSAGES, sampling or SamplingParams(), model)]
        finally:
            await client.aclose()
    return asyncio.run(run())


def models(config: RemoteConfig):
    async def run():
        client = RemoteClient(config)
        try:
            return await client.models()
        finally:
            await client.aclose()
    return asyncio.run(run())


def test_a_reply_streams_with_usage_and_client_side_timings(stub):
    outs = collect(RemoteConfig(stub.url))
    final = outs[-1]
    assert [o.delta_text for o in outs[:-1]] == stub.words and all(not o.finished for o in outs[:-1])
    assert final.finished and final.finish_reason == "stop" and final.error is None and final.text == FULL
    m = final.metrics
    assert (m.prompt_tokens, m.cached_prompt_tokens, m.output_tokens) == (40, 32, len(stub.words))
    assert m.ttft_s is not None and 0 < m.ttft_s < 5 and m.decode_tokens_per_s > 0 and m.queue_time_s is None
    assert len({o.request_id for o in outs}) == 1 and outs[0].request_id.startswith("remote-")
    assert stub.requests[0]["stream_options"] == {"include_usage": True} and stub.requests[0]["stream"] is True


def test_without_usage_the_tokens_are_counted_and_prompt_counts_are_unknown(stub):
    stub.usage = None
    final = collect(RemoteConfig(stub.url))[-1]
    assert final.finish_reason == "stop" and final.metrics.output_tokens == len(stub.words)
    assert final.metrics.prompt_tokens is None and final.metrics.cached_prompt_tokens is None


def test_sampling_is_passed_through_and_defaults_of_extensions_are_not_sent(stub):
    sampling = SamplingParams(max_tokens=3, temperature=0.2, top_p=0.9, seed=7, stop=("\n\n", "END"), top_k=40)
    final = collect(RemoteConfig(stub.url), sampling)[-1]
    body = stub.requests[0]
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"]) == (3, 0.2, 0.9, 7)
    assert body["stop"] == ["\n\n", "END"] and body["top_k"] == 40 and body["model"] == "stub-model"
    assert "min_p" not in body and "repetition_penalty" not in body and "ignore_eos" not in body
    assert final.finish_reason == "length" and final.text == "Paris is the"
    plain = request_body(MESSAGES, SamplingParams(), "m")
    assert "seed" not in plain and "continue_final_message" not in plain and "add_generation_prompt" not in plain
    continuing = request_body([*MESSAGES, {"role": "assistant", "content": "Paris"}], SamplingParams(), "m")
    assert (continuing["continue_final_message"], continuing["add_generation_prompt"]) == (True, False)


def test_the_api_key_is_sent_as_a_bearer_token(stub):
    stub.api_key = "sk-right"
    assert collect(RemoteConfig(stub.url, api_key="sk-right"))[-1].finish_reason == "stop"


def test_a_wrong_key_ends_the_reply_with_401_and_the_servers_words(stub):
    stub.api_key = "sk-right"
    outs = collect(RemoteConfig(stub.url, api_key="sk-wrong"))
    assert len(outs) == 1 and outs[0].finish_reason == "error" and outs[0].text == ""
    assert "refused the API key (HTTP 401)" in outs[0].error and "Invalid API key" in outs[0].error
    assert len(stub.requests) == 1  # refused, not retried


def test_429_says_busy_and_how_long_to_wait_and_is_not_resent(stub):
    stub.behaviour, stub.status, stub.headers = "status", 429, {"Retry-After": "20"}
    stub.error_body = {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}
    out = collect(RemoteConfig(stub.url))[-1]
    assert out.finish_reason == "error" and "HTTP 429" in out.error and "Rate limit reached" in out.error
    assert "wait 20 s" in out.error and len(stub.requests) == 1


def test_500_with_a_plain_text_body_quotes_it(stub):
    stub.behaviour, stub.status, stub.error_body = "status", 500, "upstream exploded"
    out = collect(RemoteConfig(stub.url))[-1]
    assert out.finish_reason == "error" and "the server failed (HTTP 500)" in out.error
    assert "upstream exploded" in out.error


def test_a_refused_connection_is_tried_again_then_ends_with_a_clear_reason():
    url = f"http://127.0.0.1:{free_port()}"
    outs = collect(RemoteConfig(url, connect_retries=1))
    assert len(outs) == 1 and outs[0].finish_reason == "error" and outs[0].finished
    assert outs[0].error.startswith(f"could not connect to {url}")


def test_a_stream_cut_mid_reply_keeps_what_arrived(stub):
    stub.behaviour, stub.pieces = "cut", 3
    outs = collect(RemoteConfig(stub.url))
    final = outs[-1]
    assert final.finish_reason == "error" and final.text == "Paris is the"
    assert "closed the connection mid-reply" in final.error
    assert final.metrics.output_tokens == 3 and len(stub.requests) == 1  # a started reply is never sent again


def test_a_silent_server_times_out_and_keeps_what_arrived(stub):
    stub.behaviour, stub.pieces = "stall", 2
    final = collect(RemoteConfig(stub.url, read_timeout_s=0.3))[-1]
    assert final.finish_reason == "error" and final.text == "Paris is"
    assert "sent nothing for 0.3 s (read timeout)" in final.error


def test_a_malformed_event_ends_the_reply_and_says_so(stub):
    stub.behaviour, stub.pieces = "malformed", 4
    final = collect(RemoteConfig(stub.url))[-1]
    assert final.finish_reason == "error" and final.text == "Paris is the capital"
    assert "malformed event (not JSON)" in final.error


def test_an_error_event_mid_stream_carries_the_servers_message(stub):
    stub.behaviour, stub.pieces = "error_event", 2
    final = collect(RemoteConfig(stub.url))[-1]
    assert final.finish_reason == "error" and final.text == "Paris is"
    assert "the KV cache is full" in final.error


def test_a_stream_that_ends_without_a_finish_reason_is_an_incomplete_reply(stub):
    stub.behaviour = "no_finish"
    final = collect(RemoteConfig(stub.url))[-1]
    assert final.finish_reason == "error" and final.text == FULL and "before the reply finished" in final.error


def test_leaving_the_loop_early_closes_the_connection(stub):
    stub.behaviour, stub.pieces = "stall", 2

    async def run():
        client = RemoteClient(RemoteConfig(stub.url, read_timeout_s=30))
        stream = client.stream_chat(MESSAGES, SamplingParams(), "stub-model")
        outputs = stream.__aiter__()
        first = await outputs.__anext__()
        await asyncio.wait_for(outputs.aclose(), 2)  # does not wait out the stalled server
        await client.aclose()
        return first

    assert asyncio.run(run()).delta_text == "Paris"


def test_models_are_listed_and_a_starting_server_is_asked_again(stub):
    stub.models = [{"id": "a", "object": "model", "max_model_len": 4096}, {"id": "b"}, {"object": "no id"}]
    stub.models_failures = 1
    listed = models(RemoteConfig(stub.url + "/v1/"))
    assert [(m.id, m.max_model_len) for m in listed] == [("a", 4096), ("b", None)] and stub.model_gets == 2


def test_models_of_an_unreachable_or_refusing_server_raise_with_the_reason(stub):
    with pytest.raises(RemoteError, match="could not connect"):
        models(RemoteConfig(f"http://127.0.0.1:{free_port()}", connect_retries=0))
    stub.api_key = "k"
    with pytest.raises(RemoteError, match="HTTP 401"):
        models(RemoteConfig(stub.url))
    assert stub.model_gets == 1


def test_server_metrics_are_read_and_a_server_without_them_reports_nothing(stub):
    async def scrape():
        client = RemoteClient(RemoteConfig(stub.url))
        try:
            return await client.server_metrics()
        finally:
            await client.aclose()

    m = asyncio.run(scrape())
    assert m.server_kind == "llama.cpp" and m.prefix_hit_rate == pytest.approx(0.25) and m.num_running == 1
    stub.metrics_text = None
    m = asyncio.run(scrape())
    assert not m.reported and "HTTP 404" in m.note


@pytest.mark.parametrize("url, reason", [
    ("", "empty"), ("localhost:8000", "start it with http"), ("ftp://h/x", "only http"),
    ("http://:80", "names no host"), ("http://h:99999", "port"), ("http://h/v1?x=1", "takes no"),
])
def test_bad_server_addresses_are_refused_with_the_reason(url, reason):
    with pytest.raises(ValueError, match=reason):
        RemoteConfig(url)


def test_addresses_with_and_without_v1_are_the_same_server():
    a, b = RemoteConfig("http://h:8000/v1/"), RemoteConfig("http://h:8000")
    assert a.base_url == b.base_url == "http://h:8000" and a.api_root == "http://h:8000/v1"
    assert a.metrics_url == "http://h:8000/metrics"
    assert RemoteConfig("https://gw.example/llm/v1").metrics_url == "https://gw.example/llm/metrics"
    assert RemoteConfig("http://[::1]:1").is_local and not RemoteConfig("http://10.0.0.2").is_local


def test_continuing_a_reply_drops_the_servers_echo_of_it(stub):
    stub.words = ["Paris is", " the", " capital", " of France."]  # the server repeats the message it continues

    async def run():
        client = RemoteClient(RemoteConfig(stub.url))
        messages = [*MESSAGES, {"role": "assistant", "content": "Paris is"}]
        try:
            return [out async for out in client.stream_chat(messages, SamplingParams(), "m")]
        finally:
            await client.aclose()

    outs = asyncio.run(run())
    assert outs[-1].text == " the capital of France." and outs[0].delta_text == " the"


@pytest.mark.parametrize("prefix, pieces, new", [
    ("Cats are", ["Cats", " are small", " and"], " small and"),  # echoed across pieces
    ("Cats are", [" small", " and"], " small and"),  # not echoed (vLLM, SGLang)
    ("Cats are", ["Cats", " sleep"], "Cats sleep"),  # starts alike, then differs: all of it is new
    ("Cats are", ["Cats"], "Cats"),  # ends before it could tell: what was held comes out
    ("", ["a", "b"], "ab"),
])
def test_echo_filter(prefix, pieces, new):
    echo = EchoFilter(prefix)
    assert "".join(echo.feed(p) for p in pieces) + echo.flush() == new


def test_a_server_that_never_accepts_times_out_connecting_and_says_so():
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: once its backlog is full, new connections get no answer
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        try:
            outs = collect(RemoteConfig(f"http://127.0.0.1:{port}", connect_timeout_s=0.3, connect_retries=1))
        finally:
            for filler in fillers:
                filler.close()
    assert len(outs) == 1 and outs[0].finish_reason == "error" and outs[0].text == ""
    assert "no answer within the connect timeout" in outs[0].error


def test_a_line_that_never_ends_stops_the_reply_with_the_reason_not_the_memory(stub):
    stub.behaviour, stub.pieces = "endless_line", 2
    final = collect(RemoteConfig(stub.url))[-1]
    assert final.finish_reason == "error" and final.text == "Paris is"
    assert "a line of more than 4 MiB without ending it" in final.error


@pytest.mark.parametrize("chunks, lines", [
    (["a\nb", "\n"], ["a", "b"]),
    (["data: x\r", "\n\r\n"], ["data: x", ""]),  # a \r\n split across two reads is one line ending
    (["a\rb\r\nc"], ["a", "b"]),
    (["tail without ending"], []),
])
def test_the_line_splitter_knows_every_line_ending(chunks, lines):
    from engine.remote.sse import LineSplitter

    splitter = LineSplitter()
    assert [line for chunk in chunks for line in splitter.feed(chunk)] == lines


def test_the_line_splitter_and_the_decoder_refuse_what_is_too_long():
    from engine.remote.errors import RemoteError
    from engine.remote.sse import LineSplitter, SSEDecoder

    splitter = LineSplitter(max_chars=10)
    assert splitter.feed("0123456789") == []
    with pytest.raises(RemoteError, match="without ending it"):
        splitter.feed("!")
    decoder = SSEDecoder(max_chars=10)
    assert decoder.feed("data: 12345") is None
    with pytest.raises(RemoteError, match="an event of more than"):
        decoder.feed("data: 67890")


COUNT_LETTER = {"type": "function", "function": {"name": "count_letter", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}, "letter": {"type": "string"}}}}}


def collect_chat(config: RemoteConfig, chat: Chat, tool_choice=None):
    async def run():
        client = RemoteClient(config)
        try:
            return [out async for out in client.stream_chat(chat, SamplingParams(), "stub-model",
                                                            tool_choice=tool_choice)]
        finally:
            await client.aclose()
    return asyncio.run(run())


def test_tools_and_a_forced_choice_are_sent_and_streamed_calls_are_put_back_together(stub):
    stub.behaviour = "tool_call"
    stub.calls.append({"id": "call_2", "name": "word_count", "arguments": '{"text": "a b c"}'})
    forced = {"type": "function", "function": {"name": "count_letter"}}
    outs = collect_chat(RemoteConfig(stub.url), Chat(MESSAGES, tools=[COUNT_LETTER]), forced)
    final = outs[-1]
    assert stub.requests[0]["tools"] == [COUNT_LETTER] and stub.requests[0]["tool_choice"] == forced
    assert final.finished and final.error is None and final.finish_reason == "stop" and final.text == ""
    assert [c.as_openai() for c in final.tool_calls] == [
        {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
        for c in stub.calls]
    assert final.delta_tool_calls == final.tool_calls and all(not o.tool_calls for o in outs[:-1])
    assert final.metrics.ttft_s is not None  # the first piece of a call is the reply's first token


def test_without_tools_neither_tools_nor_tool_choice_is_sent(stub):
    collect_chat(RemoteConfig(stub.url), Chat(MESSAGES), "required")
    assert "tools" not in stub.requests[0] and "tool_choice" not in stub.requests[0]


@pytest.mark.parametrize(("calls", "reason"), [
    ([{"id": "call_1", "name": "", "arguments": "{}"}], "tool call 0 without a function name"),
    ([{"id": 7, "name": "count_letter", "arguments": "{}"}], "whose id is not text"),
])
def test_a_malformed_call_ends_the_reply_with_the_reason(stub, calls, reason):
    stub.behaviour, stub.calls = "tool_call", calls
    final = collect_chat(RemoteConfig(stub.url), Chat(MESSAGES, tools=[COUNT_LETTER]))[-1]
    assert final.finish_reason == "error" and reason in final.error and final.tool_calls == ()


def test_call_pieces_join_per_index_and_a_call_without_an_id_gets_one():
    deltas = ToolCallDeltas()
    deltas.add([{"index": 1, "function": {"name": "b", "arguments": '{"x"'}}])
    deltas.add([{"index": 0, "id": "call_a", "function": {"name": "a"}}])
    deltas.add([{"index": 1, "function": {"arguments": ": 1}"}}, {"index": 0, "function": {"arguments": "{}"}}])
    first, second = deltas.calls()
    assert (first.id, first.name, first.arguments) == ("call_a", "a", "{}")
    assert (second.name, second.arguments) == ("b", '{"x": 1}') and second.id.startswith("call_")
    with pytest.raises(RemoteError, match="not a list"):
        deltas.add({"index": 0})
