"""The app's non-visual layer with no window at all: a reply streams through the session, and each chat's
replies come from the one source :class:`ReplySources` picks for it."""

import asyncio

import pytest

from app.chats.reply_sources import LocalSource, RemoteSource
from app.data.remote_store import RemoteChoice, choice_of
from tests.helpers.fake_engine import WORDS, fake_stats
from tests.helpers.openai_stub import StubServer
from tests.helpers.signal_waits import run_until


def _reply(qloop, session, conversation_id: int, text: str):
    """Send ``text`` and run the loop until the reply is stored; returns the texts streamed and the message."""
    streamed = []
    session.controller.reply_delta.connect(lambda c, r, so_far: streamed.append(so_far))
    qloop.run_until_complete(session.controller.send(conversation_id, text))
    return streamed, session.conversations.thread(conversation_id)[-1]


def test_a_reply_streams_through_the_session_with_no_window(qloop, session):
    chat = session.actions.current
    assert chat is not None and session.conversations.get(chat).title == "New chat"
    streamed, reply = _reply(qloop, session, chat, "What is the capital of France?")
    assert streamed[-1] == reply.text and len(streamed) == len(WORDS)
    assert reply.role == "assistant" and reply.status == "complete" and reply.model == "Fake-1M"
    assert session.conversations.get(chat).title == "What is the capital of France?"
    assert session.bridge.requests[-1][-1] == {"role": "user", "content": "What is the capital of France?"}
    assert session.widgets_made() == set()  # the session built and streamed without a single widget


def test_a_local_chat_gets_the_local_source(session):
    source = session.sources.of(session.actions.current)
    assert isinstance(source, LocalSource) and source.remote is None and not source.checks_own_context
    placed = source.place([{"role": "user", "content": "hi"}])
    assert source.ready and (placed.model, placed.model_name, placed.quantization, placed.route) == (
        "Fake-1M", "Fake-1M", "none", None)
    session.bridge.ready, session.bridge.loading = False, True
    assert not source.ready and "still loading" in source.not_ready_message()


def test_a_chat_moved_to_a_server_gets_its_replies_there_and_new_chats_follow_it(qloop, session):
    with StubServer() as stub:
        server = session.remote.save_server("Stub", stub.url, None)
        qloop.run_until_complete(session.remote.refresh_models(server.id))
        chat = session.actions.current
        choice = RemoteChoice(server.id, "stub-model")
        session.sources.run_on(chat, choice)
        assert choice_of(session.conversations.get(chat)) == choice
        source = session.sources.of(chat)
        assert isinstance(source, RemoteSource) and source.remote == choice and source.checks_own_context
        local_requests = len(session.bridge.requests)
        _, reply = _reply(qloop, session, chat, "hi")
        assert reply.status == "complete" and reply.text.startswith("Paris is the capital of")
        assert len(session.bridge.requests) == local_requests and stub.requests[-1]["model"] == "stub-model"
        assert reply.model == session.remote.label(choice)
        # a new chat runs where the chat on screen runs; moving it back makes it local again
        newer = session.actions.new()
        assert session.sources.of(newer.id).remote == choice
        session.sources.run_on(newer.id, None)
        assert session.sources.is_local(newer.id) and session.sources.placement(newer.id) == {}


class Answers:
    """The reply flow's questions, answered by the test: what it was asked, and what it says."""

    def __init__(self, overflow: str | None) -> None:
        self.overflow, self.asked, self.too_long = overflow, [], 0

    def ask_overflow(self, overflow):
        self.asked.append(overflow)
        return self.overflow

    def warn_too_long(self) -> None:
        self.too_long += 1


@pytest.mark.parametrize("answer, sent", [("drop", True), ("new", True), (None, False)])
def test_the_reply_flow_asks_before_the_context_overflows(qloop, session, answer, sent):
    from app.chats.reply_flow import ReplyFlow

    answers = Answers(answer)
    flow = ReplyFlow(session, answers)
    for text in ("one", "two"):
        qloop.run_until_complete(flow.send(text))
    first = session.actions.current
    limit = session.controller.context_needed(first, "three", session.bridge.count_tokens) - 4
    session.bridge._stats = fake_stats(max_model_len=limit)
    task = flow.send("three")
    assert len(answers.asked) == 1 and answers.asked[0].limit == limit and (task is not None) == sent
    if task is not None:
        qloop.run_until_complete(task)
    texts = [m.text for m in session.conversations.thread(session.actions.current) if m.role == "user"]
    assert texts == {"drop": ["one", "two", "three"], "new": ["three"], None: ["one", "two"]}[answer]
    assert (session.actions.current == first) == (answer != "new")


