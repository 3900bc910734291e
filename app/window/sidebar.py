"""The sidebar: conversations, pinned first then newest, with search across all messages."""

from __future__ import annotations

from enum import Enum

from PySide6.QtCore import QAbstractListModel, QEvent, QModelIndex, Qt, Signal
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import QLineEdit, QListView, QMenu, QPushButton, QVBoxLayout, QWidget

from ..chats.conversations import Conversations
from ..data.store import Conversation

ConversationIdRole = Qt.UserRole + 1


class ChatAction(Enum):
    """What the sidebar asks the window to do to a chat (its menu, F2 and Delete)."""

    RENAME = "Rename…"
    PIN = "Pin to top"
    EXPORT_MARKDOWN = "Export as Markdown…"
    EXPORT_JSON = "Export as JSON…"
    DELETE = "Delete"


class ConversationListModel(QAbstractListModel):
    """The live conversations as a list model (title; id in ``ConversationIdRole``); follows the chats'
    ``list_changed`` by itself."""

    def __init__(self, conversations: Conversations, parent=None) -> None:
        super().__init__(parent)
        self.conversations = conversations
        self._rows: list[Conversation] = []
        self._filter: set[int] | None = None
        self._query = ""
        conversations.list_changed.connect(self._reload)
        self.refresh()

    def refresh(self) -> None:
        self.beginResetModel()
        rows = self.conversations.all()
        self._rows = [c for c in rows if self._filter is None or c.id in self._filter]
        self.endResetModel()

    def _reload(self) -> None:
        if self._query:  # a new message may match the search, or no longer hide a chat
            self._filter = self.conversations.search(self._query)
        self.refresh()

    def set_search(self, query: str) -> None:
        """Show only conversations with a message or title containing ``query`` (empty: all)."""
        self._query = query.strip()
        self._filter = self.conversations.search(self._query) if self._query else None
        self.refresh()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self._rows)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        conv = self._rows[index.row()]
        if role == Qt.DisplayRole:
            return ("📌 " if conv.pinned else "") + conv.title
        if role in (Qt.ToolTipRole, Qt.AccessibleTextRole):
            return conv.title + (" (pinned)" if conv.pinned else "")
        if role == ConversationIdRole:
            return conv.id
        return None

    def row_of(self, conversation_id: int) -> int:
        return next((i for i, c in enumerate(self._rows) if c.id == conversation_id), -1)


class ConversationSidebar(QWidget):
    """New chat, search, and the list. Emits the chosen conversation's id; keeps the chat on screen selected
    whatever the list does."""

    selected = Signal(int)
    new_requested = Signal()
    action_requested = Signal(object, int)  # ChatAction, conversation id

    def __init__(self, conversations: Conversations, parent=None) -> None:
        super().__init__(parent)
        self.model = ConversationListModel(conversations, self)
        self.current: int | None = None
        self.new_button = QPushButton("+  New chat")
        self.new_button.setToolTip("New chat (Ctrl+N)")
        self.new_button.setAccessibleName("New chat")
        self.search = QLineEdit(placeholderText="Search all chats (Ctrl+F)")
        self.search.setAccessibleName("Search all chats")
        self.search.setClearButtonEnabled(True)
        self.view = QListView()
        self.view.setAccessibleName("Chats")
        self.view.setModel(self.model)
        self.view.setUniformItemSizes(True)
        self.view.setSpacing(2)
        self.view.setTextElideMode(Qt.ElideRight)  # long titles end in "…" rather than widen the list
        self.view.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.view.setToolTip("F2 renames, Delete deletes, the menu key shows everything")
        self.view.setContextMenuPolicy(Qt.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._menu)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 4, 8)
        for widget in (self.new_button, self.search, self.view):
            layout.addWidget(widget)
        self.new_button.clicked.connect(self.new_requested)
        self.search.textChanged.connect(self.model.set_search)
        self.search.returnPressed.connect(self._open_first_match)
        self.search.installEventFilter(self)  # Down moves from the search into the list
        self.view.clicked.connect(self._chosen)
        self.view.activated.connect(self._chosen)
        self.model.modelReset.connect(self._keep_selection)
        # F2 is the window's (its Chat menu acts on the highlighted row while the list has focus)
        delete = QShortcut(QKeySequence(Qt.Key_Delete), self.view, context=Qt.WidgetShortcut)
        delete.activated.connect(lambda: self.act_on_highlighted(ChatAction.DELETE))

    def eventFilter(self, watched, event) -> bool:
        if watched is self.search and event.type() == QEvent.KeyPress and event.key() == Qt.Key_Down \
                and self.model.rowCount():
            self.view.setFocus()
            self.view.setCurrentIndex(self.model.index(0))
            return True
        return super().eventFilter(watched, event)

    def _open_first_match(self) -> None:
        """Enter in the search opens the first chat it found."""
        if self.model.rowCount():
            self._chosen(self.model.index(0))

    def select(self, conversation_id: int) -> None:
        self.current = conversation_id
        self._keep_selection()

    def _keep_selection(self) -> None:
        row = self.model.row_of(self.current) if self.current is not None else -1
        if row >= 0:
            self.view.setCurrentIndex(self.model.index(row))

    def _chosen(self, index: QModelIndex) -> None:
        self.selected.emit(index.data(ConversationIdRole))

    def act_on_highlighted(self, action: ChatAction) -> None:
        """Ask for ``action`` on the chat highlighted in the list (which arrow keys move before Enter opens)."""
        index = self.view.currentIndex()
        if index.isValid():
            self.action_requested.emit(action, index.data(ConversationIdRole))

    def _menu(self, point) -> None:
        index = self.view.indexAt(point)
        if not index.isValid():  # the menu key: the selected chat, the menu beside it
            index = self.view.currentIndex()
            point = self.view.visualRect(index).center()
        if not index.isValid():
            return
        conv_id = index.data(ConversationIdRole)
        pinned = self.model.conversations.get(conv_id).pinned
        menu = QMenu(self)
        for action in ChatAction:
            label = "Unpin" if action is ChatAction.PIN and pinned else action.value
            menu.addAction(label, lambda action=action: self.action_requested.emit(action, conv_id))
        menu.exec(self.view.viewport().mapToGlobal(point))
