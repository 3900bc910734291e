"""The text size setting scales the transcript (messages, code blocks, the numbers under replies) and the
message box, from Preferences or Ctrl+= / Ctrl+- / Ctrl+0, and is remembered."""

import pytest

from app.data.settings import Settings, next_text_scale
from app.transcript.blocks import CodeBlock, TextBlock
from app.transcript.view import FOOTER_SCALE


def sizes(window) -> dict[str, float]:
    """The point size of each kind of text in the last reply, and of the message box."""
    reply = window.chat.last_widget()
    (code,) = reply.findChildren(CodeBlock)
    text = next(w for w in reply.findChildren(TextBlock) if w.textFormat().name == "RichText")
    return {"text": text.font().pointSizeF(), "code": code.code.font().pointSizeF(),
            "header": reply.header.font().pointSizeF(), "footer": reply.footer.font().pointSizeF(),
            "composer": window.composer.edit.font().pointSizeF()}


@pytest.fixture
def chat_with_code(window, qloop):
    window.bridge.words = ["Here:\n\n```python\nprint(1)\n```\n\nDone."]
    qloop.run_until_complete(window.send("Show me code"))
    return window


def test_ctrl_plus_and_minus_scale_messages_code_and_the_message_box(qtbot, chat_with_code):
    window = chat_with_code
    normal = sizes(window)
    assert normal["text"] == normal["code"] == normal["header"] == normal["composer"] > 0
    assert normal["footer"] == pytest.approx(normal["text"] * FOOTER_SCALE)
    window.composer.edit.setFocus()
    from PySide6.QtCore import Qt

    for _ in range(3):
        qtbot.keyClick(window.composer.edit, Qt.Key_Equal, Qt.ControlModifier)
    assert window.settings["text_scale"] == 150
    large = sizes(window)
    for kind, size in normal.items():
        assert large[kind] == pytest.approx(size * 1.5), kind
    qtbot.keyClick(window.composer.edit, Qt.Key_Minus, Qt.ControlModifier)
    assert sizes(window)["code"] == pytest.approx(normal["code"] * 1.25)
    qtbot.keyClick(window.composer.edit, Qt.Key_0, Qt.ControlModifier)
    assert sizes(window) == pytest.approx(normal)


def test_a_message_written_after_the_change_has_the_new_size(window, qloop):
    window.set_text_scale(200)
    qloop.run_until_complete(window.send("Hello"))
    text = next(w for w in window.chat.last_widget().findChildren(TextBlock))
    assert text.font().pointSizeF() == pytest.approx(window.chat._base_point_size * 2)


def test_the_text_size_is_remembered(qtbot, window, store):
    from app.chats.session import ChatSession
    from app.window.main_window import MainWindow
    from tests.helpers.fake_engine import FakeBridge

    window.set_text_scale(125)
    assert Settings(window.settings.path)["text_scale"] == 125
    again = MainWindow(ChatSession(store, FakeBridge(), settings=Settings(window.settings.path)))
    qtbot.addWidget(again)
    assert again.chat.page.font().pointSizeF() == pytest.approx(again.chat._base_point_size * 1.25)
    assert again.composer.edit.font().pointSizeF() == pytest.approx(again.composer._base_font.pointSizeF() * 1.25)


def test_the_message_box_keeps_three_lines_at_any_size(window):
    window.set_text_scale(100)
    small = window.composer.edit.height()
    window.set_text_scale(200)
    assert window.composer.edit.height() > small * 1.6  # grows with the text, so three lines still show


def test_the_steps_stop_at_the_ends_and_a_bad_saved_value_falls_back(tmp_path):
    assert next_text_scale(100, 1) == 110 and next_text_scale(100, -1) == 90
    assert next_text_scale(300, 1) == 300 and next_text_scale(50, -1) == 50
    assert next_text_scale(113, 1) == 125 and next_text_scale(113, -1) == 110
    path = tmp_path / "settings.json"
    path.write_text('{"text_scale": 9000}')
    assert Settings(path)["text_scale"] == 100
    path.write_text('{"text_scale": true}')
    assert Settings(path)["text_scale"] == 100
