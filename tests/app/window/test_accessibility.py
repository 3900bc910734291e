"""Every control has a name a screen reader can say, and the window works from the keyboard alone: a tab order
through sidebar, transcript, composer and panel, message actions as focusable buttons, and the whole path from
a new chat to copying a reply without the mouse."""

import asyncio
import re

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QAccessible, QGuiApplication
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QAbstractSlider,
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QHeaderView,
    QLineEdit,
    QPlainTextEdit,
    QScrollBar,
    QTextEdit,
    QWidget,
)

from app.data.settings import DEFAULTS, load_presets
from app.data.store import Message
from app.dialogs.chat_settings import ChatSettingsDialog
from app.dialogs.preferences import PreferencesDialog
from app.transcript.view import ChatView
from app.window.commands import ShortcutsDialog

INTERACTIVE = (QAbstractButton, QLineEdit, QTextEdit, QPlainTextEdit, QComboBox, QAbstractSpinBox, QAbstractSlider,
               QAbstractItemView)


def _part_of_another_control(widget: QWidget) -> bool:
    """A spin box's line edit, a combo box's list, a line edit's clear button, a scroll area's bars, a tree's
    header, a table's select-all corner: the control they belong to carries the name."""
    if isinstance(widget, QScrollBar) or isinstance(widget, QHeaderView) and isinstance(
            widget.parentWidget(), QAbstractItemView):
        return True
    if widget.objectName() == "qt_tableview_cornerbutton":
        return True
    parent = widget.parentWidget()
    while parent is not None:
        if isinstance(parent, (QAbstractSpinBox, QComboBox, QLineEdit)):
            return True
        parent = parent.parentWidget()
    return False


def unnamed_controls(root: QWidget) -> list[str]:
    """Every interactive widget under ``root`` whose accessible name (what a screen reader says: its own name,
    its text, or its form label) has no word in it."""
    missing = []
    for widget in [root, *root.findChildren(QWidget)]:
        if not isinstance(widget, INTERACTIVE) or _part_of_another_control(widget):
            continue
        interface = QAccessible.queryAccessibleInterface(widget)
        name = interface.text(QAccessible.Name) if interface is not None else ""
        if not re.search(r"\w", name or ""):
            missing.append(f"{type(widget).__name__} {widget.objectName() or ''} {name!r} in "
                           f"{type(widget.parentWidget()).__name__}")
    return missing


def a_thread_with_everything() -> list[Message]:
    """A user message with two versions, and a reply cut at max_tokens with a code block in it."""
    return [
        Message(1, 1, None, "user", "Sort a list?", 0.0),
        Message(2, 1, 1, "assistant", "Like this:\n\n```python\nsorted(xs)\n```\n\nSee [docs](https://docs.python.org)",
                1.0, model="SmolLM2", stats={"ttft_s": 0.05, "output_tokens": 9, "finish_reason": "length"}),
    ]


def test_every_control_of_the_main_window_has_a_name(window, qloop):
    qloop.run_until_complete(window.send("hello"))
    window.banner.show_load_failed("no weights")  # its buttons too
    window.undo_button.show()
    assert window.findChildren(QAbstractButton) and unnamed_controls(window) == []


def test_every_control_of_the_dialogs_has_a_name(qtbot, store):
    from app.data.personas import Personas

    presets = load_presets()
    dialogs = [PreferencesDialog(presets, DEFAULTS, None),
               ChatSettingsDialog(Personas(store, presets), None, "Be brief.", DEFAULTS["sampling"]),
               ShortcutsDialog()]
    for dialog in dialogs:
        qtbot.addWidget(dialog)
        assert unnamed_controls(dialog) == [], dialog.windowTitle()


