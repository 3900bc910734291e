"""A thinking model's replies through the app: the reasoning streams beside the answer and is stored with the
reply (a stopped reply keeps what arrived), goes back to the model as ``reasoning_content`` inside a Chat with the
chat's template options, which the context meter counts; a remote server's reasoning is kept the same way, and
the server is not sent ``reasoning_content``."""

import asyncio

from engine import Chat
from tests.helpers.fake_engine import THOUGHT_S, WORDS, FakeStream, _output
from tests.helpers.openai_stub import StubServer

THOUGHTS = "The user wants the capital . It is Paris .".split()


def _thinking(session) -> int:
    session.bridge.thoughts = list(THOUGHTS)
    return session.actions.current


def test_reasoning_streams_apart_from_the_answer_and_is_stored_with_its_figures(qloop, session, store):
    chat = _thinking(session)
    seen = []
    session.controller.reply_delta.connect(
        lambda c, reply_id, text: seen.append((text, session.controller.live_reasoning(reply_id))))
    qloop.run_until_complete(session.controller.send(chat, "What is the capital of France?"))
    first_text, first = seen[0]
    assert first_text == "" and first.text == "The" and first.thinking and first.summary() == "Thinking… 1 token"
    middle_text, middle = seen[len(THOUGHTS) - 1]
    assert middle_text == "" and middle.text == " ".join(THOUGHTS) and middle.thinking
    answering_text, answering = seen[len(THOUGHTS)]
    assert answering_text == "Paris" and not answering.thinking
    reply = store.thread(chat)[-1]  # read back from the database file, not the cache
    assert reply.text == " ".join(WORDS) and reply.reasoning == " ".join(THOUGHTS)
    assert reply.stats["reasoning_tokens"] == len(THOUGHTS)
    assert reply.stats["reasoning_s"] == round(len(THOUGHTS) * THOUGHT_S, 6)


def test_the_history_carries_each_replys_reasoning_inside_a_chat_with_the_chats_options(qloop, session):
    chat = _thinking(session)
    qloop.run_until_complete(session.controller.send(chat, "first"))
    session.bridge.thoughts = []  # the second reply does not think: its message carries no reasoning_content
    qloop.run_until_complete(session.controller.send(chat, "second"))
    session.conversations.set_setting(chat, "think", False)
    qloop.run_until_complete(session.controller.send(chat, "third"))
    prompt = session.bridge.prompts[-1]
    assert isinstance(prompt, Chat) and prompt.options == {"enable_thinking": False}
    answer = " ".join(WORDS)
    assert prompt.messages[1:] == [  # after the persona's system prompt
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": answer, "reasoning_content": " ".join(THOUGHTS)},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "third"},
    ]
    assert session.bridge.prompts[0].options == {}  # thinking is on by default: no option is sent


def test_the_context_meter_counts_the_chat_as_it_is_sent(qtbot, qloop, session):
    from app.chats.context_meter import ContextMeter

    chat = _thinking(session)
    meter = ContextMeter(session)
    qloop.run_until_complete(session.controller.send(chat, "one two three"))
    with qtbot.wait_signal(meter.counted) as counted:
        meter.recount()
        qloop.run_until_complete(meter.task)
    counted_prompt = session.bridge.counted[-1]
    assert counted_prompt == session.controller.prompt_for_model(chat)
    assert counted_prompt.messages[-1]["reasoning_content"] == " ".join(THOUGHTS)
    # the words of the system prompt, both messages and the reasoning, and 4 a message (the fake's count)
    system = len(counted_prompt.messages[0]["content"].split())
    assert counted.args[0] == system + 3 + len(WORDS) + len(THOUGHTS) + 3 * 4
    with qtbot.wait_signal(meter.counted) as recounted:  # the switch changes the options: counted again
        session.conversations.set_setting(chat, "think", False)
        qloop.run_until_complete(meter.task)
    assert session.bridge.counted[-1].options == {"enable_thinking": False}
    assert recounted.args[0] == counted.args[0] + 3


def test_a_stopped_reply_keeps_the_reasoning_that_arrived(qloop, session, store):
    chat = _thinking(session)
    session.bridge.gate = asyncio.Event()  # holds the stream after two pieces of reasoning
    task = session.controller.send(chat, "What is the capital of France?")
    qloop.run_until_complete(asyncio.sleep(0.05))
    session.controller.stop(chat)
    stopped = qloop.run_until_complete(task)
    assert stopped.status == "stopped" and stopped.text == ""
    assert stopped.reasoning == " ".join(THOUGHTS[:2]) and stopped.stats["reasoning_tokens"] == 2
    assert store.message(stopped.id).reasoning == " ".join(THOUGHTS[:2])


def test_a_reply_the_app_closed_on_keeps_its_reasoning(qloop, session, store):
    chat = _thinking(session)
    session.bridge.gate = asyncio.Event()
    task = session.controller.send(chat, "What is the capital of France?")
    qloop.run_until_complete(asyncio.sleep(0.05))
    session.controller.keep_unfinished_now()
    kept = store.thread(chat)[-1]
    assert kept.status == "stopped" and kept.reasoning == " ".join(THOUGHTS[:2])
    task.cancel()
    qloop.run_until_complete(asyncio.gather(task, return_exceptions=True))


def test_a_remote_servers_reasoning_is_kept_and_not_sent_back(qloop, session, store, monkeypatch):
    with StubServer() as stub:
        server = session.remote.save_server("Stub", stub.url, None)
        qloop.run_until_complete(session.remote.refresh_models(server.id))
        chat = session.actions.current
        from app.data.remote_store import RemoteChoice

        session.sources.run_on(chat, RemoteChoice(server.id, "stub-model"))
        real_stream = session.remote.stream

        def reasoning_stream(choice, messages, sampling, tool_choice=None):
            async def outputs():
                yield _output("", 1, None, (), "Thinking hard", 1)
                yield _output("Paris", 2, "stop", (), "Thinking hard", 1)
            return FakeStream("remote-1", outputs())

        monkeypatch.setattr(session.remote, "stream", reasoning_stream)
        qloop.run_until_complete(session.controller.send(chat, "capital?"))
        reply = store.thread(chat)[-1]
        assert (reply.text, reply.reasoning, reply.stats["reasoning_tokens"]) == ("Paris", "Thinking hard", 1)
        monkeypatch.setattr(session.remote, "stream", real_stream)
        qloop.run_until_complete(session.controller.send(chat, "and Spain?"))
        sent = stub.requests[-1]["messages"]
        assert sent[-2] == {"role": "assistant", "content": "Paris"}  # no reasoning_content for the server
        assert "chat_template_kwargs" not in stub.requests[-1]
