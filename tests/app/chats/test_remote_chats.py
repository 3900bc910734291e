"""Chats on a remote server, in a real window: the loopback stub server streams, stalls, cuts off or is not
there at all; the local engine is the scripted bridge, which must not be asked for remote replies."""

import asyncio
import json

import pytest
from PySide6.QtCore import Qt

from app.chats.tool_round import RUN
from app.data.remote_store import RemoteChoice, choice_of
from app.data.tool_calls import TOOL_CHOICE, TOOLS
from app.dialogs.remote_servers import RemoteServerListModel, RemoteServersDialog, ServerDialog
from app.panel.remote_panel import NOT_REPORTED
from app.transcript.view import MessageAction
from app.window.model_bar import REMOTE_ROLE, index_of
from tests.app.mcp.test_toolbox import TEST_SERVER
from tests.helpers.openai_stub import StubServer, free_port
from tests.helpers.signal_waits import run_until

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")

VLLM_METRICS = """# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="stub-model"} 0.37
vllm:prefix_cache_queries_total{engine="0",model_name="stub-model"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="stub-model"} 520.0
vllm:num_requests_running{engine="0",model_name="stub-model"} 2.0
vllm:num_requests_waiting{engine="0",model_name="stub-model"} 0.0
"""


@pytest.fixture(autouse=True)
def no_keyring():
    """No test here may reach the user's own keyring: none is available, as on a headless machine."""
    import keyring
    from keyring.backends import fail

    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(previous)


@pytest.fixture
def stub():
    with StubServer() as server:
        yield server


@pytest.fixture
def remote(window, qloop, stub):
    """The stub added as a server named "Stub", its models fetched."""
    server = window.remote.save_server("Stub", stub.url, None)
    qloop.run_until_complete(window.remote.refresh_models(server.id))
    return server


def pick(window, choice: RemoteChoice) -> None:
    """Choose ``choice`` in the model bar as a user would."""
    box = window.model_bar.model_box
    index = index_of(box, choice)
    assert index >= 0, [box.itemText(i) for i in range(box.count())]
    box.setCurrentIndex(index)
    box.activated.emit(index)


def on_remote(window, remote) -> RemoteChoice:
    choice = RemoteChoice(remote.id, "stub-model")
    pick(window, choice)
    return choice


def test_the_servers_models_follow_the_local_ones_in_the_model_bar(window, qloop, remote):
    dead = window.remote.save_server("Gone", f"http://127.0.0.1:{free_port()}", None)
    qloop.run_until_complete(window.remote.refresh_models(dead.id))
    box = window.model_bar.model_box
    texts = [box.itemText(i) for i in range(box.count())]
    local = [e.name for e in window.library.entries()]
    assert texts[: len(local)] == local and "Stub · stub-model" in texts
    assert box.itemData(texts.index("Stub · stub-model"), REMOTE_ROLE) == RemoteChoice(remote.id, "stub-model")
    gone = texts.index("Gone · unreachable")
    assert not box.model().item(gone).isEnabled() and "could not connect" in box.itemData(gone, Qt.ToolTipRole)


def test_a_chat_set_on_a_remote_model_streams_from_the_server(window, qloop, store, stub, remote):
    choice = on_remote(window, remote)
    assert choice_of(store.conversation(window.current)) == choice
    assert window.side.panels.currentWidget() is window.remote_panel and not window.model_bar.quant_box.isEnabled()
    assert window.model_bar.device_label.text() == f"remote · {stub.url}"
    message = qloop.run_until_complete(window.send("What is the capital of France?"))
    assert message.status == "complete" and message.text == "Paris is the capital of France."
    assert message.model == "Stub · stub-model" and message.quantization is None
    assert (message.stats["prompt_tokens"], message.stats["cached_prompt_tokens"]) == (40, 32)
    assert message.stats["ttft_s"] > 0 and message.stats["queue_time_s"] is None
    assert window.bridge.requests == []  # the local engine was not asked
    assert stub.requests[0]["messages"][-1] == {"role": "user", "content": "What is the capital of France?"}
    assert stub.requests[0]["max_tokens"] == window.controller.sampling_for(window.current).max_tokens
    text = window.chat.toPlainText()
    assert "Kvasir · Stub · stub-model" in text and "32 of 40 prompt tokens from cache" in text
    assert window.remote_panel.text("Decode (last reply)").endswith("(7 tokens)")
    assert window.remote_panel.text("TTFT (last / median)").endswith("ms")


