"""Tool calls in the window: the Use tools switch, the question before a call (answered by clicking its box's
buttons), and the calls under the reply in the transcript, closed then opened, also after the chat is reopened."""

import pytest
from PySide6.QtCore import Qt, QTimer

from app.data.tool_calls import AUTO, TOOL_CHOICE, TOOLS
from app.window.tool_approval import ToolApproval
from engine.templates.tool_calls import ToolCall
from tests.app.mcp.test_toolbox import TEST_SERVER

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tools_window(window, qloop):
    qloop.run_until_complete(window.session.tools.connect([TEST_SERVER]))
    yield window
    qloop.run_until_complete(window.session.tools.close())


def answer_with(monkeypatch, label: str, asked: list):
    """Every question box clicks its button ``label`` as soon as it shows; its text goes to ``asked``."""
    question = ToolApproval.question

    def clicking(self, call):
        box, answers = question(self, call)
        asked.append((box.text(), box.informativeText()))
        button = next(b for b in answers if b.text() == label)
        QTimer.singleShot(0, button.click)
        return box, answers

    monkeypatch.setattr(ToolApproval, "question", clicking)


def test_the_switch_shows_with_the_servers_tools_and_sets_the_chat(tools_window, qtbot, store):
    switch = tools_window.pane.tools
    assert switch.isVisible() and switch.text() == "Use tools (4)" and not switch.isChecked()
    qtbot.mouseClick(switch, Qt.LeftButton)
    assert store.conversation(tools_window.current).settings[TOOLS] is True


def test_the_tool_choice_shows_while_the_switch_is_on_and_sets_the_chat(tools_window, qtbot, store):
    switch, choice = tools_window.pane.tools, tools_window.pane.tool_choice
    assert choice.isHidden()
    qtbot.mouseClick(switch, Qt.LeftButton)
    assert choice.isVisible() and choice.currentData() == AUTO
    assert [choice.itemText(i) for i in range(choice.count())] == [
        "Model decides", "Must call a tool", "Call add", "Call broken", "Call picture", "Call slow"]
    choice.setCurrentIndex(2)
    choice.activated.emit(2)
    chat = tools_window.current
    assert store.conversation(chat).settings[TOOL_CHOICE] == "add"
    tools_window.actions.new()
    assert choice.isHidden()  # a new chat has its tools off
    tools_window.actions.open(chat)
    assert choice.isVisible() and choice.currentText() == "Call add"
    qtbot.mouseClick(switch, Qt.LeftButton)
    assert choice.isHidden()


def test_an_approved_call_shows_under_the_reply_closed_then_open(tools_window, qloop, store, monkeypatch, qtbot):
    asked = []
    answer_with(monkeypatch, "Run", asked)
    window = tools_window
    qtbot.mouseClick(window.pane.tools, Qt.LeftButton)
    window.bridge.tool_calls = [(ToolCall("call_1", "add", '{"a": 2, "b": 40}'),)]
    qloop.run_until_complete(window.flow.send("What is 2 + 40?"))
    assert asked == [("The model wants to run the tool “add”.",
                      'With these arguments:<pre>{\n  &quot;a&quot;: 2,\n  &quot;b&quot;: 40\n}</pre>'
                      "Nothing runs unless you allow it.")]
    asking = store.thread(window.current)[1]
    line = window.chat.message_widget(asking.id).tool_calls.lines[0]
    assert line.isVisible() and line.toggle.text() == "▸ Tool call: add · done" and line.text_view.isHidden()
    qtbot.mouseClick(line.toggle, Qt.LeftButton)
    assert line.toggle.text() == "▾ Tool call: add · done"
    assert line.text_view.text() == 'Arguments:\n{\n  "a": 2,\n  "b": 40\n}\n\nResult:\n42'
    chat = window.current
    window.actions.new()
    window.actions.open(chat)
    again = window.chat.message_widget(asking.id).tool_calls.lines[0]
    assert again.toggle.text() == "▸ Tool call: add · done"


def test_a_refused_call_says_so_in_the_transcript(tools_window, qloop, store, monkeypatch, qtbot):
    answer_with(monkeypatch, "Refuse", [])
    window = tools_window
    qtbot.mouseClick(window.pane.tools, Qt.LeftButton)
    window.bridge.tool_calls = [(ToolCall("call_1", "add", '{"a": 2, "b": 40}'),)]
    qloop.run_until_complete(window.flow.send("What is 2 + 40?"))
    asking = store.thread(window.current)[1]
    line = window.chat.message_widget(asking.id).tool_calls.lines[0]
    qtbot.mouseClick(line.toggle, Qt.LeftButton)
    assert line.toggle.text() == "▾ Tool call: add · refused"
    assert line.text_view.text().endswith("Reason:\nthe user refused to run this tool")
