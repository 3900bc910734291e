"""Every keyboard shortcut does what its menu says, and the Keyboard shortcuts dialog lists each one."""

import asyncio

import pytest
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication, QDialog

from app.data.settings import DEFAULTS
from app.window.commands import COMMANDS, IN_PLACE, ShortcutsDialog, key_text

BOUND = [(c.name, keys) for c in COMMANDS for keys in c.keys]


def press(qtbot, window, keys: str) -> None:
    """Press ``keys`` where the focus is, as the user would."""
    combination = QKeySequence(keys)[0]
    target = QApplication.focusWidget() or window
    qtbot.keyClick(target, combination.key(), combination.keyboardModifiers())


def run(loop, coroutine_or_task):
    return loop.run_until_complete(coroutine_or_task)


class Recorded(QDialog):
    """Stands in for a dialog the shortcut opens: records that it was asked, answers Cancel."""

    opened: list = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__()
        Recorded.opened.append(type(self).__name__)

    def exec(self) -> int:
        return 0

    def open(self) -> None:
        pass


def check_new_chat(qtbot, window, loop, monkeypatch, keys):
    before = window.current
    press(qtbot, window, keys)
    assert window.current != before and window.conversations.get(window.current).title == "New chat"


def check_import_chat(*args):
    raise AssertionError("Import has no shortcut")


def check_preferences(qtbot, window, loop, monkeypatch, keys):
    monkeypatch.setattr("app.window.main_window.PreferencesDialog", type("PreferencesDialog", (Recorded,), {}))
    Recorded.opened = []
    press(qtbot, window, keys)
    assert Recorded.opened == ["PreferencesDialog"]


def check_quit(qtbot, window, loop, monkeypatch, keys):
    press(qtbot, window, keys)
    assert not window.isVisible()


def check_regenerate(qtbot, window, loop, monkeypatch, keys):
    run(loop, window.send("Hello"))
    first = window.conversations.thread(window.current)[-1]
    press(qtbot, window, keys)
    run(loop, asyncio.gather(*window.controller.tasks.values()))
    last = window.conversations.thread(window.current)[-1]
    assert last.id != first.id and last.role == "assistant" and last.parent_id == first.parent_id
    assert window.bridge.streams == 2


def check_stop(qtbot, window, loop, monkeypatch, keys):
    window.bridge.gate = asyncio.Event()
    task = window.send("Tell me more")
    run(loop, asyncio.sleep(0.05))
    press(qtbot, window, keys)
    message = run(loop, task)
    assert message.status == "stopped" and not window.controller.is_generating(window.current)


def check_chat_settings(qtbot, window, loop, monkeypatch, keys):
    monkeypatch.setattr("app.window.chat_pane.ChatSettingsDialog", type("ChatSettingsDialog", (Recorded,), {}))
    Recorded.opened = []
    press(qtbot, window, keys)
    assert Recorded.opened == ["ChatSettingsDialog"]


def check_rename_chat(qtbot, window, loop, monkeypatch, keys):
    asked = []
    monkeypatch.setattr("app.window.chat_commands.QInputDialog.getText",
                        lambda parent, title, label, text: asked.append(text) or ("Trip to Oslo", True))
    press(qtbot, window, keys)
    assert asked == ["New chat"] and window.conversations.get(window.current).title == "Trip to Oslo"


def check_pin_chat(qtbot, window, loop, monkeypatch, keys):
    press(qtbot, window, keys)
    assert window.conversations.get(window.current).pinned
    press(qtbot, window, keys)
    assert not window.conversations.get(window.current).pinned


def check_export_markdown(*args):
    raise AssertionError("Export has no shortcut")


check_export_json = check_export_markdown


def check_delete_chat(qtbot, window, loop, monkeypatch, keys):
    doomed = window.current
    window.actions.new()
    window.actions.open(doomed)
    press(qtbot, window, keys)
    assert doomed not in [c.id for c in window.conversations.all()] and window.current != doomed


def check_undo_delete(qtbot, window, loop, monkeypatch, keys):
    doomed = window.current
    window.actions.delete(doomed)
    assert QApplication.focusWidget() is window.composer.edit  # where the user is when the notice shows
    press(qtbot, window, keys)
    assert doomed in [c.id for c in window.conversations.all()] and window.current == doomed


def test_ctrl_z_in_the_message_box_undoes_typing_first(qtbot, window):
    doomed = window.current
    window.actions.delete(doomed)
    qtbot.keyClicks(window.composer.edit, "draft")
    press(qtbot, window, "Ctrl+Z")
    assert window.composer.edit.toPlainText() == "" and doomed not in [c.id for c in window.conversations.all()]
    press(qtbot, window, "Ctrl+Z")  # nothing left to undo in the box: the chat comes back
    assert doomed in [c.id for c in window.conversations.all()]


def check_search(qtbot, window, loop, monkeypatch, keys):
    window.sidebar.search.setText("old query")
    press(qtbot, window, keys)
    assert QApplication.focusWidget() is window.sidebar.search and window.sidebar.search.selectedText() == "old query"


def check_focus_composer(qtbot, window, loop, monkeypatch, keys):
    window.sidebar.view.setFocus()
    press(qtbot, window, keys)
    assert QApplication.focusWidget() is window.composer.edit


