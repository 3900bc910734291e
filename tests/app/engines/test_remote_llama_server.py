"""The window chatting with a real llama-server (built by `make peers`, the default GGUF): a chat set on the
server's model streams its reply, keeps its stats, regenerates, and the panel shows the server's metrics."""

import asyncio

import pytest

from app.data.remote_store import RemoteChoice, choice_of
from app.panel.remote_panel import NOT_REPORTED
from app.window.model_bar import index_of
from tests.helpers.llama_server import API_KEY, MODEL_ALIAS, llama_server

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")]


@pytest.fixture(scope="module")
def server():
    with llama_server() as running:
        yield running


@pytest.fixture
def on_server(window, qloop, server, monkeypatch):
    """The server added with its API key (kept in the settings file: no keyring here) and picked in the bar."""
    import keyring
    from keyring.backends import fail

    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    added = window.remote.save_server("llama.cpp", server.url, API_KEY)
    qloop.run_until_complete(window.remote.refresh_models(added.id))
    choice = RemoteChoice(added.id, MODEL_ALIAS)
    box = window.model_bar.model_box
    index = index_of(box, choice)
    assert index >= 0, window.remote.model_errors
    box.setCurrentIndex(index)
    box.activated.emit(index)
    conversation = window.conversations.get(window.current)
    window.conversations.configure(window.current, conversation.preset, conversation.system_prompt,
                                   {**conversation.settings, "temperature": 0.0, "max_tokens": 12})
    yield choice
    keyring.set_keyring(previous)


def test_a_chat_on_the_server_streams_its_reply_with_stats(window, qloop, store, on_server):
    deltas = []
    window.controller.reply_delta.connect(lambda _, __, text: deltas.append(text))
    message = qloop.run_until_complete(window.send("What is the capital of France?"))
    assert choice_of(store.conversation(window.current)) == on_server
    assert message.status == "complete" and message.text.strip() and message.model == f"llama.cpp · {MODEL_ALIAS}"
    assert len(deltas) > 2 and deltas[-1] == message.text  # it streamed into the view
    s = message.stats
    assert s["prompt_tokens"] > 10 and 0 < s["output_tokens"] <= 12 and s["ttft_s"] > 0
    assert s["finish_reason"] in ("stop", "length") and window.bridge.requests == []
    assert f"Kvasir · llama.cpp · {MODEL_ALIAS}" in window.chat.toPlainText()


def test_regenerate_is_answered_from_the_servers_prompt_cache(window, qloop, store, on_server):
    qloop.run_until_complete(window.send("Name a colour."))
    again = qloop.run_until_complete(window.flow.regenerate())
    assert again.status == "complete" and len(store.siblings(again.id)) == 2
    assert again.stats["cached_prompt_tokens"] > 0.5 * again.stats["prompt_tokens"]


def test_the_panel_shows_the_servers_hit_rate_and_that_kv_usage_is_not_reported(window, qloop, on_server):
    qloop.run_until_complete(window.send("Hello!"))
    panel = window.remote_panel
    future = qloop.create_future()

    def seen(server_id, metrics):
        if not future.done() and metrics.server_kind == "llama.cpp" and metrics.cache_counters[1] > 0:
            future.set_result(metrics)

    window.remote.metrics_updated.connect(seen)
    metrics = qloop.run_until_complete(asyncio.wait_for(future, 10))
    assert window.side.panels.currentWidget() is panel and panel.text("Metrics") == "from llama.cpp's /metrics"
    assert panel.text("Usage") == NOT_REPORTED
    assert panel.text("Prefix hit rate").startswith(f"{metrics.prefix_hit_rate:.0%} of prompt tokens")
