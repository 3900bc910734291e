"""The question before a tool call runs, as a window-modal box over the window that does not block the loop:
Run, Always allow this tool in this chat, or Refuse (closing the box refuses)."""

from __future__ import annotations

import asyncio
import html

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from ..chats.tool_round import ALWAYS, REFUSE, RUN
from ..data.tool_calls import pretty_arguments


class ToolApproval:
    """An :data:`app.chats.tool_round.Approver` that asks with a message box over ``parent``."""

    def __init__(self, parent: QWidget) -> None:
        self.parent = parent
        self.box: QMessageBox | None = None  # the question on screen, if any

    async def __call__(self, conversation_id: int, call: dict) -> str:
        box, answers = self.question(call)
        answered = asyncio.get_running_loop().create_future()
        box.finished.connect(lambda _result: answered.done() or answered.set_result(
            answers.get(box.clickedButton(), REFUSE)))
        self.box = box
        box.open()
        try:
            return await answered
        finally:
            self.box = None
            box.deleteLater()

    def question(self, call: dict) -> tuple[QMessageBox, dict]:
        """The box for ``call``, and its buttons' answers."""
        box = QMessageBox(QMessageBox.Question, "Run a tool?",
                          f"The model wants to run the tool “{call['name']}”.", parent=self.parent)
        box.setWindowModality(Qt.WindowModal)
        box.setInformativeText(f"With these arguments:<pre>{html.escape(pretty_arguments(call['arguments']))}</pre>"
                               "Nothing runs unless you allow it.")
        answers = {box.addButton("Run", QMessageBox.AcceptRole): RUN,
                   box.addButton("Always allow in this chat", QMessageBox.ActionRole): ALWAYS,
                   box.addButton("Refuse", QMessageBox.RejectRole): REFUSE}
        return box, answers
