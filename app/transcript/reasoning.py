"""A reply's reasoning above its answer: one line that sums it up ("Thought for 4.2 s, 312 tokens", or "Thinking…
42 tokens" while it is written), which opens on a click, Space or Enter to show the reasoning in a quieter
style, and closes again.

Closed, a streaming reasoning costs one line of text per redraw: its text is laid out only while it is open.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from ..data.reasoning import Reasoning
from .blocks import PlainTextBox

CLOSED, OPEN = "▸", "▾"
LONG_REASONING_CHARS = 20_000  # longer reasoning shows in a scrolled box (a label lays it out slowly)


class ReasoningBlock(QWidget):
    """The summary line (a toggle button) and, while open, the reasoning's text; hidden for a reply without
    reasoning."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.reasoning = Reasoning()
        self.toggle = QToolButton()
        self.toggle.setObjectName("reasoningToggle")
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setFocusPolicy(Qt.StrongFocus)
        self.toggle.setToolTip("Show or hide what the model thought before answering")
        self.toggle.toggled.connect(self._opened)
        self.text_view: QLabel | PlainTextBox | None = None
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 4)  # a little air between the reasoning and the answer
        self._layout.setSpacing(2)
        self._layout.addWidget(self.toggle, 0, Qt.AlignLeft)
        self._show_summary()
        self.setVisible(False)

    @property
    def is_open(self) -> bool:
        return self.toggle.isChecked()

    def set_open(self, shown: bool) -> None:
        self.toggle.setChecked(shown)

    def show_reasoning(self, reasoning: Reasoning) -> bool:
        """Show ``reasoning`` (hidden when it is empty); True when the block appeared or went (the tab order
        changes)."""
        was_shown = not self.isHidden()
        if reasoning != self.reasoning:
            self.reasoning = reasoning
            self._show_summary()
            if self.is_open:
                self._show_text()
        self.setVisible(bool(reasoning.text))
        return was_shown != bool(reasoning.text)

    def plain_text(self) -> str:
        if self.isHidden():
            return ""
        return self.toggle.text() + (f"\n{self.reasoning.text}" if self.is_open else "")

    def focusables(self) -> list[QWidget]:
        return [] if self.isHidden() else [self.toggle]

    def _show_summary(self) -> None:
        summary = self.reasoning.summary()
        self.toggle.setText(f"{OPEN if self.is_open else CLOSED} {summary}")
        self.toggle.setAccessibleName(f"{summary}. {'Hide' if self.is_open else 'Show'} the reasoning")

    def _opened(self, shown: bool) -> None:
        self._show_summary()
        if shown:
            self._show_text()
        elif self.text_view is not None:
            self.text_view.hide()

    def _show_text(self) -> None:
        view = self._text_view(len(self.reasoning.text) > LONG_REASONING_CHARS)
        if isinstance(view, PlainTextBox):
            view.show_text(self.reasoning.text)
        elif view.text() != self.reasoning.text:
            view.setText(self.reasoning.text)
        view.show()

    def _text_view(self, long: bool) -> QLabel | PlainTextBox:
        """The widget the reasoning shows in; replaced when a streaming reasoning grows past a label's limit."""
        if isinstance(self.text_view, PlainTextBox if long else QLabel):
            return self.text_view
        if self.text_view is not None:
            self._layout.removeWidget(self.text_view)
            self.text_view.deleteLater()
        self.text_view = PlainTextBox(monospace=False) if long else _label()
        self.text_view.setObjectName("reasoningText")
        self.text_view.setAccessibleName("Reasoning")
        self._layout.addWidget(self.text_view)
        return self.text_view


def _label() -> QLabel:
    label = QLabel()
    label.setTextFormat(Qt.PlainText)  # the model wrote it: never markup
    label.setWordWrap(True)
    label.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard)
    label.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Minimum)
    return label