def test_stop_closes_the_stream_and_keeps_what_arrived(qtbot, window, qloop, store, stub, remote):
    stub.behaviour, stub.pieces, stub.stall_s = "stall", 2, 30
    on_remote(window, remote)
    task = window.send("Tell me more")
    run_until(qloop, window.controller.reply_delta, lambda _, __, text: text == "Paris is")
    assert window.composer.button.text() == "Stop"
    with qtbot.wait_signal(window.controller.reply_finished, timeout=5000) as finished:
        qtbot.keyClick(window, Qt.Key_Escape)
        qloop.run_until_complete(asyncio.gather(task, return_exceptions=True))
    _, message = finished.args
    assert message.status == "stopped" and message.text == "Paris is" and len(stub.requests) == 1


def test_a_server_that_is_not_there_ends_the_reply_with_the_reason(qtbot, window, qloop, store):
    server = window.remote.save_server("Gone", f"http://127.0.0.1:{free_port()}", None)
    window.switcher.use_remote(RemoteChoice(server.id, "some-model"))  # chosen earlier, while it was up
    message = qloop.run_until_complete(window.send("hello?"))
    assert message.status == "error" and "could not connect to http://127.0.0.1:" in message.error
    assert window.composer.button.text() == "Send" and store.thread(window.current)[0].text == "hello?"
    assert "could not connect" in window.chat.toPlainText()


def test_a_reply_cut_mid_stream_keeps_its_text_and_says_why(window, qloop, stub, remote):
    stub.behaviour, stub.pieces = "cut", 3
    on_remote(window, remote)
    message = qloop.run_until_complete(window.send("hi"))
    assert message.status == "error" and message.text == "Paris is the"
    assert "closed the connection mid-reply" in message.error


def test_regenerate_and_edit_run_on_the_chats_server(window, qloop, store, stub, remote):
    on_remote(window, remote)
    qloop.run_until_complete(window.send("first question"))
    stub.words = ["Still", " Paris."]
    qloop.run_until_complete(window.flow.regenerate())
    last = store.thread(window.current)[-1]
    assert last.text == "Still Paris." and len(store.siblings(last.id)) == 2 and len(stub.requests) == 2
    first_user = store.thread(window.current)[0]
    window.pane.message_action(MessageAction.EDIT, first_user.id)
    stub.words = ["New", " answer."]
    qloop.run_until_complete(window.send("first question, reworded"))
    assert [m.text for m in store.thread(window.current)] == ["first question, reworded", "New answer."]
    assert stub.requests[-1]["messages"][-1]["content"] == "first question, reworded"
    assert window.bridge.requests == []


def test_continue_adds_to_a_cut_reply_without_repeating_it(window, qloop, store, stub, remote):
    on_remote(window, remote)
    conversation = window.conversations.get(window.current)
    window.conversations.configure(window.current, conversation.preset, conversation.system_prompt,
                                   {**conversation.settings, "max_tokens": 3})
    cut = qloop.run_until_complete(window.send("hi"))
    assert (cut.text, cut.stats["finish_reason"]) == ("Paris is the", "length")
    assert window.chat.message_widget(cut.id).button("Continue") is not None
    window.conversations.configure(window.current, conversation.preset, conversation.system_prompt,
                                   {**conversation.settings, "max_tokens": 16})
    more = qloop.run_until_complete(window.flow.continue_reply(cut.id))  # the stub repeats the reply, as llama-server
    assert more.id == cut.id and more.text == "Paris is the capital of France." and more.status == "complete"
    assert stub.requests[-1]["messages"][-1] == {"role": "assistant", "content": "Paris is the"}


