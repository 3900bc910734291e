"""The QApplication, made the same way for the app, the self-test and the offscreen tools."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication


def create_application(argv: list[str]) -> QApplication:
    """The running QApplication, or a new one with the high-DPI policy set first (it can't change later)."""
    existing = QApplication.instance()
    if existing is not None:
        return existing
    # Fractional scale factors (125 %, 150 %) as the desktop sets them: rounding to 1x or 2x would draw
    # everything too small or too large. Qt 6 defaults to this; saying it keeps it so whatever the default.
    QGuiApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
    app = QApplication(argv)
    app.setApplicationName("Kvasir")
    return app
