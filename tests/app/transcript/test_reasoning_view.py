"""A reply's reasoning in the transcript: one line above the answer ("Thinking… N tokens" while it streams, then
"Thought for X s, N tokens"), opened and closed by click or keyboard, kept when the chat is opened again; a reply
that ran out of tokens while thinking says so; the "Think before answering" switch shows only for a model whose
template has it."""

import asyncio

from PySide6.QtCore import Qt

from app.data.store import Message
from app.transcript.view import THINKING_CUT_NOTE, ChatView
from tests.helpers.fake_engine import fake_stats

THOUGHTS = "The user wants the capital . It is Paris .".split()


def _reply(window, qloop, store, text="What is the capital of France?"):
    qloop.run_until_complete(window.send(text))
    reply = store.thread(window.current)[-1]
    return reply, window.chat.message_widget(reply.id)


def test_a_finished_replys_reasoning_is_one_closed_line_that_opens_and_closes(window, qloop, store, qtbot):
    window.bridge.thoughts = THOUGHTS
    reply, widget = _reply(window, qloop, store)
    block = widget.reasoning
    assert block.isVisible() and not block.is_open
    assert block.toggle.text() == f"▸ Thought for 1.0 s, {len(THOUGHTS)} tokens"
    assert block.text_view is None  # closed: the reasoning's text is not laid out
    assert " ".join(THOUGHTS) not in widget.plain_text()
    qtbot.mouseClick(block.toggle, Qt.LeftButton)
    assert block.is_open and block.text_view.isVisible() and block.text_view.text() == " ".join(THOUGHTS)
    assert block.toggle.text().startswith("▾ Thought for") and "Hide the reasoning" in block.toggle.accessibleName()
    assert widget.plain_text().index(" ".join(THOUGHTS)) < widget.plain_text().index("Paris is the capital")
    block.toggle.setFocus()
    qtbot.keyClick(block.toggle, Qt.Key_Space)  # and by keyboard
    assert not block.is_open and not block.text_view.isVisible()
    assert block.toggle in widget.focusables() and widget.focusables()[0] is block.toggle


def test_a_reply_without_reasoning_has_no_line(window, qloop, store):
    _, widget = _reply(window, qloop, store)
    assert widget.reasoning.isHidden() and widget.reasoning.focusables() == []
    assert "Thought" not in widget.plain_text()


def test_the_line_counts_the_reasoning_while_it_streams(window, qloop, store, qtbot):
    window.bridge.thoughts = THOUGHTS
    window.bridge.gate = asyncio.Event()  # holds the stream after two pieces of reasoning
    task = window.send("What is the capital of France?")
    with qtbot.wait_signal(window.chat._timer.timeout):  # the streaming reply's next redraw
        qloop.run_until_complete(asyncio.sleep(0.05))
    reply = store.thread(window.current)[-1]
    block = window.chat.message_widget(reply.id).reasoning
    assert block.isVisible() and block.toggle.text() == "▸ Thinking… 2 tokens"
    block.set_open(True)
    assert block.text_view.text() == " ".join(THOUGHTS[:2])
    window.bridge.gate.set()
    qloop.run_until_complete(task)
    assert block.is_open and block.text_view.text() == " ".join(THOUGHTS)  # stays open as it ends
    assert block.toggle.text() == f"▾ Thought for 1.0 s, {len(THOUGHTS)} tokens"


def test_the_reasoning_is_there_when_the_chat_is_opened_again(window, qloop, store):
    window.bridge.thoughts = THOUGHTS
    reply, _ = _reply(window, qloop, store)
    chat = window.current
    window.actions.new()
    window.actions.open(chat)
    block = window.chat.message_widget(reply.id).reasoning
    assert not block.isHidden() and block.toggle.text() == f"▸ Thought for 1.0 s, {len(THOUGHTS)} tokens"


def test_a_reply_that_ran_out_of_tokens_while_thinking_says_so(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    cut = Message(2, 1, 1, "assistant", "", 1.0, stats={"finish_reason": "length", "output_tokens": 64,
                                                        "reasoning_tokens": 64, "reasoning_s": 3.25},
                  reasoning="Let me think about this at length")
    view.show_thread([Message(1, 1, None, "user", "Prove it.", 0.0), cut])
    widget = view.message_widget(2)
    assert widget.reasoning.toggle.text() == "▸ Thought for 3.2 s, 64 tokens"
    assert THINKING_CUT_NOTE in widget.footer.text() and widget.button("Continue") is not None


def test_the_switch_shows_only_for_a_model_that_has_it_and_sets_the_chats_options(window, qloop, store, qtbot):
    switch = window.pane.thinking
    assert switch.isHidden()  # the fake model's template has no switch
    window.bridge._stats = fake_stats(thinking_switch=True, reasoning_markers="<think>…</think>")
    window.bridge.loaded.emit(window.bridge._stats)
    assert switch.isVisible() and switch.isChecked() and "enable_thinking" in switch.toolTip()
    qtbot.mouseClick(switch, Qt.LeftButton)
    assert store.conversation(window.current).settings["think"] is False
    _reply(window, qloop, store)
    assert window.bridge.prompts[-1].options == {"enable_thinking": False}
    window.actions.new()
    assert switch.isVisible() and switch.isChecked()  # another chat: thinking on, as by default
    window.bridge._stats = fake_stats()
    window.bridge.loaded.emit(window.bridge._stats)
    assert switch.isHidden()
