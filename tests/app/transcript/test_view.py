"""The transcript: one widget per message, only the streaming one redrawn, long chats paged, the view
following the stream until the user scrolls up, actions reachable by keyboard, Continue after max_tokens."""

import asyncio

from PySide6.QtCore import Qt

from app.data.store import Message
from app.transcript.view import PAGE, ChatView, MessageAction
from tests.helpers.fake_engine import fake_stats


def thread(count: int, conversation: int = 1) -> list[Message]:
    return [Message(i + 1, conversation, i or None, "user" if i % 2 == 0 else "assistant",
                    f"message {i} " + "words " * 20, float(i)) for i in range(count)]


def make_view(qtbot) -> ChatView:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    return view


def test_only_the_streaming_message_is_redrawn(qtbot, monkeypatch):
    view = make_view(qtbot)
    messages = thread(20)
    live = Message(21, 1, 20, "assistant", "", 21.0, status="partial")
    view.show_thread(messages + [live], {21: ""})
    widgets = {m.id: view.message_widget(m.id) for m in messages}
    drawn = []
    for message_id, widget in widgets.items():
        monkeypatch.setattr(widget, "show_text", lambda text, mid=message_id: drawn.append(mid))
    for n in range(30):
        view.update_streaming(21, "token " * n)
        qtbot.wait(5)
    qtbot.waitUntil(lambda: view.message_widget(21).text == "token " * 29)
    assert drawn == []
    view.show_thread(messages + [live], {21: "token " * 29})  # a refresh reuses every unchanged widget
    assert all(view.message_widget(m.id) is widgets[m.id] for m in messages) and drawn == []


def test_a_long_chat_shows_its_latest_messages_and_the_rest_on_request(qtbot):
    view = make_view(qtbot)
    view.show_thread(thread(1000))
    assert len(view._order) == PAGE and view._order[-1] == 1000 and view.earlier.isVisible()
    view.earlier.click()
    assert len(view._order) == 2 * PAGE and view._order[0] == 1000 - 2 * PAGE + 1


def test_the_view_follows_the_stream_until_the_user_scrolls_up(qtbot):
    view = make_view(qtbot)
    live = Message(41, 1, 40, "assistant", "", 41.0, status="partial")
    view.show_thread(thread(40) + [live], {41: ""})
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum())
    view.update_streaming(41, "line\n\n" * 40)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum() and view.message_widget(41).text.count("line") == 40)
    bar.setValue(bar.maximum() // 2)  # the user reads something above
    view.update_streaming(41, "line\n\n" * 80)
    qtbot.wait(150)
    assert bar.value() == bar.maximum() // 2 or bar.value() < bar.maximum()
    bar.setValue(bar.maximum())  # back at the bottom: following again
    view.update_streaming(41, "line\n\n" * 120)
    qtbot.waitUntil(lambda: view.message_widget(41).text.count("line") == 120)
    qtbot.wait(50)
    assert bar.value() == bar.maximum()


def test_message_actions_are_reachable_by_keyboard(qtbot):
    view = make_view(qtbot)
    view.show_thread(thread(4))
    first = view.message_widget(1)
    edit = first.button("Edit")
    assert first._opacity.opacity() == 0.0  # not hovered, not focused: out of the way
    assert edit.focusPolicy() & Qt.TabFocus and edit.accessibleName()
    edit.setFocus()
    qtbot.waitUntil(lambda: first._opacity.opacity() == 1.0)
    asked = []
    view.action.connect(lambda kind, mid: asked.append((kind, mid)))
    qtbot.keyClick(edit, Qt.Key_Space)
    assert asked == [(MessageAction.EDIT, 1)]
    assert view.message_widget(4)._opacity.opacity() == 1.0  # the last message shows its actions anyway


def test_a_reply_cut_at_max_tokens_says_so_and_offers_continue(qtbot):
    view = make_view(qtbot)
    cut = Message(2, 1, 1, "assistant", "It was a dark and", 1.0, stats={"finish_reason": "length",
                                                                        "output_tokens": 5})
    view.show_thread([Message(1, 1, None, "user", "story?", 0.0), cut])
    widget = view.message_widget(2)
    assert "Cut at the length limit" in widget.footer.text() and widget.button("Continue") is not None
    ended = Message(2, 1, 1, "assistant", "The end.", 1.0, stats={"finish_reason": "stop", "output_tokens": 3})
    view.show_thread([Message(1, 1, None, "user", "story?", 0.0), ended])
    assert widget.button("Continue") is None


def test_continue_writes_on_into_the_same_reply(window, qloop, store):
    window.bridge.finish_reason = "length"
    window.bridge.words = ["It", "was", "a"]
    qloop.run_until_complete(window.send("Tell me a story"))
    reply = store.thread(window.current)[-1]
    assert reply.stats["finish_reason"] == "length" and window.chat.message_widget(reply.id).button("Continue")
    window.bridge.finish_reason, window.bridge.words = "stop", [" dark", "night."]  # as a tokenizer spells it
    qloop.run_until_complete(window.flow.continue_reply(reply.id))
    continued = store.thread(window.current)[-1]
    assert continued.id == reply.id and continued.text == "It was a dark night."
    assert continued.stats["output_tokens"] == 3 + 2 and continued.stats["finish_reason"] == "stop"
    sent = window.bridge.requests[-1]
    assert sent[-1] == {"role": "assistant", "content": "It was a"}  # the model writes on from there
    assert window.chat.message_widget(reply.id).button("Continue") is None


def test_streaming_into_a_thousand_message_chat_touches_one_widget(window, qloop, store, monkeypatch):
    conv = window.current
    parent = None
    for i in range(1000):
        parent = store.add_message(conv, "user" if i % 2 == 0 else "assistant", f"old message {i}",
                                   parent_id=parent).id
    window.conversations.added_elsewhere()
    window.bridge._stats = fake_stats(max_model_len=1_000_000)  # the whole chat fits: no context question
    window.actions.open(conv)
    assert len(window.chat._order) == PAGE
    window.bridge.gate = asyncio.Event()
    task = window.send("one more")
    qloop.run_until_complete(asyncio.sleep(0.05))  # the reply is streaming, held after two words
    streaming = window.chat._order[-1]
    drawn = []
    for message_id in window.chat._order[:-1]:
        widget = window.chat.message_widget(message_id)
        monkeypatch.setattr(widget, "show_text", lambda text, mid=message_id: drawn.append(mid))
    window.bridge.gate.set()
    qloop.run_until_complete(task)
    assert store.thread(conv)[-1].text.startswith("Paris") and store.thread(conv)[-1].id == streaming
    assert drawn == []  # the 59 other messages on screen were not redrawn


def test_no_blank_space_is_left_under_the_last_message(qtbot):
    view = make_view(qtbot)
    view.resize(800, 600)
    view.show_thread(thread(30))  # taller than the view
    qtbot.waitUntil(lambda: view.last_widget().geometry().bottom() > view.viewport().height(), timeout=30_000)
    bottom = view.last_widget().geometry().bottom()
    assert view.page.height() - bottom < 40  # the page ends with its last message (and the margins)
