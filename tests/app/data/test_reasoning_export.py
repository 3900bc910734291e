"""A reply's reasoning in exports: a closed <details> block above the answer in Markdown, a field in JSON that an
import reads back; the chat's "think" setting travels with it and a wrong value is refused."""

import json

import pytest

from app.data.export import ConversationImportError, from_json, to_json, to_markdown


def _thought_chat(store):
    conv = store.create_conversation("thinking", settings={"think": False})
    user = store.add_message(conv.id, "user", "Capital of France?")
    store.add_message(conv.id, "assistant", "Paris.", parent_id=user.id, reasoning="France's capital: Paris </details>",
                      stats={"reasoning_tokens": 312, "reasoning_s": 4.2, "output_tokens": 320})
    return conv


def test_markdown_puts_the_reasoning_in_a_closed_block_above_the_answer(store):
    markdown = to_markdown(store, _thought_chat(store).id)
    block = ("<details>\n<summary>Thought for 4.2 s, 312 tokens</summary>\n\n"
             "France's capital: Paris &lt;/details>\n\n</details>\n\nParis.")
    assert block in markdown
    assert markdown.count("<details>") == 1 and "## You\n\nCapital of France?\n" in markdown


def test_json_keeps_the_reasoning_and_the_switch_and_an_import_reads_them_back(store):
    conv = _thought_chat(store)
    exported = to_json(store, conv.id)
    assert json.loads(exported)["messages"][0].get("reasoning") is None  # the question has none
    imported = from_json(store, exported)
    reply = store.thread(imported)[-1]
    assert reply.reasoning == "France's capital: Paris </details>" and reply.stats["reasoning_tokens"] == 312
    assert store.conversation(imported).settings["think"] is False


def test_an_import_refuses_a_think_setting_that_is_not_true_or_false(store):
    data = json.loads(to_json(store, _thought_chat(store).id))
    data["conversation"]["settings"]["think"] = "sometimes"
    with pytest.raises(ConversationImportError, match="think='sometimes' is not true or false"):
        from_json(store, json.dumps(data))
    data["conversation"]["settings"]["think"] = True
    data["messages"][1]["reasoning"] = 5
    with pytest.raises(ConversationImportError, match="'reasoning' is int, not text"):
        from_json(store, json.dumps(data))