def test_every_control_of_the_transcript_has_a_name(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.show_thread(a_thread_with_everything(), versions={1: (2, 2), 2: (1, 3)})
    buttons = view.message_widget(2).findChildren(QAbstractButton)
    assert {b.text() for b in buttons} >= {"Copy", "Continue", "Regenerate", "‹", "›"}
    assert unnamed_controls(view) == []


def test_the_check_finds_a_control_without_a_name(qtbot):
    from PySide6.QtWidgets import QToolButton, QVBoxLayout

    box = QWidget()
    qtbot.addWidget(box)
    layout = QVBoxLayout(box)
    layout.addWidget(QComboBox())
    layout.addWidget(QToolButton(text="›"))
    named = QToolButton(text="›")
    named.setAccessibleName("Later version")
    layout.addWidget(named)
    assert [m.split()[0] for m in unnamed_controls(box)] == ["QComboBox", "QToolButton"]


def run_until(loop, condition, timeout_s: float = 5.0) -> None:
    """Run the asyncio loop (which streams the replies) until ``condition()`` holds."""
    async def wait() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    loop.run_until_complete(asyncio.wait_for(wait(), timeout_s))


def tab_walk(start: QWidget, steps: int, backwards: bool = False) -> list[QWidget]:
    """The widgets focus visits from ``start`` pressing Tab (or Shift+Tab) ``steps`` times."""
    from PySide6.QtTest import QTest

    start.setFocus()
    visited = []
    for _ in range(steps):
        QTest.keyClick(QApplication.focusWidget(), Qt.Key_Tab, Qt.ShiftModifier if backwards else Qt.NoModifier)
        visited.append(QApplication.focusWidget())
    return visited


def test_tab_goes_from_the_sidebar_through_the_transcript_to_the_composer_and_the_panel(window, qloop):
    qloop.run_until_complete(window.send("hello"))
    window.actions.new()
    qloop.run_until_complete(window.send("again"))
    visited = tab_walk(window.sidebar.search, 40)

    def first(predicate) -> int:
        return next(i for i, w in enumerate(visited) if predicate(w))

    in_chat = first(lambda w: w is window.chat or window.chat.isAncestorOf(w))
    reply_copy = visited.index(window.chat.last_widget().button("Copy"))
    composer = visited.index(window.composer.edit)
    send = visited.index(window.composer.button)
    panel = first(lambda w: window.panel.isAncestorOf(w) or w is window.panel)
    assert visited.index(window.sidebar.view) < in_chat < reply_copy < composer < send < panel
    # the transcript in reading order: the first message's buttons before the reply's
    user_copy = visited.index(window.chat.message_widget(window.chat._order[0]).button("Copy"))
    assert in_chat <= user_copy < reply_copy
    assert window.composer.edit.toPlainText() == ""  # Tab left the message box without typing a tab


def test_shift_tab_from_the_composer_reaches_the_last_replys_buttons(window, qloop):
    qloop.run_until_complete(window.send("hello"))
    reply = window.chat.last_widget()
    visited = tab_walk(window.composer.edit, 2, backwards=True)
    assert visited == [reply.button("Regenerate"), reply.button("Copy")]
    assert reply._opacity.opacity() == 1.0


def test_keyboard_only_new_chat_type_send_stop_and_copy_the_reply(qtbot, window, qloop):
    """Ctrl+N, type, Enter, Esc while it streams, Shift+Tab to the reply's Copy, Space: the clipboard holds it."""
    first_chat = window.current
    qtbot.keyClick(window, Qt.Key_N, Qt.ControlModifier)
    assert window.current != first_chat and QApplication.focusWidget() is window.composer.edit
    window.bridge.gate = asyncio.Event()  # the reply holds after two words, so there is time to stop it
    qtbot.keyClicks(QApplication.focusWidget(), "Tell me about Paris")
    with qtbot.wait_signal(window.controller.reply_started, timeout=5000):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Return)
    run_until(qloop, lambda: window.composer.button.text() == "Stop" and window.chat.last_widget().text == "Paris is")
    with qtbot.wait_signal(window.controller.reply_finished, timeout=5000) as finished:
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Escape)
        run_until(qloop, lambda: not window.controller.is_generating(window.current))
    assert finished.args[1].status == "stopped" and finished.args[1].text == "Paris is"
    qtbot.waitUntil(lambda: window.chat.last_widget().button("Copy") is not None
                    and window.chat.last_widget().button("Regenerate") is not None)
    QGuiApplication.clipboard().clear()
    for _ in range(2):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key_Tab, Qt.ShiftModifier)
    copy = window.chat.last_widget().button("Copy")
    assert QApplication.focusWidget() is copy
    qtbot.keyClick(copy, Qt.Key_Space)
    assert QGuiApplication.clipboard().text() == "Paris is"
    window.bridge.gate.set()