def check_toggle_panel(qtbot, window, loop, monkeypatch, keys):
    assert window.panel.isVisible()
    press(qtbot, window, keys)
    assert not window.panel.isVisible() and not window.model_bar.panel_button.isChecked()
    press(qtbot, window, keys)
    assert window.panel.isVisible() and window.commands["toggle_panel"].isChecked()


def check_text_larger(qtbot, window, loop, monkeypatch, keys):
    press(qtbot, window, keys)
    assert window.settings["text_scale"] == 110
    press(qtbot, window, keys)
    assert window.settings["text_scale"] == 125


def check_text_smaller(qtbot, window, loop, monkeypatch, keys):
    press(qtbot, window, keys)
    assert window.settings["text_scale"] == 90


def check_text_reset(qtbot, window, loop, monkeypatch, keys):
    window.set_text_scale(175)
    press(qtbot, window, keys)
    assert window.settings["text_scale"] == DEFAULTS["text_scale"] == 100


def check_highlight_drafts(qtbot, window, loop, monkeypatch, keys):
    window.commands["highlight_drafts"].trigger()  # a menu command without keys of its own
    assert window.chat.highlight_drafts and window.settings["highlight_drafts"]
    window.commands["highlight_drafts"].trigger()
    assert not window.chat.highlight_drafts and not window.settings["highlight_drafts"]


def test_the_highlight_command_turns_the_highlight_on_and_off(qtbot, window, qloop, monkeypatch):
    check_highlight_drafts(qtbot, window, qloop, monkeypatch, ())


def check_choose_model(qtbot, window, loop, monkeypatch, keys):
    press(qtbot, window, keys)
    box = window.model_bar.model_box
    assert box.view().isVisible() and box.view().window() is not window  # its list is open
    box.hidePopup()
    assert QApplication.focusWidget() is box


def check_model_manager(qtbot, window, loop, monkeypatch, keys):
    class ModelDialog(Recorded):
        load_requested = window.model_bar.switch_requested  # any signal: the window connects to it

    monkeypatch.setattr("app.window.main_window.ModelDialog", ModelDialog)
    Recorded.opened = []
    press(qtbot, window, keys)
    assert Recorded.opened == ["ModelDialog"]


def opens_its_dialog(window, monkeypatch, command: str, dialog: str) -> None:
    """The menu command ``command``, one without keys of its own, opens the main window's ``dialog``."""
    monkeypatch.setattr(f"app.window.main_window.{dialog}", type(dialog, (Recorded,), {}))
    Recorded.opened = []
    window.commands[command].trigger()
    assert Recorded.opened == [dialog]


def check_remote_servers(qtbot, window, loop, monkeypatch, keys):
    opens_its_dialog(window, monkeypatch, "remote_servers", "RemoteServersDialog")


def check_routing(qtbot, window, loop, monkeypatch, keys):
    opens_its_dialog(window, monkeypatch, "routing", "RoutingDialog")


def check_about(qtbot, window, loop, monkeypatch, keys):
    opens_its_dialog(window, monkeypatch, "about", "AboutDialog")


@pytest.mark.parametrize("command", ["remote_servers", "routing", "about"])
def test_the_menu_command_opens_its_dialog(qtbot, window, qloop, monkeypatch, command):
    globals()[f"check_{command}"](qtbot, window, qloop, monkeypatch, ())


def check_shortcuts(qtbot, window, loop, monkeypatch, keys):
    press(qtbot, window, keys)
    dialog = window.shortcuts_dialog
    assert dialog.isVisible()
    dialog.close()


@pytest.mark.parametrize("name, keys", BOUND, ids=[f"{n}-{k}" for n, k in BOUND])
def test_the_shortcut_does_what_its_menu_says(qtbot, window, qloop, monkeypatch, name, keys):
    window.composer.edit.setFocus()
    globals()[f"check_{name}"](qtbot, window, qloop, monkeypatch, keys)


def test_every_command_has_a_check_here():
    assert all(f"check_{c.name}" in globals() for c in COMMANDS)


def test_the_menus_show_every_command_with_its_keys(window):
    menus = {a.text(): a.menu() for a in window.menuBar().actions()}
    assert list(menus) == ["&File", "&Chat", "&View", "&Models", "&Help"]
    shown = {action.text(): action.shortcuts() for menu in menus.values() for action in menu.actions()}
    for command in COMMANDS:
        assert [s.toString() for s in shown[command.label]] == [QKeySequence(k).toString() for k in command.keys]


def test_the_shortcuts_dialog_lists_every_shortcut(qtbot):
    dialog = ShortcutsDialog()
    qtbot.addWidget(dialog)
    rows = dialog.rows()
    for command in COMMANDS:
        if command.keys:
            assert (command.label, key_text(command.keys), "") in rows
    for label, keys, where in IN_PLACE:
        assert (label, keys, where) in rows
    assert ("Larger text", "Ctrl+=, Ctrl++", "") in rows and ("Keyboard shortcuts", "Ctrl+/, F1", "") in rows


def test_no_two_commands_share_a_key():
    keys = [QKeySequence(k).toString() for c in COMMANDS for k in c.keys]
    assert len(keys) == len(set(keys))
