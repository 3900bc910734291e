"""The chat's tool choice, beside its "Use tools" switch: let the model decide whether to call a tool, or hold
the first reply to each message to a call (of any tool, or of one picked by name). A model that never calls
tools by itself (small ones) still uses them this way: the call is constrained decoding in the model's own
tool-call format. Shown while the switch is on; kept in the chat's settings."""

from __future__ import annotations

from PySide6.QtWidgets import QComboBox, QWidget

from ..chats.session import ChatSession
from ..data.tool_calls import AUTO, REQUIRED, TOOL_CHOICE, tool_choice

TIP = ("Which tool the first reply to each message calls: the model decides, or it must call one (any, or the "
       "one picked). Small models rarely call tools by themselves; picking one makes them. Kept for this chat.")


class ToolChoiceBox(QComboBox):
    """Follows the chat on screen and the tools offered; a pick changes the chat's setting."""

    def __init__(self, session: ChatSession, switch: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session, self.switch = session, switch
        self.setToolTip(TIP)
        self.setAccessibleName("Tool choice")
        self.setAccessibleDescription(TIP)
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.hide()
        self.activated.connect(self._picked)
        session.actions.opened.connect(lambda _conversation: self.follow())
        session.conversations.conversation_changed.connect(self._changed)
        session.tools.tools_changed.connect(self.follow)

    def follow(self) -> None:
        """The choices for the tools offered now, the chat's own picked; shown while its switch is on."""
        current = self.session.actions.current
        try:
            settings = self.session.conversations.get(current).settings if current is not None else {}
        except KeyError:  # the chat was deleted
            settings = {}
        names = sorted(tool["function"]["name"] for tool in self.session.tools.tools())
        self.blockSignals(True)
        self.clear()
        self.addItem("Model decides", AUTO)
        self.addItem("Must call a tool", REQUIRED)
        for name in names:
            self.addItem(f"Call {name}", name)
        self.setCurrentIndex(self.findData(tool_choice(settings, names)))
        self.blockSignals(False)
        self.setVisible(not self.switch.isHidden() and self.switch.isChecked())

    def _changed(self, conversation_id: int) -> None:
        if conversation_id == self.session.actions.current:
            self.follow()

    def _picked(self, index: int) -> None:
        current = self.session.actions.current
        if current is not None:
            self.session.conversations.set_setting(current, TOOL_CHOICE, self.itemData(index))
