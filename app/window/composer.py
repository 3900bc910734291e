"""Where the user writes: Enter sends, Shift+Enter starts a new line; Send turns into Stop while replying."""

from __future__ import annotations

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QFont, QKeySequence
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPlainTextEdit, QPushButton, QVBoxLayout, QWidget

from ..theme import ERROR, WARNING

EDIT_LINES = 3  # the box shows this many lines of text at any text size
# (share of the context in use, level, colour): from "warn" on the meter says how full it is
CONTEXT_LEVELS = ((0.95, "full", ERROR), (0.8, "warn", WARNING), (0.0, "ok", ""))


class MessageEdit(QPlainTextEdit):
    """A text box whose Enter submits (Shift+Enter inserts a line break)."""

    submitted = Signal()

    def event(self, event) -> bool:
        # With nothing typed to undo, Ctrl+Z is the window's: it brings back the chat just deleted.
        if event.type() == QEvent.ShortcutOverride and event.matches(QKeySequence.Undo) \
                and not self.document().isUndoAvailable():
            event.ignore()
            return False
        return super().event(event)

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
        self.edit.setAccessibleName("Message")
        self.edit.setAccessibleDescription("Enter sends, Shift+Enter starts a new line, Esc stops the reply")
        self.edit.setTabChangesFocus(True)  # Tab leaves the box for the Send button, as everywhere else
        self.button = QPushButton("Send")
        self.button.setMinimumWidth(84)
        self.context = QLabel("")
        self.context.setObjectName("contextMeter")
        self.context.setAccessibleName("Context used")
        self.context_level = "ok"
        self._base_font = QFont(self.edit.font())
        self.set_text_scale(100)
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
        self.button.setToolTip("Stop the reply (Esc)" if generating else "Send the message (Enter)")

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

    def set_text_scale(self, percent: int) -> None:
        """The text being written at ``percent`` of the normal size, like the transcript."""
        font = QFont(self._base_font)
        font.setPointSizeF(max(1.0, self._base_font.pointSizeF() * percent / 100))
        self.edit.setFont(font)
        margins = self.edit.contentsMargins()
        self.edit.setFixedHeight(int(self.edit.fontMetrics().lineSpacing() * EDIT_LINES
                                     + 2 * self.edit.document().documentMargin()
                                     + margins.top() + margins.bottom() + 4))

    def set_context(self, used: int, total: int) -> None:
        """The context meter: tokens of the chat so far of the model's context; amber, then red near full."""
        share = used / total if total > 0 else 0.0
        self.context_level, color = next((name, color) for limit, name, color in CONTEXT_LEVELS if share >= limit)
        text = f"{used:,} / {total:,} tokens"
        if self.context_level == "full":
            text += " · the context is nearly full: the oldest turns will have to be left out"
        elif self.context_level == "warn":
            text += f" · {share:.0%} of the context used"
        self.context.setText(text)
        self.context.setStyleSheet(f"color: {color};" if color else "")
        self.context.setAccessibleDescription(f"{share:.0%} of the model's context is used")

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
