"""Importing a chat: the whole file is checked first, then written in one transaction; bad sampling is refused."""

import json
import math

import pytest

from app.data.export import ConversationImportError, _check_tree, from_json, to_json


@pytest.fixture
def export(store):
    """A valid export of a two-branch conversation, as a dict to spoil."""
    conv = store.create_conversation("Trip", settings={"temperature": 0.3, "skip_messages": 0})
    q = store.add_message(conv.id, "user", "Where to?")
    store.add_message(conv.id, "assistant", "Norway.", parent_id=q.id,
                      stats={"ttft_s": 0.1, "kept_draft_spans": [[0, 3], [4, 6]]})
    store.add_message(conv.id, "assistant", "Iceland.", parent_id=q.id, status="stopped")
    data = json.loads(to_json(store, conv.id))
    store.delete_conversation(conv.id)
    store.purge_deleted()
    return data


def rows(store):
    """Every conversation and message in the database, deleted or not."""
    return (store._db.execute("SELECT COUNT(*) FROM conversations").fetchone()[0],
            store._db.execute("SELECT COUNT(*) FROM messages").fetchone()[0])


def spoil(data, path, value):
    """Set data[path...] = value (``...`` removes the key)."""
    *parents, last = path
    target = data
    for key in parents:
        target = target[key]
    if value is ...:
        del target[last]
    else:
        target[last] = value
    return json.dumps(data, allow_nan=True)


def test_a_valid_export_imports_every_branch_with_the_head(store, export):
    conv_id = from_json(store, json.dumps(export))
    assert [m.text for m in store.thread(conv_id)] == ["Where to?", "Iceland."]
    assert sorted(m.text for m in store.all_messages(conv_id)) == ["Iceland.", "Norway.", "Where to?"]
    assert store.conversation(conv_id).settings == {"temperature": 0.3, "skip_messages": 0}
    norway = next(m for m in store.all_messages(conv_id) if m.text == "Norway.")
    assert norway.stats["kept_draft_spans"] == [[0, 3], [4, 6]]  # the drafted words' highlight comes along


@pytest.mark.parametrize(("path", "value", "reason"), [
    (("messages", 2, "status"), "exploded", "unknown status 'exploded'"),
    (("messages", 1, "text"), None, "'text' is NoneType, not text"),
    (("messages", 0, "role"), ..., "has no 'role'"),
    (("messages", 1, "role"), "system", "unknown role 'system'"),
    (("messages", 1, "parent"), 12345, "which is not in the file"),
    (("messages", 1, "created"), math.nan, "not a number JSON allows"),
    (("messages", 1, "stats"), {"ttft_s": "fast"}, "'ttft_s' is 'fast'"),
    (("messages", 1, "stats"), {"kept_draft_spans": [[4, 6], [0, 3]]}, "kept_draft_spans is not a list"),
    (("messages", 1, "stats"), {"kept_draft_spans": [[0, "3"]]}, "kept_draft_spans is not a list"),
    (("messages", 1, "id"), "one", "'id' is str"),
    (("messages", 0, "id"), True, "'id' is bool"),
    (("messages",), {"a": 1}, "'messages' is missing or not a list"),
    (("conversation",), ..., "'conversation' is not an object"),
    (("conversation", "head"), 999, "current message 999 is not in the file"),
    (("conversation", "settings"), {"temperature": -1}, "temperature"),
    (("conversation", "settings"), {"top_k": [3]}, "top_k"),
    (("conversation", "settings"), {"seed": "lucky"}, "seed"),
    (("conversation", "settings"), {"colour": "red"}, "unknown chat settings: colour"),
    (("version",), "1", "not a number"),
])
def test_a_bad_file_is_refused_with_the_reason_and_adds_nothing(store, export, path, value, reason):
    before = rows(store)
    with pytest.raises(ConversationImportError, match=None) as refused:
        from_json(store, spoil(export, path, value))
    assert reason in str(refused.value)
    assert rows(store) == before


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_non_finite_sampling_is_refused(store, export, value):
    """NaN and infinities are refused where they are read (the engine would refuse them too)."""
    before = rows(store)
    with pytest.raises(ConversationImportError, match="(NaN|Infinity) is not a number JSON allows"):
        from_json(store, spoil(export, ("conversation", "settings"), {"temperature": value}))
    assert rows(store) == before


def test_integer_fields_refuse_fractions(store, export):
    for key, value in (("seed", 1.5), ("top_k", 2.5)):
        with pytest.raises(ConversationImportError, match=key):
            from_json(store, spoil(json.loads(json.dumps(export)), ("conversation", "settings"), {key: value}))


def test_messages_that_loop_are_refused(store, export):
    messages = export["messages"]
    messages[0]["parent"] = messages[1]["id"]  # the question now answers its own reply
    with pytest.raises(ConversationImportError, match="loop back"):
        from_json(store, json.dumps(export))
    assert rows(store) == (0, 0)


def test_duplicate_ids_are_refused(store, export):
    export["messages"][2]["id"] = export["messages"][1]["id"]
    with pytest.raises(ConversationImportError, match="two messages have the id"):
        from_json(store, json.dumps(export))


def test_a_reply_listed_before_its_question_still_imports(store, export):
    export["messages"].reverse()
    for m in export["messages"]:
        m["created"] = 0.0  # no ordering help from the timestamps
    conv_id = from_json(store, json.dumps(export))
    assert [m.text for m in store.thread(conv_id)] == ["Where to?", "Iceland."]


def test_a_failure_while_writing_rolls_the_whole_import_back(store, export, monkeypatch):
    calls = []
    original = store.add_message

    def failing(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk full")
        return original(*args, **kwargs)

    monkeypatch.setattr(store, "add_message", failing)
    with pytest.raises(OSError):
        from_json(store, json.dumps(export))
    assert rows(store) == (0, 0)


def test_the_window_shows_why_an_import_failed(window, store, export, tmp_path, monkeypatch):
    warnings = []
    monkeypatch.setattr("app.window.chat_commands.QMessageBox.warning",
                        lambda parent, title, text: warnings.append(text))
    path = tmp_path / "bad.json"
    path.write_text(spoil(export, ("messages", 1, "status"), "weird"))
    before = [c.id for c in store.conversations()]
    assert window.chat_commands.import_file(path) is None
    assert "bad.json could not be imported" in warnings[0] and "unknown status 'weird'" in warnings[0]
    assert [c.id for c in store.conversations()] == before


@pytest.mark.timeout(60)
def test_the_loop_check_walks_each_message_once():
    """200,000 messages in one chain, newest first: linear, well under a second; the walk it replaced went over the
    chain once per message (about 320 s here), and this test's guard would stop it."""
    messages = [{"id": i, "parent": i - 1 if i else None} for i in reversed(range(200_000))]
    _check_tree(messages, head=199_999)
    messages[-1]["parent"] = 199_999  # the first message now answers the last: one loop through all of them
    with pytest.raises(ConversationImportError, match="loop back"):
        _check_tree(messages, head=199_999)
