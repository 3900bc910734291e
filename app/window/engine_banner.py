"""The bar above the chat that stays while no engine serves: why, and what the user can do about it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QVBoxLayout

from ..theme import BANNER

STYLE = f"""
#engineBanner {{ background: {BANNER["background"]}; border: 1px solid {BANNER["border"]}; border-radius: 6px; }}
#engineBanner QLabel {{ color: {BANNER["text"]}; background: transparent; }}
#engineBannerTitle {{ font-weight: bold; }}
"""


class EngineBanner(QFrame):
    """Hidden while the engine serves; shown, until the next successful load, when it stopped or never started."""

    restart_requested = Signal()
    choose_model_requested = Signal()

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("engineBanner")
        self.setStyleSheet(STYLE)
        self.title = QLabel(objectName="engineBannerTitle", wordWrap=True)
        self.reason = QLabel(wordWrap=True, textInteractionFlags=Qt.TextSelectableByMouse,
                             textFormat=Qt.PlainText)  # an exception's text, never markup
        self.restart = QPushButton("Restart engine")
        self.choose = QPushButton("Choose another model…")
        self.restart.clicked.connect(self.restart_requested)
        self.choose.clicked.connect(self.choose_model_requested)
        buttons = QHBoxLayout()  # under the text, so a long reason keeps the full width of the chat
        buttons.addStretch(1)
        buttons.addWidget(self.choose)
        buttons.addWidget(self.restart)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(12, 8, 12, 8)
        layout.addWidget(self.title)
        layout.addWidget(self.reason)
        layout.addLayout(buttons)
        self.hide()

    def show_engine_stopped(self, reason: str) -> None:
        """The engine thread died: say why; restarting it or loading another model brings it back."""
        self._show("The engine stopped. Replies can't be written until it is restarted.", reason, "Restart engine")

    def show_load_failed(self, reason: str) -> None:
        """No model could be loaded: say why; try again or pick another model."""
        self._show("The model could not be loaded.", reason, "Try again")

    def show_restarting(self) -> None:
        """A new load is under way; the buttons wait for its result."""
        self.title.setText("Restarting the engine…")
        self.restart.setEnabled(False)

    def _show(self, title: str, reason: str, restart_label: str) -> None:
        self.title.setText(title)
        self.reason.setText(reason or "No reason was given.")
        self.restart.setText(restart_label)
        self.restart.setEnabled(True)
        self.show()
