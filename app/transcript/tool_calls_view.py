"""A reply's tool calls under its text: one line each ("Tool call: add · done"), which opens on a click, Space
or Enter to show the call's arguments (pretty JSON) and its result or the reason it has none, and closes again."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QLabel, QSizePolicy, QToolButton, QVBoxLayout, QWidget

from ..data.tool_calls import details, summary
from .reasoning import CLOSED, OPEN


class ToolCallLine(QWidget):
    """One call: its summary as a toggle, and its details while open (styled as the reasoning is)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.call: dict = {}
        self.toggle = QToolButton()
        self.toggle.setObjectName("reasoningToggle")
        self.toggle.setCheckable(True)
        self.toggle.setAutoRaise(True)
        self.toggle.setFocusPolicy(Qt.StrongFocus)
        self.toggle.setToolTip("Show or hide the call's arguments and result")
        self.toggle.toggled.connect(lambda _shown: self._show())
        self.text_view = QLabel()
        self.text_view.setObjectName("reasoningText")
        self.text_view.setTextFormat(Qt.PlainText)  # the model and the tool wrote it: never markup
        self.text_view.setWordWrap(True)
        self.text_view.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard)
        self.text_view.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Minimum)
        self.text_view.setAccessibleName("Tool call")
        self.text_view.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))  # JSON lines up in columns
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.toggle, 0, Qt.AlignLeft)
        layout.addWidget(self.text_view)

    def show_call(self, call: dict) -> None:
        self.call = call
        self._show()

    def plain_text(self) -> str:
        return self.toggle.text() + (f"\n{self.text_view.text()}" if self.toggle.isChecked() else "")

    def _show(self) -> None:
        shown = self.toggle.isChecked()
        line = summary(self.call)
        self.toggle.setText(f"{OPEN if shown else CLOSED} {line}")
        self.toggle.setAccessibleName(f"{line}. {'Hide' if shown else 'Show'} its arguments and result")
        self.text_view.setText(details(self.call))
        self.text_view.setVisible(shown)


class ToolCallsBlock(QWidget):
    """The calls of one reply, in order; hidden for a reply that called nothing."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.lines: list[ToolCallLine] = []
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 2, 0, 2)
        self._layout.setSpacing(0)
        self.setVisible(False)

    def show_calls(self, calls: list[dict]) -> bool:
        """Show ``calls`` (an open line stays open); True when lines came or went (the tab order changes)."""
        changed = len(calls) != len(self.lines)
        while len(self.lines) < len(calls):
            self.lines.append(ToolCallLine())
            self._layout.addWidget(self.lines[-1])
        while len(self.lines) > len(calls):
            line = self.lines.pop()
            self._layout.removeWidget(line)
            line.deleteLater()
        for line, call in zip(self.lines, calls, strict=True):
            line.show_call(call)
        self.setVisible(bool(calls))
        return changed

    def plain_text(self) -> str:
        return "\n".join(line.plain_text() for line in self.lines)

    def focusables(self) -> list[QWidget]:
        return [line.toggle for line in self.lines]
