"""Links in a model's reply can't reach the app's own actions or open anything but http(s)/mailto."""

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QTextCursor

from app.chat_view import ChatView, MessageAction
from app.store import Message

HOSTILE = {
    "markdown edit": "[here](edit:3)",
    "markdown copy": "[here](copy:0)",
    "markdown copymsg": "[here](copymsg:0)",
    "markdown previous": "[here](previous:99999)",
    "file": "[here](file:///etc/passwd)",
    "raw html": '<a href="edit:1">here</a>',
    "javascript": "[here](javascript:alert(1))",
    "autolink": "<edit:3>",
    "custom handler": "[here](ms-settings:privacy)",
    "relative": "[here](regenerate)",
}


def anchors(view: ChatView) -> list[tuple[str, int]]:
    """(href, document position) of every link in the rendered page."""
    found, block = [], view.document().begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().anchorHref():
                found.append((fragment.charFormat().anchorHref(), fragment.position()))
            it += 1
        block = block.next()
    return found


def click(qtbot, view: ChatView, position: int) -> None:
    cursor = QTextCursor(view.document())
    cursor.setPosition(position + 1)
    view.ensureCursorVisible()
    point = view.cursorRect(cursor).center()
    qtbot.mouseClick(view.viewport(), Qt.LeftButton, pos=point)


@pytest.fixture
def view(qtbot):
    v = ChatView()
    qtbot.addWidget(v)
    v.resize(700, 500)
    v.show()
    return v


@pytest.fixture
def opened(monkeypatch):
    urls = []
    monkeypatch.setattr("app.chat_view.QDesktopServices.openUrl", lambda url: urls.append(url.toString()))
    return urls


def reply(text: str) -> list[Message]:
    return [Message(1, 1, None, "user", "hi", 0.0), Message(2, 1, 1, "assistant", text, 1.0)]


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_links_written_by_the_model_do_nothing_when_clicked(qtbot, view, opened, text):
    view.show_thread(reply(f"Click {text} please\n\n```\nsecret\n```"))
    actions, copied = [], []
    view.action.connect(lambda kind, mid: actions.append((kind, mid)))
    view.copied.connect(copied.append)
    own = [href for href, _ in anchors(view) if href.startswith(view.action_prefix)]
    model_links = [(href, pos) for href, pos in anchors(view) if not href.startswith(view.action_prefix)]
    assert model_links == []  # the hostile link is rendered as text only
    assert sorted(own) == sorted(view.action_prefix + a for a in ("copymsg/0", "edit/1", "copymsg/1", "copy/0",
                                                                  "regenerate/2"))
    start = view.toPlainText().index("Click ") + len("Click ")
    click(qtbot, view, start)  # on the link's text, where a link would have been
    assert actions == [] and copied == [] and opened == []


def test_a_link_event_outside_the_views_prefix_is_ignored(view, opened):
    """Even if a hostile href reached the view (say, through a renderer bug), it would do nothing."""
    from PySide6.QtCore import QUrl

    actions = []
    view.action.connect(lambda kind, mid: actions.append(kind))
    view.show_thread(reply("hello"))
    for href in ("edit:1", "copy:0", "copymsg:0", "file:///etc/passwd", "javascript:alert(1)", "kvasir-0000:edit/1",
                 view.action_prefix + "edit/x", view.action_prefix + "copy/99"):
        view.anchorClicked.emit(QUrl(href))
    assert actions == [] and opened == []


def test_a_clicked_https_link_is_opened(qtbot, view, opened):
    view.show_thread(reply("See [the docs](https://example.com/docs) for more."))
    (href, position), = [(h, p) for h, p in anchors(view) if not h.startswith(view.action_prefix)]
    assert href == "https://example.com/docs" and opened == []  # nothing opens before a click
    click(qtbot, view, position)
    assert opened == ["https://example.com/docs"]


def test_the_views_own_links_still_work_when_clicked(qtbot, view, opened):
    view.show_thread(reply("```\nprint(1)\n```"))
    actions, copied = [], []
    view.action.connect(lambda kind, mid: actions.append((kind, mid)))
    view.copied.connect(copied.append)
    links = dict((href[len(view.action_prefix):], pos) for href, pos in anchors(view))
    click(qtbot, view, links["edit/1"])
    click(qtbot, view, links["copy/0"])
    click(qtbot, view, links["regenerate/2"])
    assert actions == [(MessageAction.EDIT, 1), (MessageAction.REGENERATE, 2)]
    assert copied == ["print(1)\n"] and opened == []


def test_each_view_has_its_own_prefix():
    assert ChatView().action_prefix != ChatView().action_prefix