def test_the_reply_flow_says_why_a_message_cannot_go_yet(qloop, session):
    from app.chats.reply_flow import ReplyFlow

    flow, notices = ReplyFlow(session, Answers("drop")), []
    flow.notice.connect(lambda text, ms: notices.append(text))
    session.bridge.ready, session.bridge.loading = False, True
    assert flow.send("hello") is None and flow.regenerate() is None
    assert notices == ["The model is still loading; your message is kept in the box."]
    assert session.conversations.thread(session.actions.current) == []


def test_the_context_meter_counts_the_chat_on_screen(qtbot, qloop, session):
    from app.chats.context_meter import ContextMeter

    meter = ContextMeter(session)
    qloop.run_until_complete(session.controller.send(session.actions.current, "one two three"))
    with qtbot.wait_signal(meter.counted) as counted:
        meter.recount()
        qloop.run_until_complete(meter.task)
    messages = session.controller.messages_for_model(session.actions.current)
    assert counted.args == [session.bridge.count_tokens(messages), 2048]


def test_every_default_sampling_is_the_engines_chat_sampling(session):
    """The app's settings, a chat with no sampling of its own and the command line start from one source."""
    from engine import CHAT_SAMPLING
    from engine.tools.cli import build_parser

    bare = session.conversations.create("bare", "", None, {})
    params = session.controller.sampling_for(bare.id)
    wanted = (CHAT_SAMPLING.max_tokens, CHAT_SAMPLING.temperature, CHAT_SAMPLING.top_p)
    assert (params.max_tokens, params.temperature, params.top_p) == wanted
    assert (session.settings["sampling"]["max_tokens"], session.settings["sampling"]["temperature"],
            session.settings["sampling"]["top_p"]) == wanted
    args = build_parser().parse_args(["generate", "hello"])
    assert (args.max_tokens, args.temperature, args.top_p) == wanted


def fill_the_disk(store) -> None:
    """From now on nothing more fits: SQLite's own "database or disk is full" on the next write. The database
    may not grow (its max_page_count set to the pages it has), and a scratch chat's messages fill what room
    its pages had left, in ever smaller rows."""
    import sqlite3

    scratch = store.create_conversation("scratch").id
    store._db.execute(f"PRAGMA max_page_count = {store._db.execute('PRAGMA page_count').fetchone()[0]}")
    for size in (4000, 400, 40, 4, 1):
        while True:
            try:
                store.add_message(scratch, "user", "x" * size)
            except sqlite3.OperationalError:
                break
            except Exception as exc:  # the store's own error for the same failure
                assert "disk is full" in str(exc)
                break


def test_a_message_that_cant_be_saved_stays_in_the_box_and_says_why(qtbot, window, store):
    from PySide6.QtCore import Qt

    fill_the_disk(store)
    typed = "Please keep this message, whatever happens to the disk."
    window.composer.edit.setPlainText(typed)
    qtbot.keyClick(window.composer.edit, Qt.Key_Return)
    assert window.composer.edit.toPlainText() == typed  # nothing the user wrote is lost
    assert "Your message was not saved: the disk is full" in window.statusBar().currentMessage()
    assert store.thread(window.current) == [] and not window.controller.is_generating(window.current)


def test_a_reply_that_cant_be_saved_ends_with_the_reason_and_keeps_its_text_on_screen(qtbot, window, qloop, store):
    window.bridge.words = ["word" * 2_000] * 40  # a long reply: its saves need room
    window.bridge.gate = asyncio.Event()  # the reply waits until the disk is full
    task = window.send("Write a lot.")
    run_until(qloop, window.controller.reply_started, lambda conversation, reply: True)
    fill_the_disk(store)
    window.bridge.gate.set()
    message = qloop.run_until_complete(task)
    assert message.status == "error" and "could not be saved: the disk is full" in message.error
    assert message.text.startswith("word" * 2_000) and not window.controller.is_generating(window.current)
    footer = window.chat.message_widget(message.id).footer.text()
    assert "Failed: the reply could not be saved: the disk is full" in footer and "Writing" not in footer


def test_a_reply_that_cant_even_start_says_why(qtbot, window, qloop, store):
    qloop.run_until_complete(window.send("first"))
    fill_the_disk(store)
    with qtbot.wait_signal(window.controller.reply_failed, timeout=10_000) as failed:
        assert qloop.run_until_complete(window.flow.regenerate()) is None
    assert failed.args[1] == "No reply was started: the disk is full."
    assert window.statusBar().currentMessage() == "No reply was started: the disk is full."
    assert not window.controller.is_generating(window.current)
