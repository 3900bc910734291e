"""The reply flow's questions (:class:`app.chats.reply_flow.Dialogs`) as message boxes over the window."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget

from ..chats.conversation_actions import Overflow


class ReplyDialogs:
    """Message boxes over ``parent`` for the questions Send asks on the way."""

    def __init__(self, parent: QWidget) -> None:
        self.parent = parent

    def ask_overflow(self, overflow: Overflow) -> str | None:
        """'drop', 'new' or None (cancel)."""
        box, choices = self.overflow_box(overflow)
        box.exec()
        return choices.get(box.clickedButton())

    def overflow_box(self, overflow: Overflow) -> tuple[QMessageBox, dict]:
        """The context-full question, and its buttons' answers."""
        box = QMessageBox(QMessageBox.Question, "The conversation is full",
                          f"This message and its reply need {overflow.needed:,} tokens, but the model reads at "
                          f"most {overflow.limit:,}. Nothing you wrote is deleted either way.", parent=self.parent)
        drop = box.addButton("Stop sending the oldest turns", QMessageBox.AcceptRole)
        new = box.addButton("Start a new chat", QMessageBox.ActionRole)
        box.addButton(QMessageBox.Cancel)
        return box, {drop: "drop", new: "new"}

    def warn_too_long(self) -> None:
        QMessageBox.warning(self.parent, "Message too long",
                            "This message does not fit the model's context even on its own. Shorten it, or "
                            "lower 'Max tokens per reply' in the chat settings.")
