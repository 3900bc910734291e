"""What a user does to chats, in one place: open, new, rename, pin, delete with undo, import, export, and what
happens when the next message would not fit the model's context.

No dialogs here: where a choice is the user's, the caller passes the answer (or a function that asks), so the
window keeps the dialogs and this keeps the rules.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from ..data.export import from_json, to_json, to_markdown
from ..data.personas import Personas
from ..data.settings import DEFAULTS, Settings
from ..data.store import Conversation
from .chat_controller import ChatController
from .conversations import Conversations

UNDO_NOTICE_MS = 10_000


@dataclass(frozen=True, slots=True)
class Overflow:
    """The next request would not fit: it needs ``needed`` tokens of the model's ``limit``."""

    needed: int
    limit: int


class ConversationActions(QObject):
    """The chat on screen and everything done to chats. Views follow :attr:`opened` and the model's signals."""

    opened = Signal(int)  # the chat on screen is now this one
    notice = Signal(str, int)  # a status-bar message and how long it stays (ms)
    undo_available = Signal(bool)

    def __init__(self, conversations: Conversations, controller: ChatController, settings: Settings,
                 personas: Personas, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.conversations, self.controller = conversations, controller
        self.settings, self.personas = settings, personas
        self.current: int | None = None
        self._deleted: list[int] = []

    # -- the chat on screen -----------------------------------------------------------------------------

    def open(self, conversation_id: int) -> None:
        self.current = conversation_id
        self.opened.emit(conversation_id)

    def open_first(self) -> None:
        """The most recent chat, or a new one when there is none."""
        chats = self.conversations.all()
        self.open(chats[0].id if chats else self.create().id)

    def new(self) -> Conversation:
        conversation = self.create()
        self.open(conversation.id)
        return conversation

    def create(self, like: int | None = None) -> Conversation:
        """A chat with the default persona and sampling, or with those of chat ``like``. It runs where that
        chat, or else the chat on screen, runs: the local engine or a remote server's model."""
        if like is not None:
            source = self.conversations.get(like)
            settings = {k: v for k, v in source.settings.items() if k != "skip_messages"}
            return self.conversations.create("New chat", source.system_prompt, source.preset, settings)
        preset = self.personas.get(self.settings["preset"]) or self.personas.get(DEFAULTS["preset"])
        settings = {**self.settings["sampling"], **self.controller.sources.placement(self.current)}
        return self.conversations.create("New chat", preset.system_prompt if preset else "",
                                         preset.name if preset else None, settings)

    # -- chats --------------------------------------------------------------------------------------

    def rename(self, conversation_id: int, title: str) -> None:
        title = title.strip()
        if title:
            self.conversations.rename(conversation_id, title)

    def toggle_pin(self, conversation_id: int) -> None:
        self.conversations.set_pinned(conversation_id, not self.conversations.get(conversation_id).pinned)

    def delete(self, conversation_id: int) -> None:
        """Stop its reply and hide the chat; :meth:`undo_delete` (Ctrl+Z) brings it back."""
        self.controller.stop(conversation_id)
        title = self.conversations.get(conversation_id).title
        self.conversations.delete(conversation_id)
        self._deleted.append(conversation_id)
        if conversation_id == self.current:
            self.open_first()
        self.notice.emit(f"Deleted “{title}”. Undo with Ctrl+Z.", UNDO_NOTICE_MS)
        self.undo_available.emit(True)

    def undo_delete(self) -> None:
        if not self._deleted:
            return
        conversation_id = self._deleted.pop()
        self.conversations.restore(conversation_id)
        self.open(conversation_id)
        self.undo_available.emit(bool(self._deleted))
        self.notice.emit("Restored.", 3000)

    def export(self, conversation_id: int, path: Path) -> None:
        """Markdown for a ``.md`` path (the thread on screen), JSON otherwise (every branch)."""
        store = self.conversations.store
        text = to_markdown(store, conversation_id) if path.suffix == ".md" else to_json(store, conversation_id)
        path.write_text(text, encoding="utf-8")
        self.notice.emit(f"Exported to {path}", 5000)

    def import_file(self, path: Path) -> int:
        """Add the chat exported in ``path`` and open it. Raises ``ValueError`` (with the reason) or ``OSError``;
        a refused file adds nothing."""
        try:
            conversation_id = from_json(self.conversations.store, path.read_text(encoding="utf-8"))
        except sqlite3.Error as exc:
            raise ValueError(f"the database refused it: {exc}") from exc
        self.conversations.added_elsewhere()
        self.open(conversation_id)
        return conversation_id

    def show_version(self, message_id: int, step: int) -> None:
        """Go ``step`` versions back (-1) or on (+1) from a message, with the turns that followed it."""
        versions = self.conversations.versions(message_id)
        index = [m.id for m in versions].index(message_id) + step
        if 0 <= index < len(versions) and not self.controller.is_generating(self.current):
            self.conversations.show_branch(versions[index].id)

    # -- the context policy ----------------------------------------------------------------------------

    def overflow(self, text: str, limit: int, count_tokens: Callable[[list[dict]], int]) -> Overflow | None:
        """None when ``text`` and its reply fit the context of ``limit`` tokens, else what they need."""
        needed = self.controller.context_needed(self.current, text, count_tokens)
        return None if needed <= limit else Overflow(needed, limit)

    def make_room(self, text: str, limit: int, count_tokens: Callable[[list[dict]], int],
                  ask: Callable[[Overflow], str | None]) -> str:
        """Before sending ``text``: "fits", or after asking the user (``ask`` returns "drop", "new" or None),
        "dropped" (the oldest turns are no longer sent), "too-long" (not even the message alone fits) or
        "cancelled". "new" opens a chat with the same persona and checks again there. Nothing is deleted."""
        problem = self.overflow(text, limit, count_tokens)
        if problem is None:
            return "fits"
        choice = ask(problem)
        if choice == "drop":
            dropped = self.controller.drop_oldest_turns(self.current, text, count_tokens, limit)
            return "dropped" if dropped else "too-long"
        if choice == "new":
            conversation = self.create(like=self.current)
            self.open(conversation.id)
            return self.make_room(text, limit, count_tokens, ask)
        return "cancelled"
