"""Every command of the window with its keys, in one table: the menus are built from it, and the "Keyboard
shortcuts" dialog (Ctrl+/ or F1) lists it, so what the user reads is what the keys do."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QMainWindow,
    QToolButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
)


@dataclass(frozen=True, slots=True)
class Command:
    """A menu command: ``name`` is what the window binds it to; ``keys`` in Qt's portable notation, the first
    one shown in the menu."""

    name: str
    label: str
    menu: str
    keys: tuple[str, ...] = ()
    checkable: bool = False


MENUS = ("&File", "&Chat", "&View", "&Models", "&Help")
COMMANDS = (
    Command("new_chat", "New chat", "&File", ("Ctrl+N",)),
    Command("import_chat", "Import chat…", "&File"),
    Command("preferences", "Preferences…", "&File", ("Ctrl+,",)),
    Command("quit", "Quit", "&File", ("Ctrl+Q",)),
    Command("regenerate", "Regenerate the last reply", "&Chat", ("Ctrl+R",)),
    Command("stop", "Stop the reply (or stop editing)", "&Chat", ("Esc",)),
    Command("chat_settings", "Chat settings: persona and sampling…", "&Chat", ("Ctrl+Shift+S",)),
    Command("rename_chat", "Rename chat…", "&Chat", ("F2",)),
    Command("pin_chat", "Pin or unpin chat", "&Chat", ("Ctrl+Shift+P",)),
    Command("export_markdown", "Export chat as Markdown…", "&Chat"),
    Command("export_json", "Export chat as JSON…", "&Chat"),
    Command("delete_chat", "Delete chat", "&Chat", ("Ctrl+Shift+Backspace",)),
    Command("undo_delete", "Undo delete", "&Chat", ("Ctrl+Z",)),
    Command("search", "Search chats", "&View", ("Ctrl+F",)),
    Command("focus_composer", "Write a message", "&View", ("Ctrl+L",)),
    Command("toggle_panel", "Engine panel", "&View", ("Ctrl+J",), checkable=True),
    Command("text_larger", "Larger text", "&View", ("Ctrl+=", "Ctrl++")),
    Command("text_smaller", "Smaller text", "&View", ("Ctrl+-",)),
    Command("text_reset", "Text size 100 %", "&View", ("Ctrl+0",)),
    Command("highlight_drafts", "Highlight drafted words", "&View", checkable=True),
    Command("choose_model", "Choose the model", "&Models", ("Ctrl+K",)),
    Command("model_manager", "Model manager…", "&Models", ("Ctrl+M",)),
    Command("remote_servers", "Remote servers…", "&Models"),
    Command("routing", "Routing: which model answers an Auto chat…", "&Models"),
    Command("shortcuts", "Keyboard shortcuts", "&Help", ("Ctrl+/", "F1")),
    Command("about", "About Kvasir", "&Help"),
)
# Keys that work in one place rather than through a menu, listed in the dialog too.
IN_PLACE = (
    ("Send the message", "Enter", "in the message box"),
    ("New line in the message", "Shift+Enter", "in the message box"),
    ("Open the first chat found", "Enter", "in the search"),
    ("Go to the list of chats", "Down", "in the search"),
    ("Open the chat", "Enter", "in the chat list"),
    ("Rename chat", "F2", "in the chat list"),
    ("Delete chat", "Del", "in the chat list"),
    ("All a chat's actions", "Menu", "in the chat list"),
    ("Move between parts of the window", "Tab, Shift+Tab", "sidebar, conversation, message box, panel"),
    ("Press a focused button (Copy, Edit, Regenerate…)", "Space", "in the conversation"),
)


def add_menus(window: QMainWindow, handlers: dict[str, Callable]) -> dict[str, QAction]:
    """The menus of :data:`COMMANDS` on ``window``: each command an action with its keys, calling its handler
    (a checkable one with its state), added to the window too so the keys work while the menu bar is hidden."""
    menus = {title: window.menuBar().addMenu(title) for title in MENUS}
    actions = {}
    for command in COMMANDS:
        action = QAction(command.label, window)
        action.setShortcuts([QKeySequence(k) for k in command.keys])
        action.setCheckable(command.checkable)
        if command.checkable:
            action.toggled.connect(handlers[command.name])
        else:
            action.triggered.connect(lambda _=False, handler=handlers[command.name]: handler())
        menus[command.menu].addAction(action)
        window.addAction(action)
        actions[command.name] = action
    more = window.menuBar().findChild(QToolButton, "qt_menubar_ext_button")  # shown when the menus don't fit
    if more is not None:
        more.setAccessibleName("More menus")
    return actions


def key_text(keys: tuple[str, ...] | str) -> str:
    """``keys`` as this platform spells them ("Ctrl+N", or "⌘N" on macOS)."""
    if isinstance(keys, str):
        return keys
    return ", ".join(QKeySequence(k).toString(QKeySequence.NativeText) for k in keys)


class ShortcutsDialog(QDialog):
    """The keyboard shortcuts, by menu, then the keys that work in one place."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        self.table = QTreeWidget()
        self.table.setAccessibleName("Keyboard shortcuts")
        self.table.setColumnCount(3)
        self.table.setHeaderLabels(["Command", "Keys", "Where"])
        self.table.setRootIsDecorated(False)
        self.table.setAlternatingRowColors(True)
        for menu in MENUS:
            self._add_group(menu.replace("&", ""), [(c.label, key_text(c.keys), "")
                                                    for c in COMMANDS if c.menu == menu and c.keys])
        self._add_group("In place", [(label, keys, where) for label, keys, where in IN_PLACE])
        self.table.expandAll()
        header = self.table.header()
        header.setSectionResizeMode(0, QHeaderView.ResizeToContents)
        header.setSectionResizeMode(1, QHeaderView.ResizeToContents)
        header.setStretchLastSection(True)
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(buttons)
        self.resize(760, 600)

    def _add_group(self, title: str, rows: list[tuple[str, str, str]]) -> None:
        group = QTreeWidgetItem(self.table, [title])
        font = group.font(0)
        font.setBold(True)
        group.setFont(0, font)
        group.setFlags(group.flags() & ~Qt.ItemIsSelectable)
        group.setFirstColumnSpanned(True)
        for row in rows:
            QTreeWidgetItem(group, list(row))

    def rows(self) -> list[tuple[str, str, str]]:
        """Every (command, keys, where) the dialog lists."""
        found = []
        for g in range(self.table.topLevelItemCount()):
            group = self.table.topLevelItem(g)
            found += [tuple(group.child(i).text(c) for c in range(3)) for i in range(group.childCount())]
        return found
