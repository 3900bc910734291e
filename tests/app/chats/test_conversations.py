"""The app's model layer: every write says what changed, views follow by themselves, and one send reads the
database and counts tokens no more than it must."""

import pytest

from app.chats.conversations import Conversations
from app.window.sidebar import ChatAction
from tests.helpers.fake_engine import fake_stats


class Recorder:
    def __init__(self, conversations: Conversations) -> None:
        self.events = []
        conversations.list_changed.connect(lambda: self.events.append("list"))
        conversations.thread_changed.connect(lambda cid: self.events.append(("thread", cid)))
        conversations.conversation_changed.connect(lambda cid: self.events.append(("settings", cid)))

    def take(self):
        events, self.events = self.events, []
        return events


def test_every_write_says_what_changed(store):
    conversations = Conversations(store)
    seen = Recorder(conversations)
    chat = conversations.create("A chat")
    assert seen.take() == ["list"]
    conversations.rename(chat.id, "Renamed")
    conversations.set_pinned(chat.id, True)
    assert seen.take() == ["list", "list"]
    user = conversations.add_message(chat.id, "user", "hello")
    assert seen.take() == [("thread", chat.id), "list"]  # on screen, and the chat moves to the top
    reply = conversations.add_message(chat.id, "assistant", "", parent_id=user.id, status="partial")
    seen.take()
    conversations.save_partial(reply.id, "Hel")
    assert seen.take() == []  # the view shows streaming text live; saving it says nothing
    assert conversations.thread(chat.id)[-1].text == "Hel"
    conversations.finish_message(reply.id, text="Hello!", status="complete")
    assert seen.take() == [("thread", chat.id)]
    conversations.configure(chat.id, None, "Be brief.", {"temperature": 0.2})
    assert seen.take() == [("settings", chat.id)]
    conversations.set_skipped(chat.id, 2)
    assert seen.take() == [("thread", chat.id)] and conversations.get(chat.id).settings["skip_messages"] == 2
    conversations.delete(chat.id)
    conversations.restore(chat.id)
    assert seen.take() == ["list", "list"]


def test_threads_are_cached_until_they_change(store, monkeypatch):
    conversations = Conversations(store)
    chat = conversations.create()
    conversations.add_message(chat.id, "user", "one")
    reads = []
    original = store.thread
    monkeypatch.setattr(store, "thread", lambda cid: reads.append(cid) or original(cid))
    for _ in range(5):
        conversations.thread(chat.id)
    assert reads == [chat.id]
    conversations.add_message(chat.id, "user", "two", parent_id=conversations.get(chat.id).head_id)
    assert [m.text for m in conversations.thread(chat.id)] == ["one", "two"] and len(reads) == 2


def test_version_positions_number_every_version(store):
    conversations = Conversations(store)
    chat = conversations.create()
    user = conversations.add_message(chat.id, "user", "q")
    first = conversations.add_message(chat.id, "assistant", "a1", parent_id=user.id)
    second = conversations.add_message(chat.id, "assistant", "a2", parent_id=user.id)
    assert conversations.version_positions(chat.id) == {second.id: (2, 2)}
    conversations.show_branch(first.id)
    assert conversations.version_positions(chat.id) == {first.id: (1, 2)}


def test_one_send_reads_the_thread_from_the_database_at_most_three_times(window, qloop, store, monkeypatch):
    window.bridge.words = [f"w{i}" for i in range(30)]
    reads = []
    original = store.thread
    monkeypatch.setattr(store, "thread", lambda cid: reads.append(cid) or original(cid))
    qloop.run_until_complete(window.send("Hello there"))
    # after the user's message, after the reply is added, after it is finished; none per streamed token
    assert len(reads) <= 3, reads


def test_the_context_meter_counts_when_the_chat_changes_not_on_every_stats_tick(window, qloop, qtbot):
    qloop.run_until_complete(window.send("Hello there"))
    qloop.run_until_complete(window.meter.task)
    assert window.composer.context.text().endswith("/ 2,048 tokens")
    counted = window.bridge.token_counts
    for _ in range(20):
        window.bridge.stats_updated.emit(fake_stats())
    qloop.run_until_complete(window.meter.task)
    assert window.bridge.token_counts == counted  # the stats tick counts nothing
    window.actions.new()
    qloop.run_until_complete(window.meter.task)
    assert window.bridge.token_counts == counted + 1  # a new chat: counted once, off the GUI thread
    window.actions.open_first()
    qloop.run_until_complete(window.meter.task)
    assert window.bridge.token_counts == counted + 1  # the same messages again: from the cache


def test_the_sidebar_follows_changes_and_keeps_the_chat_on_screen_selected(window):
    first = window.current
    window.actions.new()
    second = window.current
    window.actions.rename(first, "Renamed elsewhere")  # the list reorders nothing, but reloads
    window.actions.toggle_pin(first)  # first moves to the top; the selection stays on the second chat
    view = window.sidebar.view
    assert view.currentIndex().data() == window.sidebar.model.index(1).data()
    assert window.sidebar.model.index(0).data() == "📌 Renamed elsewhere" and window.current == second


@pytest.mark.parametrize("key, action", [("F2", ChatAction.RENAME), ("Delete", ChatAction.DELETE)])
def test_the_sidebar_acts_from_the_keyboard(qtbot, window, key, action):
    asked = []
    window.sidebar.action_requested.disconnect()
    window.sidebar.action_requested.connect(lambda kind, cid: asked.append((kind, cid)))
    window.sidebar.view.setFocus()
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QKeySequence

    qtbot.keyClick(window.sidebar.view, QKeySequence(key)[0].key(), Qt.NoModifier)
    assert asked == [(action, window.current)]


def test_long_titles_are_elided_not_scrolled(window):
    from PySide6.QtCore import Qt

    window.actions.rename(window.current, "A very long title " * 10)
    view = window.sidebar.view
    assert view.textElideMode() == Qt.ElideRight
    assert view.horizontalScrollBarPolicy() == Qt.ScrollBarAlwaysOff
