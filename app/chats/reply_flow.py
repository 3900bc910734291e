"""What Send, Stop, Regenerate and Continue do to the chat on screen, and the questions they ask on the way.

The policy lives here, with no widget: a message is sent only where its chat's source can reply now (else the
status bar says why and the text stays in the box); before a local chat's message goes, the context policy
runs (:meth:`ConversationActions.make_room`), asking through :class:`Dialogs`. The window implements
:class:`Dialogs` with message boxes; a test passes its own answers.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from PySide6.QtCore import QObject, Signal

from engine import PromptTooLong

from ..data.store import StoreWriteError
from .conversation_actions import Overflow
from .session import ChatSession


class Dialogs(Protocol):
    """The questions the reply flow asks the user."""

    def ask_overflow(self, overflow: Overflow) -> str | None:
        """The next message does not fit: 'drop' (the oldest turns), 'new' (a new chat) or None (cancel)."""

    def warn_too_long(self) -> None:
        """The message does not fit the model's context even on its own."""


class ReplyFlow(QObject):
    """Send, edit, stop, regenerate and continue on the chat on screen."""

    notice = Signal(str, int)  # a status-bar message and how long it stays (ms)

    def __init__(self, session: ChatSession, dialogs: Dialogs, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session, self.dialogs = session, dialogs
        self.actions, self.controller = session.actions, session.controller
        self.controller.reply_failed.connect(lambda _conversation, reason: self.notice.emit(reason, 15000))

    def send(self, text: str, editing_id: int | None = None) -> asyncio.Task | None:
        """Send ``text`` (as a new version of message ``editing_id`` when editing); None when it was not sent,
        and the caller keeps the text."""
        if not self._ready():
            return None
        try:
            if editing_id is not None:
                return self.controller.edit(self.actions.current, editing_id, text)
            if not self._make_room(text):
                return None
            return self.controller.send(self.actions.current, text)  # the chat on screen: "new" may have changed it
        except StoreWriteError as exc:  # nothing was stored: the text stays in the box
            self.notice.emit(f"Your message was not saved: {exc}. It is still in the box.", 15000)
            return None

    def stop(self) -> bool:
        """Stop the reply being written in the chat on screen; False when none is."""
        current = self.actions.current
        if current is None or not self.controller.is_generating(current):
            return False
        self.controller.stop(current)
        return True

    def regenerate(self, model: str | None = None) -> asyncio.Task | None:
        """Write the last reply again (on the resident ``model`` where given: the user overriding the router)."""
        if self.actions.current is None or not self.source().ready:
            return None
        return self.controller.regenerate(self.actions.current, model)

    def continue_reply(self, message_id: int) -> asyncio.Task | None:
        if self.actions.current is None or not self.source().ready:
            return None
        return self.controller.continue_reply(self.actions.current, message_id)

    def _ready(self) -> bool:
        """Whether a message can go now; if not, the status bar says why."""
        source = self.source()
        if not source.ready:
            self.notice.emit(source.not_ready_message(), 6000)
        return source.ready

    def source(self):
        """Where the replies of the chat on screen come from."""
        current, sources = self.actions.current, self.session.sources
        return sources.of(current) if current is not None else sources.local

    def _make_room(self, text: str) -> bool:
        """The context policy (see :meth:`ConversationActions.make_room`), with its questions."""
        stats = self.session.bridge.stats()
        if stats is None or self.source().checks_own_context:
            return True
        try:
            outcome = self.actions.make_room(text, stats.max_model_len, self.session.tokens.count,
                                             self.dialogs.ask_overflow)
        except PromptTooLong:  # more characters than the whole context could hold: not even counted
            outcome = "too-long"
        except ValueError:  # the template refuses this chat: the reply says why, with the message kept
            return True
        if outcome == "too-long":
            self.dialogs.warn_too_long()
        return outcome in ("fits", "dropped")
