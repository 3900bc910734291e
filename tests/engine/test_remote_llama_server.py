"""The remote client and the CLI against a real third-party server: llama.cpp's llama-server (built by
`make peers`) serving the default GGUF on a loopback port, with --metrics and an API key."""

import asyncio
import json
import subprocess
import sys
import time

import pytest

from engine import SamplingParams
from engine.remote import RemoteClient, RemoteConfig
from tests.helpers.llama_server import API_KEY, MODEL_ALIAS, llama_server

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")]

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
GREEDY = dict(temperature=0.0, seed=1)


@pytest.fixture(scope="module")
def server():
    with llama_server() as running:
        yield running


def run(server_url: str, job, api_key: str | None = API_KEY):
    """``await job(client)`` on a fresh client of the server."""
    async def main():
        client = RemoteClient(RemoteConfig(server_url, api_key=api_key))
        try:
            return await job(client)
        finally:
            await client.aclose()
    return asyncio.run(main())


def reply(server_url: str, messages=QUESTION, **sampling):
    async def job(client):
        return [o async for o in client.stream_chat(messages, SamplingParams(**sampling), MODEL_ALIAS)]
    return run(server_url, job)


def test_the_server_lists_its_one_model(server):
    models = run(server.url, lambda client: client.models())
    assert [m.id for m in models] == [MODEL_ALIAS] and models[0].max_model_len > 0


def test_a_streamed_reply_carries_usage_and_client_timings(server):
    outs = reply(server.url, max_tokens=12, **GREEDY)
    final = outs[-1]
    assert final.finished and final.finish_reason in ("stop", "length") and final.error is None
    assert "Paris" in final.text and final.text == "".join(o.delta_text for o in outs)
    assert len(outs) > 3  # it streamed, piece by piece
    m = final.metrics
    assert m.prompt_tokens > 10 and m.cached_prompt_tokens is not None and 0 < m.output_tokens <= 12
    assert 0 < m.ttft_s < 60 and m.decode_tokens_per_s > 0


def test_max_tokens_ends_the_reply_at_length(server):
    final = reply(server.url, max_tokens=4, **GREEDY)[-1]
    assert (final.finish_reason, final.metrics.output_tokens) == ("length", 4)


def test_a_stop_string_ends_the_reply_before_it(server):
    full = reply(server.url, max_tokens=16, **GREEDY)[-1].text
    words = full.split()
    assert len(words) >= 4, full
    stop = " " + words[2]
    cut = reply(server.url, max_tokens=16, stop=(stop,), **GREEDY)[-1]
    assert cut.finish_reason == "stop" and cut.text == full[: full.index(stop)] and stop not in cut.text


def test_the_same_prompt_again_is_served_from_the_servers_cache(server):
    reply(server.url, max_tokens=2, **GREEDY)
    again = reply(server.url, max_tokens=2, **GREEDY)[-1].metrics
    assert again.cached_prompt_tokens > 0.5 * again.prompt_tokens


def test_continuing_a_cut_reply_adds_only_new_words(server):
    first = reply(server.url, max_tokens=6, **GREEDY)[-1]
    assert first.finish_reason == "length"
    more = reply(server.url, [*QUESTION, {"role": "assistant", "content": first.text}], max_tokens=6, **GREEDY)[-1]
    assert more.text.strip() and not more.text.startswith(first.text)  # llama-server's echo of it is dropped
    whole = reply(server.url, max_tokens=12, **GREEDY)[-1].text
    assert whole.startswith(first.text + more.text)  # greedy: the two parts read as the reply written at once


def test_metrics_give_the_hit_rate_and_say_kv_usage_is_not_reported(server):
    reply(server.url, max_tokens=2, **GREEDY)
    m = run(server.url, lambda client: client.server_metrics())
    assert m.server_kind == "llama.cpp" and m.kv_usage is None  # this llama.cpp build exports no KV usage
    cached, prompt = m.cache_counters
    assert prompt > 0 and m.prefix_hit_rate == pytest.approx(cached / prompt) and m.num_running is not None


def test_a_wrong_key_is_refused_with_the_servers_words(server):
    async def job(client):
        return [o async for o in client.stream_chat(QUESTION, SamplingParams(max_tokens=2), MODEL_ALIAS)]
    final = run(server.url, job, api_key="sk-wrong")[-1]
    assert final.finish_reason == "error" and "HTTP 401" in final.error and "Invalid API Key" in final.error


def test_closing_the_stream_stops_the_generation_on_the_server(server):
    async def job(client):
        stream = client.stream_chat(QUESTION, SamplingParams(max_tokens=400, ignore_eos=True, **GREEDY),
                                    MODEL_ALIAS).__aiter__()
        got = [await stream.__anext__() for _ in range(3)]
        await stream.aclose()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the server notices the closed connection between two tokens
            if (await client.server_metrics()).num_running == 0:
                return got, time.monotonic()
            await asyncio.sleep(0.1)
        return got, None

    got, idle_at = run(server.url, job)
    assert all(not o.finished for o in got) and idle_at is not None
    predicted = _metric(server.url, "llamacpp:tokens_predicted_total")
    time.sleep(0.5)
    assert _metric(server.url, "llamacpp:tokens_predicted_total") == predicted  # nothing more is generated


def _metric(url: str, name: str) -> float:
    async def job(client):
        response = await client._http.get(client.config.metrics_url)
        return next(float(line.split()[1]) for line in response.text.splitlines() if line.startswith(name + " "))
    return run(url, job)


def cli(*args, stdin=None):
    return subprocess.run([sys.executable, "-m", "engine", *args], input=stdin, capture_output=True, text=True,
                          timeout=300)


def test_cli_generate_remote_picks_the_only_model_and_reports_json(server):
    proc = cli("generate", "--remote", server.url, "--api-key", API_KEY, "--max-tokens", "8", "--temperature", "0",
               "--json", "What is the capital of France?")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    metrics = json.loads(lines[-1])
    assert metrics["model"] == MODEL_ALIAS and metrics["finish_reason"] in ("stop", "length")
    assert metrics["prompt_tokens"] > 10 and 0 < metrics["output_tokens"] <= 8 and metrics["ttft_s"] > 0
    assert "\n".join(lines[:-1]).strip()  # the reply's text, streamed before the metrics


def test_cli_chat_remote_keeps_the_conversation_and_the_server_reuses_its_cache(server):
    proc = cli("chat", "--remote", server.url + "/v1", "--api-key", API_KEY, "--model", MODEL_ALIAS,
               "--max-tokens", "12", "--temperature", "0", stdin="Tell me about Paris.\nAnd about Rome?\n\n")
    assert proc.returncode == 0, proc.stderr
    reports = [line for line in proc.stdout.splitlines() if "prompt tokens from cache" in line]
    assert len(reports) == 2, proc.stdout
    cached, total = reports[1].split("|")[-1].split()[0].split("/")
    assert int(cached) >= 0.5 * int(total)  # the first turn's prompt and reply came from the server's cache
