"""The chat's "Use tools" switch: offers the MCP servers' tools to the chat's model (each call is asked about
first); shown only while some server has tools, for a chat whose model runs here. The choice is kept in the chat's
settings."""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QWidget

from ..chats.session import ChatSession
from ..data.tool_calls import TOOLS, tools_on

TIP = ("Offer the tools of your MCP servers (Preferences > MCP servers) to the model. You are asked before each "
       "call runs. Kept for this chat.")


class ToolsSwitch(QCheckBox):
    """Follows the chat on screen and the tools the servers offer; a click changes the chat's setting."""

    def __init__(self, session: ChatSession, parent: QWidget | None = None) -> None:
        super().__init__("Use tools", parent)
        self.session = session
        self.setToolTip(TIP)
        self.setAccessibleName("Use tools")
        self.setAccessibleDescription(TIP)
        self.hide()
        self.clicked.connect(self._clicked)
        session.actions.opened.connect(lambda _conversation: self.follow())
        session.conversations.conversation_changed.connect(self._changed)
        session.tools.tools_changed.connect(self.follow)

    def follow(self) -> None:
        """Checked as the chat on screen says; shown while the servers offer any tool."""
        current = self.session.actions.current
        try:
            settings = self.session.conversations.get(current).settings if current is not None else {}
            offered = current is not None and self.session.sources.of(current).offers_tools
        except KeyError:  # the chat was deleted
            settings, offered = {}, False
        count = len(self.session.tools.tools())
        self.setChecked(tools_on(settings))
        self.setText(f"Use tools ({count})")
        self.setVisible(offered and count > 0)

    def _changed(self, conversation_id: int) -> None:
        if conversation_id == self.session.actions.current:
            self.follow()

    def _clicked(self, on: bool) -> None:
        current = self.session.actions.current
        if current is not None:
            self.session.conversations.set_setting(current, TOOLS, on)
