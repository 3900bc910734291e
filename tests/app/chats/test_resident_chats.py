"""Chats on several resident models, in the real window on the real engine: each chat names its model, two
chats on two models are written at once, opening a chat brings its model on screen with no load and no
re-prefill, and a routed chat says where each reply went, with a one-click override that the router keeps."""

from __future__ import annotations

import asyncio

import pytest

from engine import Engine, EngineConfig
from engine.routing.router import AUTO, Routes, Rule
from tests.helpers.signal_waits import run_until

pytestmark = pytest.mark.timeout(300)


def tiny(model_dir) -> EngineConfig:
    return EngineConfig(model=str(model_dir), device="cpu", num_kv_blocks=64, kv_disk_cache=False)


@pytest.fixture
def app(qtbot, qloop, store, tmp_path, monkeypatch, tiny_model_dirs):
    """The window on the real engine with llama and qwen2 resident, and the chat on screen on llama."""
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVASIR_CONFIG_DIR", str(tmp_path / "config"))
    from app.chats.session import ChatSession
    from app.engines.bridge import EngineBridge
    from app.window.main_window import MainWindow

    bridge = EngineBridge()
    window = MainWindow(ChatSession(store, bridge))
    qtbot.addWidget(window)
    with qtbot.wait_signal(bridge.loaded, timeout=120_000):
        bridge.start(tiny(tiny_model_dirs["llama"]))
    greedy(window, window.current)
    assert window.switcher.switch(tiny(tiny_model_dirs["llama"])) is None  # resident: this chat names it, no load
    yield window
    window.close()
    bridge.shutdown()


def greedy(window, conversation_id: int) -> None:
    settings = window.conversations.get(conversation_id).settings
    window.session.store.update_conversation(conversation_id, settings={**settings, "temperature": 0.0,
                                                                        "max_tokens": 8})


def expected_reply(model_dir, window, conversation_id: int, text: str) -> str:
    """What the model alone says, greedy, to the messages the chat would send."""
    controller = window.session.controller
    messages = controller.messages_for_model(conversation_id, next_user_text=text)
    return Engine(tiny(model_dir)).generate([messages], controller.sampling_for(conversation_id))[0].text


def new_chat_on(window, qloop, config) -> int:
    chat = window.actions.new().id
    greedy(window, chat)
    loading = window.switcher.switch(config)
    if loading is not None:
        qloop.run_until_complete(loading)
    return chat


def test_two_chats_on_two_models_stream_together_and_switching_reloads_nothing(app, qloop, tiny_model_dirs):
    window, bridge = app, app.bridge
    on_llama = window.current
    on_qwen2 = new_chat_on(window, qloop, tiny(tiny_model_dirs["qwen2"]))  # loaded beside llama
    assert bridge.engine.model_ids() == ["llama", "qwen2"] and bridge.focused == "qwen2"
    expected = {on_llama: expected_reply(tiny_model_dirs["llama"], window, on_llama, "Tell me about the sea"),
                on_qwen2: expected_reply(tiny_model_dirs["qwen2"], window, on_qwen2, "Tell me about the sea")}

    controller = window.session.controller
    both = asyncio.gather(*(controller.send(chat, "Tell me about the sea") for chat in (on_llama, on_qwen2)))
    replies = dict(zip((on_llama, on_qwen2), qloop.run_until_complete(both), strict=True))
    assert {chat: reply.text for chat, reply in replies.items()} == expected
    assert (replies[on_llama].model, replies[on_qwen2].model) == ("llama", "qwen2")

    loads = []
    bridge.load_progress.connect(lambda *args: loads.append(args))
    window.actions.open(on_llama)  # its model comes on screen: resident, so no load
    assert bridge.focused == "llama" and bridge.config.model == str(tiny_model_dirs["llama"])
    assert window.model_bar.quant_box.isEnabled() and not bridge.loading and loads == []
    second = qloop.run_until_complete(window.send("And the sky?"))
    earlier_turn = second.stats["prompt_tokens"] - len(bridge.engine.encode_prompt(
        [{"role": "user", "content": "And the sky?"}], "llama"))
    assert second.model == "llama" and second.stats["cached_prompt_tokens"] >= earlier_turn // 16 * 16 > 0
    assert bridge.engine.model_ids() == ["llama", "qwen2"]  # qwen2 stayed resident throughout


def test_a_routed_chat_says_where_each_reply_went_and_the_override_sticks(app, qloop, tiny_model_dirs):
    window = app
    new_chat_on(window, qloop, tiny(tiny_model_dirs["qwen2"]))
    window.session.set_routes(Routes([Rule("qwen2", keywords=("code",))], fallback="llama"))
    window.model_bar.auto_requested.emit()  # the model bar's "Auto (routed)"
    routed = window.current
    assert window.conversations.get(routed).settings["local_model"] == AUTO
    assert window.model_bar.model_box.currentText() == "Auto (routed)" and not window.model_bar.quant_box.isEnabled()

    reply = qloop.run_until_complete(window.send("Write some code"))
    assert reply.model == "qwen2" and reply.stats["route"] == {
        "model": "qwen2", "reason": "the message says 'code'", "by": "router", "others": ["llama"]}
    widget = window.chat.message_widget(reply.id)
    assert "Routed to qwen2: the message says 'code'" in widget.footer.text()

    widget.button("Run on llama").click()  # one click: the same message again, on llama
    qloop.run_until_complete(window.session.controller.tasks[routed])
    again = window.conversations.thread(routed)[-1]
    assert again.id != reply.id and again.model == "llama"
    assert again.stats["route"]["by"] == "you" and again.stats["route"]["model"] == "llama"
    assert "Run on llama: chosen by you" in window.chat.message_widget(again.id).footer.text()

    nxt = qloop.run_until_complete(window.send("More code please"))  # sticky: the conversation stays on llama
    assert nxt.model == "llama" and nxt.stats["route"]["reason"] == "earlier turns of this conversation ran on llama"
    assert window.settings["routes"] == {"rules": [{"model": "qwen2", "keywords": ["code"]}], "fallback": "llama",
                                         "sticky": True}


def test_a_model_no_chat_uses_is_unloaded_after_the_idle_time(app, qloop, tiny_model_dirs):
    window, bridge = app, app.bridge
    first = window.current
    new_chat_on(window, qloop, tiny(tiny_model_dirs["qwen2"]))
    window.actions.open(first)
    assert bridge.focused == "llama" and list(bridge.resident) == ["llama", "qwen2"]
    bridge.set_idle_unload(0.0)  # Preferences > Several models; the first model is never unloaded this way
    run_until(qloop, bridge.models_updated, lambda every: list(every) == ["llama"], timeout=60)
    assert list(bridge.resident) == ["llama"] and bridge.focused == "llama"