def test_switching_chats_switches_the_engine_the_bar_and_the_panel(window, qloop, store, stub, remote):
    remote_chat = window.current
    choice = on_remote(window, remote)
    window.switcher.use_remote(choice)
    local_chat = window.conversations.create("local one").id
    window.actions.open(local_chat)
    assert window.side.panels.currentWidget() is window.panel and window.model_bar.quant_box.isEnabled()
    assert window.remote.watched is None and window.model_bar.model_box.currentData(REMOTE_ROLE) is None
    qloop.run_until_complete(window.send("local question"))
    assert len(window.bridge.requests) == 1 and stub.requests == []
    window.actions.open(remote_chat)
    assert window.model_bar.model_box.currentData(REMOTE_ROLE) == choice and window.remote.watched == remote.id
    assert window.side.panels.currentWidget() is window.remote_panel
    qloop.run_until_complete(window.send("remote question"))
    assert len(stub.requests) == 1 and len(window.bridge.requests) == 1


def test_a_new_chat_runs_where_the_chat_on_screen_runs(window, remote):
    choice = on_remote(window, remote)
    window.actions.new()
    assert choice_of(window.conversations.get(window.current)) == choice
    assert window.model_bar.model_box.currentData(REMOTE_ROLE) == choice


def test_picking_a_local_model_returns_the_chat_to_the_local_engine_without_a_reload(window, qloop, remote):
    from engine import EngineConfig

    window.bridge.config = EngineConfig(model="default", quantization="auto")
    on_remote(window, remote)
    assert window.switcher.switch(EngineConfig(model="default", quantization="auto")) is None
    assert choice_of(window.conversations.get(window.current)) is None
    assert window.side.panels.currentWidget() is window.panel and window.model_bar.quant_box.isEnabled()


def test_the_panel_shows_the_servers_kv_usage_and_hit_rate(qtbot, window, qloop, stub, remote):
    stub.metrics_text = VLLM_METRICS
    on_remote(window, remote)
    panel = window.remote_panel
    run_until(qloop, window.remote.metrics_updated, lambda *_: panel.text("Usage") == "37%")
    assert panel.text("Prefix hit rate") == "52% of prompt tokens (since the server started)"
    assert panel.text("Requests") == "2 running, 0 waiting" and panel.text("Metrics") == "from vLLM's /metrics"
    assert panel.text("Server") == "Stub" and panel.text("Model") == "stub-model"


def test_the_panel_says_what_a_server_does_not_report(qtbot, window, qloop, stub, remote):
    on_remote(window, remote)  # the stub's metrics are a current llama-server's: a hit rate, no KV usage
    panel = window.remote_panel
    run_until(qloop, window.remote.metrics_updated, lambda *_: panel.text("Usage") == NOT_REPORTED)
    assert panel.text("Prefix hit rate").startswith("25% of prompt tokens")
    assert not panel.plot_layout.isRowVisible(panel.usage_plot) and panel.plot_layout.isRowVisible(panel.hit_plot)
    stub.metrics_text = None  # /metrics answers 404, like Ollama's
    run_until(qloop, window.remote.metrics_updated, lambda *_: panel.text("Prefix hit rate") == NOT_REPORTED)
    assert "HTTP 404" in panel.text("Metrics")


def test_a_removed_server_says_so_when_its_chat_is_used(window, qloop, remote):
    on_remote(window, remote)
    window.remote.remove_server(remote.id)
    message = qloop.run_until_complete(window.send("still there?"))
    assert message.status == "error" and "has been removed" in message.error
    assert "removed server · stub-model" in [window.model_bar.model_box.itemText(i)
                                             for i in range(window.model_bar.model_box.count())]


