"""Where the window opens: at a share of the screen the first time, then where the user left it, always
inside the screen's available area (a window saved on a larger or a detached monitor is brought back)."""

from __future__ import annotations

from PySide6.QtCore import QRect, QSettings, QSize
from PySide6.QtWidgets import QMainWindow, QSplitter

FIRST_START_SHARE = (0.8, 0.85)  # of the available width and height
FIRST_START_MAX = QSize(1600, 1000)  # on a very large screen, a window this big is plenty


def first_start_geometry(available: QRect) -> QRect:
    """A window of :data:`FIRST_START_SHARE` of ``available`` (at most :data:`FIRST_START_MAX`), centred."""
    size = QSize(min(int(available.width() * FIRST_START_SHARE[0]), FIRST_START_MAX.width()),
                 min(int(available.height() * FIRST_START_SHARE[1]), FIRST_START_MAX.height()))
    rect = QRect(0, 0, size.width(), size.height())
    rect.moveCenter(available.center())
    return rect


def fit_to_screen(geometry: QRect, available: QRect) -> QRect:
    """``geometry`` made no larger than ``available`` and moved inside it."""
    width = min(geometry.width(), available.width())
    height = min(geometry.height(), available.height())
    left = min(max(geometry.left(), available.left()), available.right() + 1 - width)
    top = min(max(geometry.top(), available.top()), available.bottom() + 1 - height)
    return QRect(left, top, width, height)


def restore_window(window: QMainWindow, splitter: QSplitter) -> None:
    """Where the user left the window, inside the screen it opens on; the first time, a share of it."""
    settings = QSettings("Kvasir", "Kvasir")
    available = window.screen().availableGeometry()
    saved = settings.value("geometry")
    if saved and window.restoreGeometry(saved):
        frame, inner = window.frameGeometry(), window.geometry()
        fitted = fit_to_screen(frame, available)
        if fitted != frame and not window.isMaximized() and not window.isFullScreen():
            window.setGeometry(fitted.adjusted(inner.left() - frame.left(), inner.top() - frame.top(),
                                               inner.right() - frame.right(), inner.bottom() - frame.bottom()))
    else:
        window.setGeometry(first_start_geometry(available))
    if settings.value("splitter"):
        splitter.restoreState(settings.value("splitter"))


def save_window(window: QMainWindow, splitter: QSplitter) -> None:
    settings = QSettings("Kvasir", "Kvasir")
    settings.setValue("geometry", window.saveGeometry())
    settings.setValue("splitter", splitter.saveState())
