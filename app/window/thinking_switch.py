"""The chat's "Think before answering" switch, shown only where the model its replies go to can be asked not to
think (``EngineStats.thinking_switch``); the choice is kept in the chat's settings."""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QWidget

from ..chats.session import ChatSession
from ..data.thinking import THINK, thinks

TIP = ("Let the model reason before it answers: slower, and often better on hard questions. Off asks the model's "
       "chat template to answer at once (enable_thinking = false). Kept for this chat.")


class ThinkingSwitch(QCheckBox):
    """Follows the chat on screen, its settings and the model that serves it; a click changes the chat's
    setting."""

    def __init__(self, session: ChatSession, parent: QWidget | None = None) -> None:
        super().__init__("Think before answering", parent)
        self.session = session
        self.setToolTip(TIP)
        self.setAccessibleName("Think before answering")
        self.setAccessibleDescription(TIP)
        self.hide()
        self.clicked.connect(self._clicked)
        session.actions.opened.connect(lambda _conversation: self.follow())
        session.conversations.conversation_changed.connect(self._changed)
        session.bridge.loaded.connect(lambda _stats: self.follow())

    def follow(self) -> None:
        """Shown, and checked as the chat on screen says, where its model has the switch; hidden elsewhere."""
        current = self.session.actions.current
        try:
            source = self.session.sources.of(current) if current is not None else None
            settings = self.session.conversations.get(current).settings if current is not None else {}
        except KeyError:  # the chat was deleted
            source = None
        self.setChecked(thinks(settings) if source is not None else True)
        self.setVisible(source is not None and source.offers_thinking_switch())

    def _changed(self, conversation_id: int) -> None:
        if conversation_id == self.session.actions.current:
            self.follow()

    def _clicked(self, on: bool) -> None:
        current = self.session.actions.current
        if current is not None:
            self.session.conversations.set_setting(current, THINK, on)
