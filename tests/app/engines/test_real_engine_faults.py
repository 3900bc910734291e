"""The window on the real engine with tiny random-weight models: faults end one reply, never the app; and a
whole chat works with the network blocked."""

import socket

import pytest

from app.chats.session import ChatSession
from app.engines.bridge import EngineBridge
from app.window.main_window import MainWindow
from engine import EngineConfig

MAX_TOKENS = 8


def tiny_config(folder) -> EngineConfig:
    return EngineConfig(model=str(folder), device="cpu", dtype="float32", num_kv_blocks=64)


@pytest.fixture
def real_window(qtbot, qloop, store, tmp_path, monkeypatch):
    """The main window on a real EngineBridge (nothing loaded yet); short, greedy replies."""
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    bridge = EngineBridge()
    window = MainWindow(ChatSession(store, bridge))
    qtbot.addWidget(window)
    window.show()
    settings = store.conversation(window.current).settings
    store.update_conversation(window.current, settings={**settings, "temperature": 0.0, "max_tokens": MAX_TOKENS})
    yield window
    bridge.shutdown()


def load(qtbot, window, folder) -> None:
    with qtbot.wait_signal(window.bridge.loaded, timeout=120_000):
        window.bridge.start(tiny_config(folder))


def send(qloop, window, text):
    """Send ``text`` and wait for the stored reply."""
    task = window.send(text)
    assert task is not None, window.statusBar().currentMessage()
    return qloop.run_until_complete(task)


def fail_once(monkeypatch, cls, name, on_call: int, error: BaseException) -> list[int]:
    """Make ``cls.name`` raise ``error`` on its ``on_call``-th call (counted from now), once."""
    original, calls = getattr(cls, name), []

    def wrapper(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == on_call:
            raise error
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, wrapper)
    return calls


def test_a_fault_in_the_forward_pass_ends_that_reply_only(qtbot, qloop, real_window, store, tiny_llama,
                                                          monkeypatch):
    from engine.step.runner import ModelRunner

    load(qtbot, real_window, tiny_llama)
    deltas = []
    real_window.controller.reply_delta.connect(lambda conv, mid, text: deltas.append(text))
    fail_once(monkeypatch, ModelRunner, "run", on_call=3, error=RuntimeError("injected"))  # after 2 tokens
    failed = send(qloop, real_window, "first question")
    assert failed.status == "error" and "RuntimeError: injected" in failed.error
    assert failed.text == (deltas[-1] if deltas else "")  # what had arrived is kept
    assert "Failed: " in real_window.chat.toPlainText() and "injected" in real_window.chat.toPlainText()
    assert [m.role for m in store.thread(real_window.current)] == ["user", "assistant"]
    assert real_window.bridge.ready and not real_window.banner.isVisible()  # the engine carries on
    ok = send(qloop, real_window, "second question")
    assert ok.status == "complete" and ok.error is None and ok.stats["output_tokens"] >= 1
    texts = [m.text for m in store.thread(real_window.current)]
    assert texts[0] == "first question" and texts[2] == "second question" and len(texts) == 4


class EngineThreadKilled(BaseException):
    """Not an Exception: nothing in the step may catch it, so the engine thread itself dies."""


def test_a_dead_engine_thread_shows_the_bar_and_restart_brings_it_back(qtbot, qloop, real_window, store, tiny_llama,
                                                                      monkeypatch):
    from engine.serving.engine import Engine

    load(qtbot, real_window, tiny_llama)
    fail_once(monkeypatch, Engine, "step", on_call=2, error=EngineThreadKilled("device lost"))
    with qtbot.wait_signal(real_window.bridge.engine_failed, timeout=60_000):
        failed = send(qloop, real_window, "hello")
    assert failed.status == "error" and "device lost" in failed.error
    assert real_window.banner.isVisible() and "device lost" in real_window.banner.reason.text()
    assert not real_window.bridge.ready
    with qtbot.wait_signal(real_window.bridge.loaded, timeout=120_000):
        real_window.banner.restart.click()
    assert real_window.bridge.ready and not real_window.banner.isVisible()
    ok = send(qloop, real_window, "hello again")
    assert ok.status == "complete"
    assert [m.text for m in store.thread(real_window.current)][::2] == ["hello", "hello again"]


@pytest.fixture
def no_network(monkeypatch):
    """Every attempt to open a network connection fails (and is recorded)."""
    attempts = []

    def refuse(*args, **kwargs):
        attempts.append(args[1:] if args else kwargs)
        raise OSError("network access is blocked in this test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    return attempts


def test_a_whole_chat_works_with_the_network_blocked(qtbot, qloop, real_window, store, tiny_model_dirs, no_network):
    load(qtbot, real_window, tiny_model_dirs["llama"])
    first = send(qloop, real_window, "hello")
    assert first.status == "complete" and first.stats["output_tokens"] >= 1
    with qtbot.wait_signal(real_window.bridge.loaded, timeout=120_000) as switched:
        qloop.run_until_complete(real_window.bridge.switch(tiny_config(tiny_model_dirs["qwen2"])))
    assert switched.args[0].model_name != "" and real_window.bridge.config.model == str(tiny_model_dirs["qwen2"])
    second = send(qloop, real_window, "and now?")
    assert second.status == "complete" and second.stats["output_tokens"] >= 1
    assert [m.status for m in store.thread(real_window.current)] == ["complete"] * 4
    assert no_network == []
