"""The "system" theme follows the desktop live: when it switches between light and dark the window follows,
unless the user chose a theme of their own."""

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLabel

from app.transcript.view import CodeBlock


def switch_desktop(monkeypatch, dark: bool) -> None:
    """What a desktop does: its scheme changes, and Qt says so."""
    monkeypatch.setattr("app.theme.system_prefers_dark", lambda: dark)
    QGuiApplication.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark if dark else Qt.ColorScheme.Light)


def test_following_the_system_switches_palette_and_code_colours_live(window, qapp, qloop, monkeypatch):
    window.bridge.words = ["```python\nx = 1\n```"]
    qloop.run_until_complete(window.send("code"))
    assert window.settings["theme"] == "system"
    switch_desktop(monkeypatch, dark=True)
    (block,) = window.chat.last_widget().findChildren(CodeBlock)
    assert qapp.palette().window().color().lightness() < 80 and window.chat.renderer.dark
    assert "#272822" in block.styleSheet()  # the code block's background followed too
    switch_desktop(monkeypatch, dark=False)
    assert qapp.palette().window().color().lightness() > 180 and not window.chat.renderer.dark
    assert "#f4f4f4" in block.styleSheet()


def test_the_transcript_itself_turns_dark_its_buttons_stay_readable_and_links_change_colour(window, qloop, qtbot,
                                                                                           monkeypatch):
    window.bridge.words = ["See [the docs](https://docs.python.org)."]
    qloop.run_until_complete(window.send("docs?"))
    window.apply_theme("light")
    switch_desktop(monkeypatch, dark=True)
    reply = window.chat.last_widget()
    qtbot.waitUntil(lambda: reply.isVisible())
    image = window.chat.viewport().grab().toImage()
    background = image.pixelColor(image.width() // 2, image.height() - 10)
    assert background.lightness() < 80  # it stayed light before: the style sheet kept the old palette
    copy = reply.button("Copy")
    assert copy.palette().buttonText().color().lightness() > 180 and copy.palette().button().color().lightness() < 80
    (text,) = [label for label in reply.findChildren(QLabel) if "the docs" in label.text()]
    assert "#8ab4f8" in text.text()
    switch_desktop(monkeypatch, dark=False)
    assert "#1a5fb4" in text.text()


def test_a_chosen_theme_ignores_the_desktop(window, qapp, monkeypatch):
    window.settings["theme"] = "light"
    window.apply_theme("light")
    switch_desktop(monkeypatch, dark=True)
    assert qapp.palette().window().color().lightness() > 180 and not window.chat.renderer.dark


def test_a_closed_window_stops_listening(window, monkeypatch):
    applied = []
    window.close()
    monkeypatch.setattr(type(window), "apply_theme", lambda self, choice: applied.append(choice))
    switch_desktop(monkeypatch, dark=True)
    assert applied == []
