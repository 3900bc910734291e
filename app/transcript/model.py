"""The chat on screen as a Qt list model: one row per message of its thread, which the transcript view binds to.

The model is the one owner of a streaming reply's text: the reply flow's signals write it here, for every chat
(so a chat opened while it streams shows what has arrived), and the model says what changed in the chat on
screen: ``rowsInserted`` when messages arrive at the end (a send, a reply starting), ``dataChanged`` for one
row as its reply streams or ends, ``modelReset`` when another chat opens or the thread is replaced (another
version chosen, turns dropped). The window is on none of these paths.
"""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, QObject, Qt

from ..chats.session import ChatSession
from ..data.drafted_spans import KEPT_DRAFT_SPANS, valid_spans
from ..data.reasoning import Reasoning, stored_reasoning
from ..data.store import Message

MESSAGE_ROLE = Qt.UserRole + 1  # the stored Message
LIVE_ROLE = Qt.UserRole + 2  # True while the reply is being written


class Transcript(QAbstractListModel):
    """The thread of the chat on screen, its versions and skipped turns, and the live text of its replies."""

    def __init__(self, session: ChatSession, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.conversation_id: int | None = None
        self.messages: list[Message] = []
        self.versions: dict[int, tuple[int, int]] = {}
        self.skipped = 0
        self._live: dict[int, dict[int, str]] = {}  # conversation -> reply id -> text so far
        session.actions.opened.connect(self.show)
        session.conversations.thread_changed.connect(self._changed)
        session.conversations.conversation_changed.connect(self._changed)
        controller = session.controller
        controller.reply_started.connect(self._reply_started)
        controller.reply_delta.connect(self._reply_delta)
        controller.reply_finished.connect(self._reply_finished)

    # -- the model ----------------------------------------------------------------------------------

    def rowCount(self, parent: QModelIndex | None = None) -> int:
        return 0 if parent is not None and parent.isValid() else len(self.messages)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.messages):
            return None
        message = self.messages[index.row()]
        if role == Qt.DisplayRole:
            return self.text(message)
        if role == MESSAGE_ROLE:
            return message
        if role == LIVE_ROLE:
            return message.id in self.live
        return None

    @property
    def live(self) -> dict[int, str]:
        """The replies of the chat on screen being written now, with their text so far."""
        return self._live.get(self.conversation_id, {})

    def text(self, message: Message) -> str:
        """What a message shows: its text so far while it streams, else its stored text."""
        return self.live.get(message.id, message.text)

    def kept_drafts(self, message: Message) -> list[tuple[int, int]]:
        """The character ranges of a reply's text that came from kept draft tokens, so far while it streams."""
        if message.id in self.live:
            return [tuple(span) for span in self.session.controller.live_kept_drafts(message.id)]
        return valid_spans(message.stats.get(KEPT_DRAFT_SPANS))

    def reasoning(self, message: Message) -> Reasoning:
        """A reply's reasoning: so far while it streams, else as stored with it."""
        if message.id in self.live:
            return self.session.controller.live_reasoning(message.id)
        return stored_reasoning(message)

    # -- following the chats ------------------------------------------------------------------------

    def show(self, conversation_id: int) -> None:
        """Another chat on screen: its rows from scratch."""
        self.beginResetModel()
        self.conversation_id = conversation_id
        self._read(self.session.conversations.thread(conversation_id))
        self.endResetModel()

    def _changed(self, conversation_id: int) -> None:
        """The chat's thread or settings changed: new rows at the end, changed rows, or a new thread."""
        if conversation_id != self.conversation_id:
            return
        try:
            fresh = self.session.conversations.thread(conversation_id)
            skipped = self._skipped_setting()
        except KeyError:  # the chat was deleted; the chat opened next resets the model
            return
        before, ids = [m.id for m in self.messages], [m.id for m in fresh]
        if skipped != self.skipped or ids[: len(before)] != before:
            self.beginResetModel()
            self._read(fresh)
            self.endResetModel()
        elif len(ids) > len(before):
            self.beginInsertRows(QModelIndex(), len(before), len(ids) - 1)
            self._read(fresh)
            self.endInsertRows()
        else:
            changed = [row for row, (old, new) in enumerate(zip(self.messages, fresh)) if old != new]
            self._read(fresh)
            for row in changed:
                self._row_changed(row)

    def _read(self, thread: list[Message]) -> None:
        self.messages = thread
        self.versions = self.session.conversations.version_positions(self.conversation_id)
        self.skipped = self._skipped_setting()

    def _skipped_setting(self) -> int:
        return self.session.conversations.get(self.conversation_id).settings.get("skip_messages", 0)

    def _row_changed(self, row: int) -> None:
        index = self.index(row)
        self.dataChanged.emit(index, index)

    def _row_of(self, message_id: int) -> int | None:
        return next((row for row, m in enumerate(self.messages) if m.id == message_id), None)

    # -- the live replies ---------------------------------------------------------------------------

    def _reply_started(self, conversation_id: int, reply_id: int) -> None:
        self._live.setdefault(conversation_id, {})[reply_id] = self.session.conversations.message(reply_id).text
        if conversation_id == self.conversation_id:
            self._changed(conversation_id)  # the reply's row, where it is new
            if (row := self._row_of(reply_id)) is not None:
                self._row_changed(row)  # live now

    def _reply_delta(self, conversation_id: int, reply_id: int, text: str) -> None:
        self._live.setdefault(conversation_id, {})[reply_id] = text
        if conversation_id == self.conversation_id and (row := self._row_of(reply_id)) is not None:
            self._row_changed(row)

    def _reply_finished(self, conversation_id: int, message: Message) -> None:
        live = self._live.get(conversation_id, {})
        live.pop(message.id, None)
        if not live:
            self._live.pop(conversation_id, None)
        if conversation_id == self.conversation_id and (row := self._row_of(message.id)) is not None:
            self._row_changed(row)  # no longer live
