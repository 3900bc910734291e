"""The MCP toolbox against a real MCP server (tests/helpers/mcp_server.py, over stdio): listing, calling, and every
way a call can end."""

from __future__ import annotations

import sys

import pytest

from app.data.mcp_servers import McpServer
from app.mcp.results import DONE, FAILED
from app.mcp.toolbox import McpToolbox

pytestmark = pytest.mark.timeout(120)

TEST_SERVER = McpServer("tests", command=sys.executable, args=("-m", "tests.helpers.mcp_server"))


def run(qloop, coroutine):
    return qloop.run_until_complete(coroutine)


@pytest.fixture
def toolbox(qloop):
    box = McpToolbox(timeout_s=20)
    run(qloop, box.connect([TEST_SERVER]))
    yield box
    run(qloop, box.close())


def test_the_servers_tools_are_offered_with_their_schemas(toolbox):
    tools = {t["function"]["name"]: t for t in toolbox.tools()}
    assert sorted(tools) == ["add", "broken", "picture", "slow"]
    add = tools["add"]
    assert add["type"] == "function"
    assert add["function"]["description"] == "Add two whole numbers."
    assert add["function"]["parameters"]["properties"] == {"a": {"title": "A", "type": "integer"},
                                                           "b": {"title": "B", "type": "integer"}}
    assert add["function"]["parameters"]["required"] == ["a", "b"]
    assert toolbox.statuses == {"tests": "connected, 4 tools"}


def test_a_call_answers_with_the_tools_text(qloop, toolbox):
    outcome = run(qloop, toolbox.call("add", '{"a": 2, "b": 40}'))
    assert (outcome.status, outcome.text) == (DONE, "42")


def test_content_that_is_not_text_is_described(qloop, toolbox):
    outcome = run(qloop, toolbox.call("picture", "{}"))
    assert (outcome.status, outcome.text) == (DONE, "[image: image/png]\na red dot")


def test_a_tool_that_raises_ends_the_call_with_its_error(qloop, toolbox):
    outcome = run(qloop, toolbox.call("broken", "{}"))
    assert (outcome.status, outcome.text) == (
        FAILED, "the tool reported an error: Error executing tool broken: the tool broke")


def test_a_tool_that_hangs_ends_the_call_at_the_timeout(qloop, toolbox):
    toolbox.timeout_s = 0.5
    outcome = run(qloop, toolbox.call("slow", "{}"))
    assert (outcome.status, outcome.text) == (FAILED, "the tool did not answer within 0.5 s")
    assert run(qloop, toolbox.call("add", '{"a": 1, "b": 1}')).text == "2"  # the session still works


@pytest.mark.parametrize(("name", "arguments", "reason"), [
    ("nope", "{}", "there is no tool named 'nope'"),
    ("add", "{not json", "the arguments are not JSON (Expecting property name enclosed in double quotes: "
                         "line 1 column 2 (char 1))"),
    ("add", "[1, 2]", "the arguments must be a JSON object"),
])
def test_a_bad_call_ends_with_the_reason(qloop, toolbox, name, arguments, reason):
    outcome = run(qloop, toolbox.call(name, arguments))
    assert (outcome.status, outcome.text) == (FAILED, reason)


def test_wrong_arguments_end_the_call_with_the_servers_reason(qloop, toolbox):
    outcome = run(qloop, toolbox.call("add", '{"a": "two"}'))
    assert outcome.status == FAILED
    assert outcome.text.startswith("the tool reported an error:")


def test_a_server_that_cannot_start_says_why_and_offers_nothing(qloop):
    box = McpToolbox()
    missing = McpServer("missing", command="/nonexistent/kvasir-mcp-server")
    off = McpServer("off", command=sys.executable, enabled=False)
    run(qloop, box.connect([missing, off]))
    assert box.tools() == []
    assert box.statuses["off"] == "disabled"
    assert box.statuses["missing"].startswith("not connected: ")
    assert "kvasir-mcp-server" in box.statuses["missing"]


def test_names_two_servers_share_are_prefixed_with_the_server(qloop):
    box = McpToolbox()
    twin = McpServer("twin server", command=sys.executable, args=("-m", "tests.helpers.mcp_server"))
    run(qloop, box.connect([TEST_SERVER, twin]))
    try:
        names = sorted(t["function"]["name"] for t in box.tools())
        assert names[:2] == ["tests__add", "tests__broken"]
        assert "twin_server__add" in names and len(names) == 8
        assert run(qloop, box.call("twin_server__add", '{"a": 3, "b": 4}')).text == "7"
    finally:
        run(qloop, box.close())


def test_a_server_that_never_answers_is_given_up_at_the_connect_timeout(qloop):
    box = McpToolbox()
    box.connect_timeout_s = 0.5
    mute = McpServer("mute", command=sys.executable, args=("-c", "import time; time.sleep(60)"))
    run(qloop, box.connect([mute]))
    assert box.statuses == {"mute": "not connected: mute did not answer within 0.5 s"} and box.tools() == []
