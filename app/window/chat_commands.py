"""The Chat menu's and the sidebar's commands on one chat: rename, pin, export and delete, and importing a chat.

The dialogs that ask for a title or a file are here; what happens to the chat is :class:`ConversationActions`'.
"""

from __future__ import annotations

import re
from pathlib import Path

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox, QWidget

from ..chats.session import ChatSession
from .sidebar import ChatAction, ConversationSidebar


class ChatCommands(QObject):
    """Commands on a chat, asking through dialogs over ``parent``."""

    def __init__(self, session: ChatSession, sidebar: ConversationSidebar, parent: QWidget) -> None:
        super().__init__(parent)
        self.session, self.sidebar, self.parent_widget = session, sidebar, parent
        sidebar.action_requested.connect(self.act)

    def on_current(self, action: ChatAction) -> None:
        """The Chat menu: the chat highlighted in the list while it has focus, else the chat on screen."""
        if self.sidebar.view.hasFocus():
            self.sidebar.act_on_highlighted(action)
        elif self.session.actions.current is not None:
            self.act(action, self.session.actions.current)

    def act(self, action: ChatAction, conversation_id: int) -> None:
        actions = self.session.actions
        title = self.session.conversations.get(conversation_id).title
        if action is ChatAction.RENAME:
            new_title, ok = QInputDialog.getText(self.parent_widget, "Rename chat", "Title:", text=title)
            if ok:
                actions.rename(conversation_id, new_title)
        elif action is ChatAction.PIN:
            actions.toggle_pin(conversation_id)
        elif action is ChatAction.DELETE:
            actions.delete(conversation_id)
        else:
            suffix = ".md" if action is ChatAction.EXPORT_MARKDOWN else ".json"
            path, _ = QFileDialog.getSaveFileName(self.parent_widget, "Export chat", safe_file_name(title) + suffix)
            if path:
                actions.export(conversation_id, Path(path))

    def import_file(self, path: Path) -> int | None:
        """The chat in ``path`` added (and opened); None, with the reason in a message box, when it is refused."""
        try:
            return self.session.actions.import_file(path)
        except (OSError, ValueError) as exc:  # the file is refused as a whole; nothing was added
            QMessageBox.warning(self.parent_widget, "Import failed", f"{path.name} could not be imported: {exc}")
            return None

    def ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.parent_widget, "Import chat", "", "Kvasir chats (*.json)")
        if path:
            self.import_file(Path(path))


def safe_file_name(title: str) -> str:
    """A chat's title as a file name: letters, digits, spaces, '-' and '_' only."""
    return re.sub(r"[^\w\- ]+", "", title).strip() or "chat"
