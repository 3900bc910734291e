"""The sidebar: conversations, pinned first then newest, with search across all messages."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt, Signal
from PySide6.QtWidgets import QLineEdit, QListView, QMenu, QPushButton, QVBoxLayout, QWidget

from .store import Conversation, Store

ConversationIdRole = Qt.UserRole + 1


class ConversationListModel(QAbstractListModel):
    """The store's live conversations as a list model (title; id in ``ConversationIdRole``)."""

    def __init__(self, store: Store, parent=None) -> None:
        super().__init__(parent)
        self.store = store
        self._rows: list[Conversation] = []
        self._filter: set[int] | None = None
        self.refresh()

    def refresh(self) -> None:
        self.beginResetModel()
        rows = self.store.conversations()
        self._rows = [c for c in rows if self._filter is None or c.id in self._filter]
        self.endResetModel()

    def set_search(self, query: str) -> None:
        """Show only conversations with a message or title containing ``query`` (empty: all)."""
        query = query.strip()
        self._filter = {c.id for c, _ in self.store.search(query, limit=500)} if query else None
        self.refresh()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        conv = self._rows[index.row()]
        if role == Qt.DisplayRole:
            return ("📌 " if conv.pinned else "") + conv.title
        if role == Qt.ToolTipRole:
            return conv.title
        if role == ConversationIdRole:
            return conv.id
        return None

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, c in enumerate(self._rows) if c.id == conversation_id), -1)


class ConversationSidebar(QWidget):
    """New chat, search, and the list. Emits the chosen conversation's id."""

    selected = Signal(int)
    new_requested = Signal()
    action_requested = Signal(str, int)  # "rename" | "pin" | "delete" | "export-md" | "export-json", id

    def __init__(self, store: Store, parent=None) -> None:
        super().__init__(parent)
        self.model = ConversationListModel(store, self)
        self.new_button = QPushButton("+  New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.search = QLineEdit(placeholderText="Search all chats (Ctrl+F)")
        self.search.setClearButtonEnabled(True)
        self.view = QListView()
        self.view.setModel(self.model)
        self.view.setUniformItemSizes(True)
        self.view.setSpacing(2)
        self.view.setContextMenuPolicy(Qt.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._menu)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        for widget in (self.new_button, self.search, self.view):
            layout.addWidget(widget)
        self.new_button.clicked.connect(self.new_requested)
        self.search.textChanged.connect(self.model.set_search)
        self.view.clicked.connect(lambda index: self.selected.emit(index.data(ConversationIdRole)))

    def _menu(self, point) -> None:
        index = self.view.indexAt(point)
        if not index.isValid():
            return
        conv_id = index.data(ConversationIdRole)
        pinned = self.model.store.conversation(conv_id).pinned
        menu = QMenu(self)
        for key, label in (("rename", "Rename…"), ("pin", "Unpin" if pinned else "Pin to top"),
                           ("export-md", "Export as Markdown…"), ("export-json", "Export as JSON…"),
                           ("delete", "Delete")):
            menu.addAction(label, lambda key=key: self.action_requested.emit(key, conv_id))
        menu.exec(self.view.viewport().mapToGlobal(point))

    def select(self, conversation_id: int) -> None:
        row = self.model.row_of(conversation_id)
        if row >= 0:
            self.view.setCurrentIndex(self.model.index(row))
