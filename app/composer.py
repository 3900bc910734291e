"""Where the user writes: Enter sends, Shift+Enter starts a new line; Send turns into Stop while replying."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget


class MessageEdit(QPlainTextEdit):
    """A text box whose Enter submits (Shift+Enter inserts a line break)."""

    submitted = Signal()

    def keyPressEvent(self, event) -> None:
        if event.key() in (Qt.Key_Return, Qt.Key_Enter) and not event.modifiers() & Qt.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class Composer(QWidget):
    """The input row. ``send(text)`` is emitted with the text; the box is cleared only once it is sent."""

    send = Signal(str)
    stop = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.edit = MessageEdit(placeholderText="Message Kvasir… (Enter to send, Shift+Enter for a new line)")
        self.edit.setFixedHeight(84)
        self.button = QPushButton("Send")
        self.button.setMinimumWidth(84)
        self.context = QLabel("")
        self.context.setObjectName("contextMeter")
        row = QHBoxLayout()
        row.addWidget(self.edit, 1)
        row.addWidget(self.button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 4, 8, 8)
        layout.addLayout(row)
        layout.addWidget(self.context)
        self.generating = False
        self.editing_id: int | None = None
        self.edit.submitted.connect(self._submit)
        self.button.clicked.connect(self._clicked)

    def set_generating(self, generating: bool) -> None:
        self.generating = generating
        self.button.setText("Stop" if generating else "Send")

    def start_editing(self, message_id: int, text: str) -> None:
        """Put an earlier message in the box; sending replaces it (the old version is kept)."""
        self.editing_id = message_id
        self.edit.setPlainText(text)
        self.edit.setFocus()
        self.button.setText("Resend")

    def cancel_editing(self) -> bool:
        if self.editing_id is None:
            return False
        self.editing_id = None
        self.edit.clear()
        self.set_generating(self.generating)
        return True

    def set_context(self, used: int, total: int) -> None:
        self.context.setText(f"{used:,} / {total:,} tokens")

    def _clicked(self) -> None:
        if self.generating:
            self.stop.emit()
        else:
            self._submit()

    def _submit(self) -> None:
        text = self.edit.toPlainText().strip()
        if text and not self.generating:
            self.send.emit(text)

    def clear(self) -> None:
        self.editing_id = None
        self.edit.clear()
