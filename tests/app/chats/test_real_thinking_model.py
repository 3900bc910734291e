"""A thinking model on the real engine, in the real window: a tiny random model whose chat template opens a
<think> block (Qwen3's layout) writes its whole reply as reasoning, which the transcript shows on its own line,
and the chat's switch, shown because the template has one, makes the next reply all answer."""

from __future__ import annotations

import pytest

from app.transcript.view import THINKING_CUT_NOTE
from engine import EngineConfig
from tests.helpers.reasoning_models import THINK_TEMPLATE, with_template

pytestmark = pytest.mark.timeout(300)
MAX_TOKENS = 8


@pytest.fixture
def window(qtbot, qloop, store, tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVASIR_CONFIG_DIR", str(tmp_path / "config"))
    from app.chats.session import ChatSession
    from app.engines.bridge import EngineBridge
    from app.window.main_window import MainWindow

    model = with_template(tiny_llama, tmp_path / "thinking-model", THINK_TEMPLATE)
    bridge = EngineBridge()
    shown = MainWindow(ChatSession(store, bridge))
    qtbot.addWidget(shown)
    shown.show()
    with qtbot.wait_signal(bridge.loaded, timeout=120_000):
        bridge.start(EngineConfig(model=str(model), device="cpu", num_kv_blocks=64, kv_disk_cache=False,
                                  speculation="off"))
    chat = shown.current
    settings = shown.conversations.get(chat).settings
    store.update_conversation(chat, system_prompt="", settings={**settings, "temperature": 0.0,
                                                                "max_tokens": MAX_TOKENS, "ignore_eos": True})
    yield shown
    shown.close()
    bridge.shutdown()


def test_a_thinking_models_reply_shows_as_reasoning_and_the_switch_turns_it_off(window, qloop, store):
    switch = window.pane.thinking
    assert switch.isVisible() and switch.isChecked()  # the template reads enable_thinking
    qloop.run_until_complete(window.send("What is the capital of France?"))
    reply = store.thread(window.current)[-1]
    assert reply.text == "" and reply.reasoning.strip() != ""  # the random model never closes its block
    assert reply.stats["reasoning_tokens"] == MAX_TOKENS and reply.stats["reasoning_s"] >= 0
    widget = window.chat.message_widget(reply.id)
    assert widget.reasoning.toggle.text().startswith("▸ Thought for ")
    assert widget.reasoning.toggle.text().endswith(f", {MAX_TOKENS} tokens")
    assert THINKING_CUT_NOTE in widget.footer.text()
    switch.click()
    qloop.run_until_complete(window.send("And of Spain?"))
    answered = store.thread(window.current)[-1]
    assert answered.reasoning == "" and answered.text.strip() != "" and answered.stats["reasoning_tokens"] == 0
    assert window.chat.message_widget(answered.id).reasoning.isHidden()
