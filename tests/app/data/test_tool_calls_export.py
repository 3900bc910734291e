"""A reply's tool calls go through JSON export and import whole; an import with calls that are not calls is
refused, naming the message and what is wrong, and changes nothing."""

import json

import pytest

from app.data.export import ConversationImportError, from_json, to_json

CALL = {"id": "call_1", "name": "add", "arguments": '{"a": 2, "b": 40}', "status": "done", "result": "42"}


def test_calls_survive_export_and_import(store):
    conv = store.create_conversation("tools")
    user = store.add_message(conv.id, "user", "2 + 40?")
    store.add_message(conv.id, "assistant", "Let me add.", parent_id=user.id, tool_calls=[CALL])
    copy = from_json(store, to_json(store, conv.id))
    assert [m.tool_calls for m in store.thread(copy)] == [[], [CALL]]


@pytest.mark.parametrize(("calls", "reason"), [
    ("add", "'tool_calls' is str, not a list"),
    ([{"id": "call_1"}], "tool call 1 needs the texts id, name, arguments, status, result"),
    ([{**CALL, "status": "exploded"}], "tool call 1 has an unknown status 'exploded'"),
])
def test_bad_calls_are_refused_by_name(store, calls, reason):
    conv = store.create_conversation("tools")
    store.add_message(conv.id, "assistant", "hm")
    data = json.loads(to_json(store, conv.id))
    data["messages"][0]["tool_calls"] = calls
    before = len(store.conversations())
    with pytest.raises(ConversationImportError) as raised:
        from_json(store, json.dumps(data))
    assert reason in str(raised.value) and "message 1" in str(raised.value)
    assert len(store.conversations()) == before


def test_markdown_shows_each_call_closed_with_its_arguments_and_result(store):
    from app.data.export import to_markdown

    conv = store.create_conversation("tools")
    store.add_message(conv.id, "assistant", "Let me add.", tool_calls=[CALL])
    assert to_markdown(store, conv.id).endswith(
        "Let me add.\n\n<details>\n<summary>Tool call: add · done</summary>\n\n```\nArguments:\n{\n  \"a\": 2,\n"
        "  \"b\": 40\n}\n\nResult:\n42\n```\n\n</details>\n")
