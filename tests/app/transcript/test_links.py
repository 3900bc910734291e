"""Links in a model's reply can't reach anything but http(s)/mailto; the app's own actions are buttons."""

import pytest

from app.data.store import Message
from app.transcript.blocks import CodeBlock, TextBlock
from app.transcript.view import ChatView, MessageAction

HOSTILE = {
    "markdown edit": "[here](edit:3)",
    "file": "[here](file:///etc/passwd)",
    "raw html": '<a href="edit:1">here</a>',
    "javascript": "[here](javascript:alert(1))",
    "autolink": "<edit:3>",
    "custom handler": "[here](ms-settings:privacy)",
    "relative": "[here](regenerate)",
}


@pytest.fixture
def opened(monkeypatch):
    urls = []
    monkeypatch.setattr("app.transcript.blocks.QDesktopServices.openUrl", lambda url: urls.append(url.toString()))
    return urls


def reply(text: str) -> list[Message]:
    return [Message(1, 1, None, "user", "hi", 0.0), Message(2, 1, 1, "assistant", text, 1.0)]


def texts(view: ChatView, message_id: int) -> list[TextBlock]:
    return view.message_widget(message_id).findChildren(TextBlock)


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_links_written_by_the_model_are_text_only(view, opened, text):
    view.show_thread(reply(f"Click {text} please"))
    (label,) = texts(view, 2)
    assert "<a " not in label.text() and "here" in view.toPlainText() or "edit:3" in view.toPlainText()
    for href in ("edit:1", "file:///etc/passwd", "javascript:alert(1)", "ms-settings:privacy"):
        label.linkActivated.emit(href)  # even if one reached the label, it would open nothing
    assert opened == []


def test_a_clicked_https_link_is_opened(view, opened):
    view.show_thread(reply("See [the docs](https://example.com/docs) for more."))
    (label,) = texts(view, 2)
    assert 'href="https://example.com/docs"' in label.text() and opened == []
    label.linkActivated.emit("https://example.com/docs")
    assert opened == ["https://example.com/docs"]


def test_the_users_own_text_is_never_markup(view):
    view.show_thread([Message(1, 1, None, "user", "<b>bold?</b> [x](https://a.b)", 0.0)])
    (label,) = texts(view, 1)
    assert label.text() == "<b>bold?</b> [x](https://a.b)" and label.textFormat().name == "PlainText"


def test_the_views_own_actions_are_buttons(qtbot, view, opened):
    from PySide6.QtCore import Qt

    view.show_thread(reply("Here:\n\n```python\nprint(1)\n```\n\nDone."))
    actions, copied = [], []
    view.action.connect(lambda kind, mid: actions.append((kind, mid)))
    view.copied.connect(copied.append)
    (block,) = view.message_widget(2).findChildren(CodeBlock)
    assert block.language.text() == "python"
    qtbot.mouseClick(view.message_widget(1).button("Edit"), Qt.LeftButton)
    qtbot.mouseClick(block.copy_button, Qt.LeftButton)
    qtbot.mouseClick(view.message_widget(2).button("Regenerate"), Qt.LeftButton)
    qtbot.mouseClick(view.message_widget(2).button("Copy"), Qt.LeftButton)
    assert actions == [(MessageAction.EDIT, 1), (MessageAction.REGENERATE, 2)]
    assert copied == ["print(1)\n", "Here:\n\n```python\nprint(1)\n```\n\nDone."] and opened == []


IMAGE = '<img/src="file:///etc/kvasir-test.png">'  # markup that would make Qt load a local file


def test_a_code_blocks_language_and_an_error_are_shown_as_written_never_as_markup(view):
    from app.data.store import Status

    failed = Message(2, 1, 1, "assistant", f"```{IMAGE}\nx = 1\n```", 1.0, status=Status.ERROR, error=IMAGE)
    view.show_thread([Message(1, 1, None, "user", "hi", 0.0), failed])
    (block,) = view.message_widget(2).findChildren(CodeBlock)
    footer = view.message_widget(2).footer
    assert block.language.text() == IMAGE and block.language.textFormat().name == "PlainText"
    assert footer.text() == f"Failed: {IMAGE}" and footer.textFormat().name == "PlainText"


def test_a_persona_tooltip_shows_an_imported_system_prompt_literally(window):
    window.conversations.configure(window.current, None, f"Be {IMAGE} brief.", {})
    tip = window.pane.persona_button.toolTip()
    assert "<img" not in tip and "&lt;img/src=&quot;file:///etc/kvasir-test.png&quot;&gt;" in tip


def test_the_engine_banner_shows_a_reason_literally(window):
    window.banner.show_engine_stopped(f"CUDA error {IMAGE}")
    assert window.banner.reason.textFormat().name == "PlainText" and IMAGE in window.banner.reason.text()
