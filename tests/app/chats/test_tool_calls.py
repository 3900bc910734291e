"""Tool calls through the chat: a reply that asks for a tool is stored with its call, the user is asked, the call
runs on a real MCP server (tests/helpers/mcp_server.py), its answer goes back to the model and the next reply
follows; refusals, "always allow", failures, and the bound on rounds."""

import pytest

from app.chats.tool_round import ALWAYS, MAX_ROUNDS, REFUSE, RUN
from app.data.tool_calls import ALLOWED, REFUSED_TEXT, REQUIRED, TOOL_CHOICE, TOOLS
from engine import Chat
from engine.templates.tool_calls import ToolCall
from tests.app.mcp.test_toolbox import TEST_SERVER
from tests.helpers.fake_engine import WORDS

pytestmark = pytest.mark.timeout(120)

ANSWER = " ".join(WORDS)
ADD = ToolCall("call_1", "add", '{"a": 2, "b": 40}')


@pytest.fixture
def chat(qloop, session):
    """The chat on screen with its Tools switch on, the test server's tools offered, and every question
    answered from ``session.answers`` (each question recorded in ``session.asked``)."""
    qloop.run_until_complete(session.tools.connect([TEST_SERVER]))
    session.answers, session.asked = [], []

    async def approve(conversation_id, call):
        session.asked.append((conversation_id, call["name"], call["arguments"]))
        return session.answers.pop(0)

    session.controller.tool_round.approve = approve
    current = session.actions.current
    session.conversations.set_setting(current, TOOLS, True)
    yield current
    qloop.run_until_complete(session.tools.close())