@pytest.mark.parametrize("text", ["Edit", "Copy"])
def test_a_users_message_actions_are_buttons_in_the_tab_order(qtbot, text):
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.show_thread(a_thread_with_everything())
    button = view.message_widget(1).button(text)
    assert button in view.focusables() and button.focusPolicy() & Qt.TabFocus


def test_a_code_block_that_appears_while_streaming_joins_the_tab_order_in_place(qtbot):
    from app.transcript.blocks import CodeBlock
    from app.window.composer import Composer

    box = QWidget()
    qtbot.addWidget(box)
    from PySide6.QtWidgets import QVBoxLayout

    layout = QVBoxLayout(box)
    view, composer = ChatView(), Composer()
    layout.addWidget(view)
    layout.addWidget(composer)
    box.show()
    live = Message(2, 1, 1, "assistant", "", 1.0, status="partial")
    view.show_thread([Message(1, 1, None, "user", "code?", 0.0), live], {2: "Here:"})
    view.update_streaming(2, "Here:\n\n```python\nprint(1)\n```\n\nand more")
    qtbot.waitUntil(lambda: bool(view.message_widget(2).findChildren(CodeBlock)))
    (block,) = view.message_widget(2).findChildren(CodeBlock)
    order = [view.nextInFocusChain()]
    while order[-1] is not view:
        order.append(order[-1].nextInFocusChain())
    assert order.index(block.copy_button) < order.index(composer.edit)  # before the composer, not after it


def test_a_screen_reader_hears_when_the_reply_ends_and_reads_its_numbers(window, qloop):
    message = qloop.run_until_complete(window.send("hello"))
    assert window.chat.last_announcement == f"Reply finished, {len(window.bridge.words)} tokens"
    reply = window.chat.message_widget(message.id)
    assert reply.accessibleName() == "Reply" and reply.accessibleDescription().startswith("TTFT 50 ms")


def test_the_announcement_says_how_the_reply_ended():
    from app.transcript.view import finished_announcement

    assert finished_announcement(Message(2, 1, 1, "assistant", "x", 1.0, status="stopped",
                                         stats={"output_tokens": 3})) == "Reply stopped, 3 tokens"
    assert finished_announcement(Message(2, 1, 1, "assistant", "", 1.0, status="error",
                                         error="out of memory")) == "The reply failed: out of memory"
    cut = Message(2, 1, 1, "assistant", "x", 1.0, stats={"finish_reason": "length", "output_tokens": 64})
    assert finished_announcement(cut) == "Reply cut at the length limit; Continue writes on, 64 tokens"


@pytest.mark.parametrize("message_id, text, action", [
    (1, "Edit", "edit"), (1, "‹", "previous"), (1, "›", "next"),
    (2, "Continue", "continue"), (2, "Regenerate", "regenerate"),
])
def test_every_message_action_works_from_the_keyboard(qtbot, message_id, text, action):
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    view.show_thread(a_thread_with_everything(), versions={1: (2, 3)})
    asked = []
    view.action.connect(lambda kind, mid: asked.append((kind.value, mid)))
    button = view.message_widget(message_id).button(text)
    assert button in view.focusables()
    button.setFocus()
    qtbot.keyClick(button, Qt.Key_Space)
    assert asked == [(action, message_id)]


def test_from_the_search_enter_opens_the_first_match_and_down_moves_into_the_list(qtbot, window, qloop):
    qloop.run_until_complete(window.send("bananas are yellow"))
    bananas = window.current
    window.actions.new()
    qloop.run_until_complete(window.send("the sky is blue"))
    qtbot.keyClick(window, Qt.Key_F, Qt.ControlModifier)
    qtbot.keyClicks(window.sidebar.search, "banana")
    qtbot.keyClick(window.sidebar.search, Qt.Key_Return)
    assert window.current == bananas and QApplication.focusWidget() is window.composer.edit
    window.sidebar.search.clear()
    window.sidebar.search.setFocus()
    qtbot.keyClick(window.sidebar.search, Qt.Key_Down)
    assert QApplication.focusWidget() is window.sidebar.view and window.sidebar.view.currentIndex().row() == 0
    qtbot.keyClick(window.sidebar.view, Qt.Key_Down)
    qtbot.keyClick(window.sidebar.view, Qt.Key_Return)
    assert window.current == window.sidebar.model.index(1).data(Qt.UserRole + 1)