def test_the_server_list_model_passes_the_model_tester(qtmodeltester, window, qloop, stub, remote):
    model = RemoteServerListModel(window.remote)
    qtmodeltester.check(model)
    assert "Stub — " + stub.url in model.index(0).data() and "1 model: stub-model" in model.index(0).data()
    window.remote.save_server("Second", "http://127.0.0.1:1", None)
    assert model.rowCount() == 2  # follows the engines without a refresh by hand


def test_the_dialog_tests_the_connection_and_saves_the_server(qtbot, window, qloop, stub):
    dialog = ServerDialog(window.remote, None, window)
    qtbot.addWidget(dialog)
    dialog.name.setText("Lab")
    dialog.url.setText(stub.url + "/v1")
    qloop.run_until_complete(dialog.test_connection())
    assert "Connected: 1 model (stub-model); its metrics come from llama.cpp" in dialog.status.text()
    dialog.accept()
    assert dialog.result() == ServerDialog.Accepted
    assert [(s.name, s.base_url) for s in window.remote.servers()] == [("Lab", stub.url)]


def test_the_dialog_keeps_what_was_typed_when_it_cannot_save(qtbot, window):
    dialog = ServerDialog(window.remote, None, window)
    qtbot.addWidget(dialog)
    dialog.name.setText("Lab")
    dialog.url.setText("gpu-box:8000")
    dialog.accept()
    assert "Not saved" in dialog.status.text() and "start it with http" in dialog.status.text()
    assert dialog.url.text() == "gpu-box:8000" and window.remote.servers() == []


def test_the_dialog_warns_before_a_key_goes_over_plain_http(qtbot, window):
    dialog = ServerDialog(window.remote, None, window)
    qtbot.addWidget(dialog)
    dialog.url.setText("http://10.1.2.3:8000")
    dialog.key.setText("sk-1")
    assert "travels unencrypted" in dialog.status.text()
    dialog.url.setText("http://127.0.0.1:8000")
    assert dialog.status.text() == ""
    assert dialog.where.text().startswith("No system keyring is available on this computer, so the API key is kept")
    assert str(window.remote.store.path) in dialog.where.text()


def test_a_key_saved_without_a_keyring_is_used_and_kept_private(window, qloop, stub):
    import os
    import stat

    stub.api_key = "sk-stub"
    dialog = ServerDialog(window.remote, None, window)
    dialog.name.setText("Keyed")
    dialog.url.setText(stub.url)
    dialog.key.setText("sk-stub")
    dialog.accept()
    server = dialog.saved
    assert server.key_in == "file" and stat.S_IMODE(os.stat(window.remote.store.path).st_mode) == 0o600
    qloop.run_until_complete(window.remote.refresh_models(server.id))
    assert [m.id for m in window.remote.models[server.id]] == ["stub-model"]  # the key was sent


def test_removing_a_server_asks_first(qtbot, window, monkeypatch, remote):
    from PySide6.QtWidgets import QMessageBox

    dialog = RemoteServersDialog(window.remote, window)
    qtbot.addWidget(dialog)
    dialog.view.setCurrentIndex(dialog.model.index(0))
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.No))
    dialog.remove_selected()
    assert len(window.remote.servers()) == 1
    monkeypatch.setattr(QMessageBox, "question", staticmethod(lambda *a, **k: QMessageBox.Yes))
    dialog.remove_selected()
    assert window.remote.servers() == [] and not dialog.empty.isHidden()


def test_switching_the_local_model_does_not_ask_about_remote_replies(window, qloop, monkeypatch, stub, remote):
    from engine import EngineConfig

    stub.behaviour, stub.pieces, stub.stall_s = "stall", 1, 30
    on_remote(window, remote)
    remote_chat = window.current
    task = window.send("a long one")
    run_until(qloop, window.controller.reply_delta, lambda *_: True)
    window.actions.open(window.conversations.create("local").id)
    asked = []
    monkeypatch.setattr(window.switcher, "confirm", lambda writing: asked.append(writing) or True)
    qloop.run_until_complete(window.switcher.switch(EngineConfig(model="default", quantization="int8")))
    assert asked == [] and window.controller.is_generating(remote_chat)  # the remote reply goes on
    window.controller.stop(remote_chat)
    assert qloop.run_until_complete(asyncio.gather(task, return_exceptions=True))[0].status == "stopped"


