"""A tool call on the real engine with the bundled model, against the real test MCP server: the bundled model never
calls tools by itself, so the chat's tool choice holds its first reply to a call of ``add`` (constrained decoding
in its Hermes format). The call's arguments are the model's own and fit the tool's schema, the call runs once
approved, its answer goes back, and the model writes the next reply freely."""

from __future__ import annotations

import json

import jsonschema
import pytest

from app.chats.tool_round import RUN
from app.data.tool_calls import TOOL_CHOICE, TOOLS
from engine import EngineConfig
from tests.app.mcp.test_toolbox import TEST_SERVER

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def real_session(qtbot, qloop, store, tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("KVASIR_CONFIG_DIR", str(tmp_path / "config"))
    from app.chats.session import ChatSession
    from app.engines.bridge import EngineBridge

    bridge = EngineBridge()
    session = ChatSession(store, bridge)
    with qtbot.wait_signal(bridge.loaded, timeout=120_000):
        bridge.start(EngineConfig(model="default", device="cpu", kv_disk_cache=False))
    qloop.run_until_complete(session.tools.connect([TEST_SERVER]))
    yield session
    qloop.run_until_complete(session.tools.close())
    bridge.shutdown()


def test_the_bundled_model_calls_the_chosen_tool_and_answers_with_its_result(real_session, qloop, store):
    session = real_session
    chat = session.actions.new().id
    settings = session.conversations.get(chat).settings
    store.update_conversation(chat, system_prompt="", settings={
        **settings, TOOLS: True, TOOL_CHOICE: "add", "temperature": 0.0, "max_tokens": 40})
    asked = []

    async def approve(conversation_id, call):
        asked.append(call["name"])
        return RUN

    session.controller.tool_round.approve = approve
    final = qloop.run_until_complete(session.controller.send(chat, "What is 2 + 40?"))
    user, asking, answering = store.thread(chat)
    (call,) = asking.tool_calls
    schema = next(t["function"]["parameters"] for t in session.tools.tools() if t["function"]["name"] == "add")
    arguments = json.loads(call["arguments"])
    jsonschema.validate(arguments, schema)
    assert asked == ["add"] and call["name"] == "add"
    assert (call["status"], call["result"]) == ("done", str(arguments["a"] + arguments["b"]))
    assert asking.text == "" and asking.status == "complete"
    assert answering.id == final.id and answering.tool_calls == [] and answering.text.strip() != ""