def test_an_approved_call_runs_and_its_answer_leads_to_the_next_reply(qloop, session, store, chat):
    session.bridge.tool_calls = [(ADD,)]
    session.answers = [RUN]
    final = qloop.run_until_complete(session.controller.send(chat, "What is 2 + 40?"))
    assert session.asked == [(chat, "add", '{"a": 2, "b": 40}')]
    user, asking, answering = store.thread(chat)  # read back from the database file
    assert asking.tool_calls == [{"id": "call_1", "name": "add", "arguments": '{"a": 2, "b": 40}',
                                  "status": "done", "result": "42"}]
    assert (answering.id, answering.parent_id, answering.text, answering.tool_calls) == (
        final.id, asking.id, ANSWER, [])
    first, second = session.bridge.prompts
    assert isinstance(first, Chat) and sorted(t["function"]["name"] for t in first.tools) == [
        "add", "broken", "picture", "slow"]
    assert second.messages[-2:] == [
        {"role": "assistant", "content": ANSWER, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ]


def test_the_requests_parse_tool_calls_only_where_the_chat_offers_tools(qloop, session, chat):
    assert session.controller.sampling_for(chat).parse_tool_calls is True
    session.conversations.set_setting(chat, TOOLS, False)
    assert session.controller.sampling_for(chat).parse_tool_calls is False
    assert session.controller.prompt_for_model(chat, "hi").tools == []


def test_a_refused_call_tells_the_model_the_user_refused(qloop, session, store, chat):
    session.bridge.tool_calls = [(ADD,)]
    session.answers = [REFUSE]
    qloop.run_until_complete(session.controller.send(chat, "What is 2 + 40?"))
    asking = store.thread(chat)[1]
    assert (asking.tool_calls[0]["status"], asking.tool_calls[0]["result"]) == ("refused", REFUSED_TEXT)
    assert session.bridge.prompts[-1].messages[-1] == {
        "role": "tool", "tool_call_id": "call_1", "content": f"Error: {REFUSED_TEXT}"}


def test_always_allow_stores_the_tool_for_the_chat_and_asks_no_more(qloop, session, store, chat):
    again = ToolCall("call_2", "add", '{"a": 1, "b": 1}')
    session.bridge.tool_calls = [(ADD,), (again,)]
    session.answers = [ALWAYS]
    qloop.run_until_complete(session.controller.send(chat, "Add twice."))
    assert len(session.asked) == 1
    assert store.conversation(chat).settings[ALLOWED] == ["add"]
    assert [m.tool_calls[0]["result"] for m in store.thread(chat)[1:3]] == ["42", "2"]


def test_a_failing_tool_ends_its_call_with_the_reason_and_the_chat_goes_on(qloop, session, store, chat):
    session.bridge.tool_calls = [(ToolCall("call_1", "broken", "{}"), ToolCall("call_2", "nope", "{}"))]
    session.answers = [RUN]  # an unknown tool is not asked about: it cannot run
    final = qloop.run_until_complete(session.controller.send(chat, "Break it."))
    asking = store.thread(chat)[1]
    assert [(c["status"], c["result"]) for c in asking.tool_calls] == [
        ("failed", "the tool reported an error: Error executing tool broken: the tool broke"),
        ("failed", "there is no tool named 'nope'")]
    assert final.text == ANSWER and final.status == "complete"


def test_a_hanging_tool_ends_at_the_timeout(qloop, session, store, chat):
    session.tools.timeout_s = 0.5
    session.bridge.tool_calls = [(ToolCall("call_1", "slow", "{}"),)]
    session.answers = [RUN]
    qloop.run_until_complete(session.controller.send(chat, "Wait."))
    call = store.thread(chat)[1].tool_calls[0]
    assert (call["status"], call["result"]) == ("failed", "the tool did not answer within 0.5 s")


def test_replies_stop_calling_after_the_last_round(qloop, session, store, chat):
    session.conversations.set_setting(chat, ALLOWED, ["add"])
    session.bridge.tool_calls = [(ToolCall(f"call_{i}", "add", '{"a": 1, "b": 2}'),) for i in range(MAX_ROUNDS + 2)]
    final = qloop.run_until_complete(session.controller.send(chat, "Loop."))
    replies = store.thread(chat)[1:]
    assert len(replies) == MAX_ROUNDS + 1 and session.bridge.streams == MAX_ROUNDS + 1
    assert final.tool_calls == [{"id": f"call_{MAX_ROUNDS}", "name": "add", "arguments": '{"a": 1, "b": 2}',
                                 "status": "failed", "result": f"not run: the reply already made {MAX_ROUNDS} "
                                                               "rounds of tool calls"}]
    assert store.message(final.id).tool_calls == final.tool_calls


def test_a_chat_on_a_remote_server_is_offered_the_same_tools_while_its_switch_is_on(session, chat):
    from app.data.remote_store import RemoteChoice

    here = session.controller.tools_for(chat)
    session.sources.run_on(chat, RemoteChoice("some-server", "some-model"))
    assert session.controller.tools_for(chat) == here and len(here) == 4
    session.conversations.set_setting(chat, TOOLS, False)
    assert session.controller.tools_for(chat) == []


def test_stopping_while_a_call_is_asked_about_ends_it_not_run(qloop, session, store, chat):
    import asyncio

    asked, never = asyncio.Event(), asyncio.Event()

    async def waiting(conversation_id, call):
        asked.set()
        await never.wait()

    session.controller.tool_round.approve = waiting
    session.bridge.tool_calls = [(ADD,)]
    task = session.controller.send(chat, "What is 2 + 40?")
    qloop.run_until_complete(asked.wait())
    session.controller.stop(chat)
    qloop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    assert task.cancelled() and not session.controller.is_generating(chat)
    asking = store.thread(chat)[-1]
    assert [(c["status"], c["result"]) for c in asking.tool_calls] == [("failed", "not run: the reply was stopped")]
    assert session.bridge.streams == 1


def test_a_chosen_tool_holds_the_first_reply_to_a_call_of_it_and_the_next_reply_is_free(qloop, session, chat):
    session.conversations.set_setting(chat, TOOL_CHOICE, "add")
    session.bridge.tool_calls = [(ADD,)]
    session.answers = [RUN]
    qloop.run_until_complete(session.controller.send(chat, "What is 2 + 40?"))
    first, second = session.bridge.samplings
    assert session.bridge.forced == [("add", "Fake-1M")]
    assert first.structure.spec == "start: one call of add" and first.parse_tool_calls
    assert second.structure is None  # the answer after the call is the model's to write


def test_required_forces_a_call_of_any_tool_and_a_tool_gone_counts_as_auto(qloop, session, chat):
    session.conversations.set_setting(chat, TOOL_CHOICE, REQUIRED)
    session.answers = [RUN]
    qloop.run_until_complete(session.controller.send(chat, "Use something."))
    assert len(session.asked) == 1  # the held reply called a tool; the reply after its result was free
    session.conversations.set_setting(chat, TOOL_CHOICE, "a-tool-no-server-offers")
    qloop.run_until_complete(session.controller.send(chat, "And now?"))
    assert session.bridge.forced == [(None, "Fake-1M")]
    assert [s.structure is not None for s in session.bridge.samplings] == [True, False, False]


def test_a_forced_call_the_model_cannot_make_ends_the_reply_with_the_reason(qloop, session, store, chat):
    def cannot(tools, name, model=None):
        raise ValueError("this model's template has no tool-call format")

    session.bridge.forced_call = cannot
    session.conversations.set_setting(chat, TOOL_CHOICE, "add")
    final = qloop.run_until_complete(session.controller.send(chat, "What is 2 + 40?"))
    assert (final.status, final.error) == ("error", "this model's template has no tool-call format")
    assert store.thread(chat)[0].text == "What is 2 + 40?"  # what the user wrote stays