def test_a_remote_chat_exports_and_imports_with_where_it_runs(window, qloop, tmp_path, stub, remote):
    from app.data.export import ConversationImportError, from_json, to_json

    choice = on_remote(window, remote)
    qloop.run_until_complete(window.send("hi"))
    text = to_json(window.store, window.current)
    imported = from_json(window.store, text)
    assert choice_of(window.store.conversation(imported)) == choice
    damaged = json.loads(text)
    damaged["conversation"]["settings"]["remote"]["model"] = 7
    with pytest.raises(ConversationImportError, match="must name a server and a model"):
        from_json(window.store, json.dumps(damaged))


def test_a_server_that_never_answers_does_not_hold_up_the_window(qtbot, window, qloop, monkeypatch):
    import socket

    from PySide6.QtCore import QTimer

    from engine.remote import RemoteConfig

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)  # never accepted: once its backlog is full, connections get no answer
        port = listener.getsockname()[1]
        fillers = [socket.socket() for _ in range(3)]
        for filler in fillers:
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
        server = window.remote.save_server("Silent", f"http://127.0.0.1:{port}", None)
        monkeypatch.setattr(window.remote.store, "config", lambda server_id: RemoteConfig(
            f"http://127.0.0.1:{port}", connect_timeout_s=0.4, connect_retries=1))
        window.switcher.use_remote(RemoteChoice(server.id, "m"))
        ticks = []
        timer = QTimer(interval=20, timeout=lambda: ticks.append(1))
        timer.start()
        try:
            message = qloop.run_until_complete(window.send("anyone there?"))
        finally:
            timer.stop()
            for filler in fillers:
                filler.close()
    assert message.status == "error" and "no answer within the connect timeout" in message.error
    assert len(ticks) >= 20  # the window's event loop ran all along (about 1 s of waiting, a tick every 20 ms)


def test_a_remote_chat_offers_the_mcp_tools_and_runs_the_call_the_server_streams(window, qloop, store, stub, remote):
    session = window.session
    qloop.run_until_complete(session.tools.connect([TEST_SERVER]))
    try:
        on_remote(window, remote)
        chat = window.current
        session.conversations.set_setting(chat, TOOLS, True)
        session.conversations.set_setting(chat, TOOL_CHOICE, "add")
        assert not window.pane.tools.isHidden() and window.pane.tools.isChecked()

        async def approve(conversation_id, call):
            return RUN

        session.controller.tool_round.approve = approve
        stub.plan, stub.calls = ["tool_call", "ok"], [{"id": "call_9", "name": "add", "arguments": '{"a": 2, "b": 40}'}]
        final = qloop.run_until_complete(window.send("What is 2 + 40?"))
        asking_request, answering_request = stub.requests
        assert sorted(t["function"]["name"] for t in asking_request["tools"]) == ["add", "broken", "picture", "slow"]
        assert asking_request["tool_choice"] == {"type": "function", "function": {"name": "add"}}
        assert "tool_choice" not in answering_request  # only the first reply is held to the call
        assert answering_request["messages"][-2:] == [
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_9", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 40}'}}]},
            {"role": "tool", "tool_call_id": "call_9", "content": "42"}]
        user, asking, answering = store.thread(chat)
        assert asking.tool_calls == [{"id": "call_9", "name": "add", "arguments": '{"a": 2, "b": 40}',
                                      "status": "done", "result": "42"}]
        assert answering.id == final.id and answering.text == "Paris is the capital of France."
        assert window.bridge.requests == []  # the local engine was not asked
    finally:
        qloop.run_until_complete(session.tools.close())
