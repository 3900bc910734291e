"""The window with a scripted engine: sending, streaming, stopping, persistence, the panel, the list model."""

import asyncio

from PySide6.QtCore import Qt

from app.chats.session import ChatSession
from app.window.main_window import MainWindow
from tests.helpers.fake_engine import FakeBridge, fake_stats


def test_composer_enter_sends_and_shift_enter_adds_a_line(qtbot, window):
    composer = window.composer
    sent = []
    composer.send.connect(sent.append)
    composer.send.disconnect(window.pane.send)
    qtbot.keyClicks(composer.edit, "first line")
    qtbot.keyClick(composer.edit, Qt.Key_Return, Qt.ShiftModifier)
    qtbot.keyClicks(composer.edit, "second line")
    qtbot.keyClick(composer.edit, Qt.Key_Return)
    assert sent == ["first line\nsecond line"]


def test_send_streams_the_reply_and_stores_it_with_its_stats(qtbot, window, qloop, store):
    with qtbot.wait_signal(window.controller.reply_finished, timeout=5000) as finished:
        task = window.send("What is the capital of France?")
        qloop.run_until_complete(task)
    conv_id, message = finished.args
    assert message.text == " ".join(FakeBridge().words) and message.status == "complete"
    assert message.stats["output_tokens"] == len(FakeBridge().words) and message.stats["cached_prompt_tokens"] == 32
    thread = store.thread(conv_id)
    assert [m.role for m in thread] == ["user", "assistant"]
    assert store.conversation(conv_id).title == "What is the capital of France?"
    html = window.chat.toPlainText()
    assert "Paris is the capital" in html and "32 of 40 prompt tokens from cache" in html
    assert window.composer.edit.toPlainText() == "" and window.composer.button.text() == "Send"


def test_stop_keeps_what_had_arrived(qtbot, window, qloop, store):
    window.bridge.gate = asyncio.Event()
    task = window.send("Tell me more")
    qloop.run_until_complete(asyncio.sleep(0.05))
    assert window.composer.button.text() == "Stop"
    with qtbot.wait_signal(window.controller.reply_finished, timeout=5000) as finished:
        qtbot.keyClick(window, Qt.Key_Escape)
        qloop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    _, message = finished.args
    assert message.status == "stopped" and message.text == "Paris is"
    assert "Stopped" in window.chat.toPlainText()


def test_message_is_kept_in_the_box_while_the_model_loads(qtbot, window):
    window.bridge.ready = False
    qtbot.keyClicks(window.composer.edit, "hold on")
    qtbot.keyClick(window.composer.edit, Qt.Key_Return)
    assert window.composer.edit.toPlainText() == "hold on"
    assert "still loading" in window.statusBar().currentMessage()


def test_a_new_window_on_the_same_database_shows_the_same_conversations(qtbot, window, qloop, store):
    qloop.run_until_complete(window.send("Remember me"))
    window.actions.new()
    titles = [c.title for c in store.conversations()]
    again = MainWindow(ChatSession(store, FakeBridge()))
    qtbot.addWidget(again)
    model = again.sidebar.model
    assert [model.index(i).data() for i in range(model.rowCount())] == titles
    assert "Remember me" in titles


def test_panel_shows_the_engine_stats(window):
    stats = fake_stats(kv_blocks_used=20, kv_blocks_shared=4, kv_usage=20 / 64, decode_tokens_per_s=31.25,
                       attention_reason="flash-attn runs on CUDA only")
    window.panel.update_stats(stats)
    labels = window.panel.labels
    assert labels["Decode"].text() == "31.2 tok/s"
    assert labels["Usage"].text() == "31% (320 of 1,024 tokens)"
    assert labels["Blocks"].text() == "20 used (4 shared), 6 cached, 48 free"
    assert labels["Prefix hit rate"].text() == "42% of prompt tokens"
    assert labels["Requests"].text() == "2 running, 1 waiting"
    assert labels["Attention"].text() == "torch" and labels["Attention"].toolTip() == "flash-attn runs on CUDA only"
    assert [(n, kind) for n, _, kind in window.panel.pool.segments] == [(4, "shared"), (6, "cached")]
    assert window.panel.pool.free == 48 and window.panel.pool_caption.text().startswith("1 cell = 1 block")


def test_panel_colours_the_pool_by_conversation_and_lists_requests(window):
    from engine.serving.metrics import RequestSnapshot

    requests = (
        RequestSnapshot("r1", True, 40, 32, 7, 0.002, 21.5, 5, 3),
        RequestSnapshot("r2", False, 30, 0, 0, None, None, 0, 0),
    )
    stats = fake_stats(kv_blocks_used=5, kv_blocks_shared=2, kv_blocks_free=53, requests=requests)
    window.panel.update_stats(stats, {"r1": (window.current, "Trip planning")})
    segments = window.panel.pool.segments
    assert segments[0][0] == 3 and segments[0][1].name() != segments[1][1].name()
    assert sum(n for n, _, _ in segments) + window.panel.pool.free == stats.kv_blocks_total
    model = window.panel.requests
    listed = [[model.index(r, c).data() for c in range(model.columnCount())] for r in range(model.rowCount())]
    assert listed[0][0] == "Trip planning" and listed[1][1:] == ["21.5", "–", "2 ms"]
    assert listed[2][0] == "r2" and listed[3][1] == "queued"


def test_a_reply_cut_off_by_closing_the_app_is_stored_as_partial(window, qloop, store, tmp_path, monkeypatch):
    import app.chats.chat_controller as controller_module

    monkeypatch.setattr(controller_module, "SAVE_INTERVAL_S", 0.0)
    window.bridge.gate = asyncio.Event()  # the stream stalls after two words, as if the app died mid-reply
    window.send("Tell me about Paris")
    qloop.run_until_complete(asyncio.sleep(0.05))
    from app.data.store import Store

    reopened = Store(store.path)  # what a restarted app would read
    reply = reopened.thread(window.current)[-1]
    assert reply.role == "assistant" and reply.status == "partial" and reply.text == "Paris is"
    reopened.close()
    window.pane.stop()
    qloop.run_until_complete(asyncio.sleep(0.05))


def test_the_panel_shows_ttft_the_moment_the_first_token_arrives(window, qloop):
    """While the reply is still being written (held mid-way), not when it ends."""
    label = window.panel.labels["TTFT (last / median)"]
    before = label.text()
    window.bridge.gate = asyncio.Event()
    reply = window.send("Hello")
    qloop.run_until_complete(asyncio.sleep(0.05))
    assert window.controller.is_generating(window.current)
    assert label.text() == "50 / 50 ms" and label.text() != before
    window.bridge.gate.set()
    qloop.run_until_complete(reply)
    assert label.text() == "50 / 50 ms"  # recorded once per reply
