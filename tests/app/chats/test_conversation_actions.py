"""Regenerate, edit and versions; rename, pin, delete with undo; export and import."""

import json

import pytest

from app.data.export import ConversationImportError, from_json, to_json, to_markdown
from app.transcript.view import MessageAction
from tests.helpers.fake_engine import FakeBridge


def reply_texts(store, conv_id):
    return [m.text for m in store.thread(conv_id)]


def test_regenerate_adds_a_new_version_of_the_last_reply(window, qloop, store):
    qloop.run_until_complete(window.send("Capital of France?"))
    window.bridge.words = ["Still", "Paris."]
    qloop.run_until_complete(window.flow.regenerate())
    conv = window.current
    assert reply_texts(store, conv) == ["Capital of France?", "Still Paris."]
    last = store.thread(conv)[-1]
    assert [m.text for m in store.siblings(last.id)][0].startswith("Paris is the capital")
    assert "2/2" in window.chat.toPlainText()
    window.actions.show_version(last.id, -1)  # back to the first reply
    assert reply_texts(store, conv)[-1].startswith("Paris is the capital")
    assert "1/2" in window.chat.toPlainText()


def test_edit_replaces_later_turns_and_keeps_the_old_branch(window, qloop, store):
    qloop.run_until_complete(window.send("first question"))
    qloop.run_until_complete(window.send("second question"))
    conv = window.current
    first_user = store.thread(conv)[0]
    window.pane.message_action(MessageAction.EDIT, first_user.id)
    assert window.composer.edit.toPlainText() == "first question" and window.composer.button.text() == "Resend"
    window.composer.edit.setPlainText("first question, reworded")
    window.bridge.words = ["New", "answer."]
    qloop.run_until_complete(window.send(window.composer.edit.toPlainText()))
    assert reply_texts(store, conv) == ["first question, reworded", "New answer."]
    edited = store.thread(conv)[0]
    window.actions.show_version(edited.id, -1)
    assert [m.text for m in store.thread(conv)][::2] == ["first question", "second question"]
    assert window.bridge.requests[-1][-1]["content"] == "first question, reworded"
    sent = [m for m in window.bridge.requests[-1] if m["role"] != "system"]
    assert len(sent) == 1  # the later turns were not sent


def test_escape_cancels_an_edit(qtbot, window, qloop, store):
    qloop.run_until_complete(window.send("something"))
    window.pane.message_action(MessageAction.EDIT, store.thread(window.current)[0].id)
    window.pane.stop()
    assert window.composer.editing_id is None and window.composer.button.text() == "Send"


def test_rename_pin_delete_and_undo(window, store):
    first = window.current
    window.actions.rename(first, "Renamed")
    window.actions.new()
    second = window.current
    window.actions.toggle_pin(first)
    model = window.sidebar.model
    assert model.index(0).data() == "📌 Renamed"
    window.actions.delete(second)
    assert [c.id for c in store.conversations()] == [first]
    assert window.undo_button.isVisible()
    window.actions.undo_delete()
    assert {c.id for c in store.conversations()} == {first, second} and window.current == second


def test_export_markdown_and_json_then_import(session, qloop, store, tmp_path):
    conv = session.actions.current
    qloop.run_until_complete(session.controller.send(conv, "Hello there"))
    store.update_conversation(conv, system_prompt="Be brief.")
    markdown = to_markdown(store, conv)
    assert markdown.startswith("# Hello there") and "> **System:** Be brief." in markdown
    assert "## You\n\nHello there" in markdown and "Paris is the capital" in markdown
    session.actions.export(conv, tmp_path / "chat.json")
    data = json.loads((tmp_path / "chat.json").read_text())
    assert data["format"] == "kvasir-conversation" and len(data["messages"]) == 2
    imported = session.actions.import_file(tmp_path / "chat.json")
    assert imported != conv and session.actions.current == imported
    assert reply_texts(store, imported) == reply_texts(store, conv)
    assert store.conversation(imported).system_prompt == "Be brief."
    assert store.thread(imported)[1].stats == store.thread(conv)[1].stats


def test_import_refuses_what_is_not_a_conversation(store):
    with pytest.raises(ConversationImportError, match="not JSON"):
        from_json(store, "{nope")
    with pytest.raises(ConversationImportError, match="not a Kvasir conversation"):
        from_json(store, json.dumps({"messages": []}))
    future = json.loads(to_json(store, store.create_conversation("x").id))
    future["version"] = 99
    with pytest.raises(ConversationImportError, match="newer Kvasir"):
        from_json(store, json.dumps(future))


def test_a_failed_reply_says_so_and_keeps_the_text(window, qloop, store):
    window.bridge.finish_reason = "error"
    message = qloop.run_until_complete(window.send("break please"))
    assert message.status == "error" and message.text.startswith("Paris")
    assert "Failed" in window.chat.toPlainText()


def test_two_conversations_stream_at_once(session, qloop, store):
    import asyncio

    first = session.actions.current
    a = session.controller.send(first, "first chat")
    second = session.actions.new().id
    b = session.controller.send(second, "second chat")
    assert session.controller.is_generating(first) and session.controller.is_generating(second)
    qloop.run_until_complete(asyncio.gather(a, b))
    assert reply_texts(store, first)[1] == reply_texts(store, second)[1] == " ".join(FakeBridge().words)
    assert session.widgets_made() == set()  # no window was needed
