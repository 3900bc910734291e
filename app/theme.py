"""Light and dark themes (Fusion with a palette), following the system (live) unless the user chose one."""

from __future__ import annotations

import warnings

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

# The app's colours by what they mean: widgets name the role, never the colour. A pair is (light, dark).
ERROR = "#c0392b"  # something failed; a context nearly full
WARNING = "#b06000"  # a context filling up; older messages not shown
CAUTION = "#b7791f"  # advice the user may ignore (an API key over plain http)
SUCCESS = "#2e8b57"
MUTED = "#888888"  # secondary text: a reply's numbers, hints, a code block's language
QUIET_RULE = "rgba(136, 136, 136, 120)"  # the line beside quieter text (a reply's reasoning), on light and dark
SPEAKER = {"user": "#4a7bd0", "assistant": "#3a9a6a"}  # the name over a message
LINK = ("#1a5fb4", "#8ab4f8")
CODE_BACKGROUND = ("#f4f4f4", "#272822")
TABLE_BORDER = ("#cccccc", "#555555")
DRAFTED = ("#dcefd9", "#2f4a33")  # behind a reply's words that came from kept draft tokens (View > Highlight drafts)
BANNER = {"background": "#fdecea", "border": "#e0a39c", "text": "#5f2120"}  # the engine has stopped
SERIES = {  # the panels' charts and plots
    "decode": "#3a7bd5", "prefill": "#e67e22", "kv_usage": "#8e44ad", "ttft": "#c0392b", "queue": "#5f6b7a",
    "hit_rate": "#2eaa6a", "token_gap": "#16a085",
}
MEMORY = {"weights": "#3a7bd5", "kv": "#8e44ad", "graphs": "#e67e22", "others": "#17a2b8",
          "runtime": "#9aa1aa"}  # the memory bar
BLOCKS = {"shared": "#8e44ad", "cached": "#2eaa6a", "free": "#9aa1aa", "unowned": "#6c7a89"}  # the KV pool
# Chats' colours in the pool and the request list: none is the shared purple, the cached green or a grey.
CHATS = ("#3a7bd5", "#e67e22", "#c0392b", "#d4ac0d", "#e84393", "#8d6e63", "#17a2b8", "#34495e")


def for_scheme(pair: tuple[str, str], dark: bool) -> str:
    """The light or the dark colour of ``pair``."""
    return pair[1] if dark else pair[0]


DARK = {
    QPalette.Window: "#202124", QPalette.WindowText: "#e8eaed", QPalette.Base: "#17181a",
    QPalette.AlternateBase: "#26272b", QPalette.Text: "#e8eaed", QPalette.Button: "#2b2c30",
    QPalette.ButtonText: "#e8eaed", QPalette.Highlight: "#3a7bd5", QPalette.HighlightedText: "#ffffff",
    QPalette.ToolTipBase: "#2b2c30", QPalette.ToolTipText: "#e8eaed", QPalette.Link: "#8ab4f8",
    QPalette.PlaceholderText: "#9aa0a6",
}


def system_prefers_dark() -> bool:
    return QGuiApplication.styleHints().colorScheme() == Qt.ColorScheme.Dark


def follow_system_scheme(callback) -> bool:
    """Call ``callback()`` whenever the desktop switches between light and dark; False where Qt can't tell."""
    signal = getattr(QGuiApplication.styleHints(), "colorSchemeChanged", None)  # Qt >= 6.5
    if signal is None:
        return False
    signal.connect(callback)
    return True


def stop_following_system_scheme(callback) -> None:
    signal = getattr(QGuiApplication.styleHints(), "colorSchemeChanged", None)
    if signal is not None:
        with warnings.catch_warnings():  # PySide warns, besides raising, when the connection is already gone
            warnings.simplefilter("ignore", RuntimeWarning)
            try:
                signal.disconnect(callback)
            except (RuntimeError, TypeError):  # never connected, or Qt already dropped it
                pass


def is_dark(choice: str) -> bool:
    """``choice``: "system", "light" or "dark"."""
    return choice == "dark" or (choice == "system" and system_prefers_dark())


def apply_theme(app: QApplication, choice: str) -> bool:
    """Style the whole application; returns True when the result is dark."""
    dark = is_dark(choice)
    app.setStyle("Fusion")
    palette = app.style().standardPalette()
    if dark:
        for role, color in DARK.items():
            palette.setColor(role, QColor(color))
        palette.setColor(QPalette.Disabled, QPalette.Text, QColor("#6f7378"))
        palette.setColor(QPalette.Disabled, QPalette.ButtonText, QColor("#6f7378"))
    app.setPalette(palette)
    return dark
