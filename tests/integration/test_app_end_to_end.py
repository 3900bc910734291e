"""The app with the real default model: two chats stream at once, and a second turn comes from the cache."""

import asyncio

import pytest

from app.chats.session import ChatSession
from app.engines.bridge import EngineBridge
from app.window.main_window import MainWindow
from engine import EngineConfig

pytestmark = pytest.mark.slow


@pytest.fixture
def real_window(qtbot, qloop, store, tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    bridge = EngineBridge()
    window = MainWindow(ChatSession(store, bridge))
    qtbot.addWidget(window)
    window.show()
    with qtbot.wait_signal(bridge.loaded, timeout=600_000):
        bridge.start(EngineConfig(model="default", device="cpu", num_kv_blocks=1024))
    yield window
    bridge.shutdown()


def quick(store, conversation_id):
    settings = {**store.conversation(conversation_id).settings, "temperature": 0.0, "max_tokens": 32}
    store.update_conversation(conversation_id, settings=settings)


def test_two_chats_stream_together_and_turn_two_is_cached(qtbot, real_window, qloop, store):
    window = real_window
    events = []
    window.controller.reply_delta.connect(lambda conv, reply, text: events.append(conv))
    window.controller.reply_finished.connect(lambda conv, message: events.append(("done", conv)))
    first = window.current
    quick(store, first)
    task_a = window.send("Tell me about Paris.")
    window.actions.new()
    second = window.current
    quick(store, second)
    task_b = window.send("Tell me about Rome.")
    replies = qloop.run_until_complete(asyncio.gather(task_a, task_b))
    done = [events.index(("done", c)) for c in (first, second)]
    assert first in events[: min(done)] and second in events[: min(done)]  # both streamed before either ended
    for reply in replies:
        assert reply.status == "complete" and reply.text.strip() and reply.stats["output_tokens"] > 0
    assert [m.role for m in store.thread(first)] == ["user", "assistant"]

    window.actions.open(first)
    follow_up = qloop.run_until_complete(window.send("And what about its museums?"))
    assert follow_up.status == "complete"
    assert follow_up.stats["cached_prompt_tokens"] >= 0.6 * follow_up.stats["prompt_tokens"]
    window.side.show_stats(window.bridge.stats())
    assert window.panel.labels["Prefix hit rate"].text() != "0% of prompt tokens"
    assert "prompt tokens from cache" in window.chat.toPlainText()


def test_closing_the_window_mid_reply_ends_the_engine_and_keeps_what_was_written(qtbot, real_window, qloop, store):
    window = real_window
    streaming = asyncio.Event()
    window.controller.reply_delta.connect(lambda conv, reply, text: streaming.set())
    chats = []
    for _ in range(3):
        conversation = window.actions.new()
        store.update_conversation(conversation.id, settings={**conversation.settings, "max_tokens": 4000})
        chats.append(conversation.id)
        window.send("Write a very long story about a lighthouse keeper.")
    qloop.run_until_complete(asyncio.wait_for(streaming.wait(), 300))
    engine = window.bridge.engine
    window.close()
    window.bridge.shutdown()  # what kvasir does once the closed window has stopped its loop
    assert not engine.alive and not engine._thread.is_alive()  # ended, not left behind at the deadline
    shown = {chat: window.conversations.thread(chat)[-1].text for chat in chats}  # what was on screen
    kept = {chat: store.thread(chat)[-1] for chat in chats}
    assert all(m.role == "assistant" and m.status == "stopped" for m in kept.values())
    assert {chat: m.text for chat, m in kept.items()} == shown and any(shown.values())
