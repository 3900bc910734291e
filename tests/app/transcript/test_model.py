"""The transcript is bound to a model of the chat on screen: a send draws only its own rows, then only the
streaming reply; the model holds the live text for every chat; the window is not on the token path."""

import asyncio

from app.transcript.model import LIVE_ROLE, MESSAGE_ROLE
from app.transcript.view import MessageWidget
from tests.helpers.signal_waits import run_until


def _count_drawing(monkeypatch) -> dict:
    """Which messages are drawn whole (``show_message``) and how often a body alone is (``show_text``)."""
    drawn = {"messages": [], "texts": 0}
    show_message, show_text = MessageWidget.show_message, MessageWidget.show_text

    def counted_message(self, message, *args):
        drawn["messages"].append(message.id)
        return show_message(self, message, *args)

    def counted_text(self, text):
        drawn["texts"] += 1
        return show_text(self, text)

    monkeypatch.setattr(MessageWidget, "show_message", counted_message)
    monkeypatch.setattr(MessageWidget, "show_text", counted_text)
    return drawn


def test_a_send_draws_its_own_rows_then_only_the_streaming_reply(qtbot, window, qloop, monkeypatch):
    qloop.run_until_complete(window.send("first"))
    earlier = window.conversations.thread(window.current)
    drawn, renders = _count_drawing(monkeypatch), window.chat.full_renders
    with qtbot.wait_signal(window.controller.reply_finished, timeout=5000):
        qloop.run_until_complete(window.send("second"))
    *_, user, reply = window.conversations.thread(window.current)
    assert window.chat.full_renders == renders  # no pass over the whole thread
    # each new row once, and once more the row before it (it loses the last message's buttons); the reply's row
    # again as it goes live and ends; the rest of the stream redraws only its text
    assert set(drawn["messages"]) == {earlier[-1].id, user.id, reply.id}
    assert drawn["messages"].count(earlier[-1].id) == 1 and drawn["messages"].count(user.id) == 2
    assert drawn["messages"].count(reply.id) <= 4
    assert drawn["texts"] >= 1
    assert "Paris is the capital of France" in window.chat.toPlainText()


def test_the_model_is_a_well_behaved_list(qtmodeltester, window, qloop):
    qloop.run_until_complete(window.send("hello"))
    qloop.run_until_complete(window.send("again"))
    model = window.transcript
    qtmodeltester.check(model)
    assert model.rowCount() == 4
    first, last = model.index(0), model.index(3)
    assert model.data(first, MESSAGE_ROLE).text == "hello" and model.data(last) == model.data(last, MESSAGE_ROLE).text
    assert model.data(last, LIVE_ROLE) is False


def test_a_chat_opened_while_it_streams_shows_what_has_arrived(qtbot, window, qloop):
    window.bridge.gate = asyncio.Event()  # the reply holds after two words
    streaming_chat = window.current
    task = window.send("Tell me")
    run_until(qloop, window.controller.reply_delta, lambda c, r, text: text == "Paris is", timeout=30)
    reply_id = window.conversations.thread(streaming_chat)[-1].id
    window.actions.new()
    assert window.transcript.live == {}  # the new chat streams nothing
    window.actions.open(streaming_chat)
    assert window.transcript.live == {reply_id: "Paris is"}
    assert window.chat.message_widget(reply_id).text == "Paris is"
    with qtbot.wait_signal(window.controller.reply_finished, timeout=5000):
        window.bridge.gate.set()
        qloop.run_until_complete(task)
    assert window.transcript.live == {} and "lovely" in window.chat.toPlainText()


def test_the_window_is_not_on_the_token_path(window):
    """Every streamed token goes from the controller to the transcript model, and from it to the view."""
    assert window.controller.receivers("2reply_delta(int,int,QString)") == 1  # the transcript model alone
    assert not hasattr(window, "_reply_delta")
