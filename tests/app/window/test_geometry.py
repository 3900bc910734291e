"""The window opens at a size that fits the screen, remembers where it was left, and draws sharply at any
scale factor (the high-DPI policy passes fractional factors through)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QRect, QSettings
from PySide6.QtWidgets import QScrollArea

from app.chats.session import ChatSession
from app.window.geometry import FIRST_START_MAX, FIRST_START_SHARE, first_start_geometry, fit_to_screen
from app.window.main_window import MainWindow
from tests.helpers.fake_engine import FakeBridge


def test_the_first_start_opens_at_a_share_of_the_screen_centred(window):
    available = window.screen().availableGeometry()
    assert window.width() == int(available.width() * FIRST_START_SHARE[0])
    assert window.height() == int(available.height() * FIRST_START_SHARE[1])
    assert available.contains(window.geometry())
    assert abs(window.geometry().center().x() - available.center().x()) <= 1


def test_on_a_large_screen_the_first_window_is_not_huge():
    rect = first_start_geometry(QRect(0, 0, 5120, 2880))
    assert (rect.width(), rect.height()) == (FIRST_START_MAX.width(), FIRST_START_MAX.height())
    assert rect.center() == QRect(0, 0, 5120, 2880).center()
    laptop = first_start_geometry(QRect(0, 32, 1366, 736))  # a panel at the top
    assert (laptop.width(), laptop.height()) == (1092, 625) and QRect(0, 32, 1366, 736).contains(laptop)


def test_a_saved_window_larger_than_the_screen_is_brought_inside_it(qtbot, window, store):
    available = window.screen().availableGeometry()
    window.setGeometry(QRect(-300, -200, available.width() * 2, available.height() * 2))
    window.close()  # saves where it was
    assert QSettings("Kvasir", "Kvasir").value("geometry")
    again = MainWindow(ChatSession(store, FakeBridge()))
    qtbot.addWidget(again)
    frame = again.frameGeometry()
    assert available.contains(frame) and frame.width() > available.width() * 0.95
    assert frame.height() > available.height() * 0.95


def test_a_saved_window_that_fits_opens_where_it_was_left(qtbot, window, store):
    window.setGeometry(QRect(20, 30, 620, 440))
    window.close()
    again = MainWindow(ChatSession(store, FakeBridge()))
    qtbot.addWidget(again)
    assert again.geometry() == QRect(20, 30, 620, 440)


def test_fit_to_screen_moves_and_shrinks():
    screen = QRect(0, 0, 1920, 1040)
    assert fit_to_screen(QRect(100, 100, 800, 600), screen) == QRect(100, 100, 800, 600)
    assert fit_to_screen(QRect(1800, 900, 800, 600), screen) == QRect(1120, 440, 800, 600)  # off the corner
    assert fit_to_screen(QRect(-3000, 50, 4000, 3000), screen) == screen  # from a detached larger monitor
    second = QRect(1920, 0, 1280, 1024)  # a screen to the right
    assert fit_to_screen(QRect(1900, 10, 600, 400), second) == QRect(1920, 10, 600, 400)


RENDER = r"""
import json, sys
from PySide6.QtGui import QGuiApplication
from app.startup.application import create_application
app = create_application(sys.argv[:1])
from app.transcript.view import ChatView
from app.data.store import Message
window = ChatView()  # the transcript alone: the window's own drawing, without loading the engine's modules
window.show_thread([Message(1, 1, None, "user", "Sort?", 0.0),
                    Message(2, 1, 1, "assistant", "Use:\n\n```python\nsorted(xs)\n```", 1.0)])
window.resize(700, 500)
window.show()
app.processEvents()
image = window.grab().toImage()
print(json.dumps({"policy": QGuiApplication.highDpiScaleFactorRoundingPolicy().name,
                  "ratio": window.devicePixelRatioF(), "image": [image.width(), image.height()],
                  "logical": [window.width(), window.height()]}))
"""


def test_the_window_renders_at_the_screens_scale_factor(tmp_path):
    """In a process of its own: the scale factor is fixed when the application starts. At 150 % the Round
    policy would draw at 2x (too large); PassThrough keeps 1.5."""
    factor = "1.5"
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "QT_SCREEN_SCALE_FACTORS": factor,
           "KVASIR_DATA_DIR": str(tmp_path), "KVASIR_CONFIG_DIR": str(tmp_path), "PYTHONPATH": str(root)}
    env.pop("QT_SCALE_FACTOR_ROUNDING_POLICY", None)
    done = subprocess.run([sys.executable, "-c", RENDER, str(tmp_path)], env=env, capture_output=True, text=True,
                          timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["policy"] == "PassThrough"
    assert result["ratio"] == float(factor)  # 1.5 stays 1.5: not rounded to 2 (too big) or 1 (too small)
    assert result["image"] == [round(result["logical"][0] * float(factor)), round(result["logical"][1] * float(factor))]


def test_the_window_fits_a_small_laptop_screen(window):
    """1366 x 768, less a panel: nothing in the window may need more (the engine panel scrolls instead)."""
    need = window.minimumSizeHint().expandedTo(window.minimumSize())
    assert need.width() <= 1366 and need.height() <= 700, need
    window.resize(1280, 680)
    areas = [window.side, *window.side.findChildren(QScrollArea)]
    assert window.side.isVisible() and any(area.verticalScrollBar().maximum() > 0 for area in areas)
