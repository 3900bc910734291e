"""Replies render as Markdown (headings, lists, inline code, tables, links only when safe), code blocks are
highlighted by Pygments, and a code block's Copy button copies exactly its code."""

import re

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.data.store import Message
from app.transcript.blocks import CodeBlock
from app.transcript.markdown import CodeSegment, MarkdownRenderer
from app.transcript.view import ChatView

COLOUR_SPAN = re.compile(r'<span style="[^"]*color: ?(#[0-9a-fA-F]{3,6})')


@pytest.fixture
def md():
    return MarkdownRenderer()


def test_headings_lists_emphasis_and_inline_code(md):
    page = md.render("# Title\n\n## Part\n\n- one\n- **two**\n\n1. first\n2. `code()`\n\n~~gone~~ *soft*")
    assert "<h1>Title</h1>" in page and "<h2>Part</h2>" in page
    assert "<ul>\n<li>one</li>\n<li><strong>two</strong></li>\n</ul>" in page
    assert "<ol>" in page and "<li><code>code()</code></li>" in page
    assert "<s>gone</s>" in page and "<em>soft</em>" in page


def test_tables_get_borders_qt_can_draw(md):
    page = md.render("| a | b |\n|---|---|\n| 1 | 2 |")
    assert '<table border="1" cellspacing="0" cellpadding="5"' in page
    assert "<th>a</th>" in page and "<td>2</td>" in page
    assert "#555555" in MarkdownRenderer(dark=True).render("| a |\n|---|\n| 1 |")  # a border the dark theme shows


def test_links_are_kept_only_when_safe_and_html_is_shown_as_text(md):
    page = md.render("[docs](https://example.com) [mail](mailto:a@b.c) [bad](javascript:alert(1)) "
                     "[file](file:///etc/passwd) <b>bold</b> ![cat](https://x/cat.png)")
    assert '<a href="https://example.com" style="color: #1a5fb4;">docs</a>' in page
    assert '<a href="mailto:a@b.c" style="color: #1a5fb4;">mail</a>' in page
    assert page.count("<a ") == 2 and 'href="javascript' not in page and 'href="file' not in page
    assert "bad" in page and "file" in page  # the text stays, as text
    assert "&lt;b&gt;bold&lt;/b&gt;" in page and "<b>" not in page
    assert "[image: cat]" in page and "<img" not in page


def test_a_python_block_gets_pygments_colours_and_the_theme_changes_them(md):
    text = "Try:\n\n```python\ndef square(x):\n    return x * x  # tidy\n```\n\nDone."
    pieces = md.segments(text)
    assert [type(p).__name__ for p in pieces] == ["str", "CodeSegment", "str"]
    code = pieces[1]
    assert isinstance(code, CodeSegment) and code.language == "python"
    assert code.code == "def square(x):\n    return x * x  # tidy\n"
    light = set(COLOUR_SPAN.findall(code.highlighted))
    assert len(light) >= 3  # keywords, names, comments at least
    assert re.search(r'<span style="[^"]*">def</span>', code.highlighted)
    dark = set(COLOUR_SPAN.findall(MarkdownRenderer(dark=True).segments(text)[1].highlighted))
    assert dark and dark != light


def test_an_unknown_language_and_an_unfinished_fence_still_render(md):
    (unknown,) = md.segments("```klingon\nqapla'\n```")
    assert unknown.language == "klingon" and "qapla" in unknown.highlighted and "color" not in unknown.highlighted
    streaming = md.segments("Here:\n\n```python\nprint(")  # the reply is still being written
    assert streaming[-1].code == "print(" and streaming[-1].language == "python"


def test_the_copy_button_puts_exactly_the_code_in_the_clipboard(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.show()
    code = 'for i in range(3):\n    print(f"<{i}>")  # & more\n'
    view.show_thread([Message(1, 1, None, "user", "loop?", 0.0),
                      Message(2, 1, 1, "assistant", f"Like so:\n\n```python\n{code}```\n\nAnd `inline`.", 1.0)])
    (block,) = view.message_widget(2).findChildren(CodeBlock)
    assert block.language.text() == "python" and block.copy_button.accessibleName() == "Copy the python block"
    QGuiApplication.clipboard().setText("something else")
    qtbot.mouseClick(block.copy_button, Qt.LeftButton)
    assert QGuiApplication.clipboard().text() == code
    QGuiApplication.clipboard().setText("something else")
    block.copy_button.setFocus()
    qtbot.keyClick(block.copy_button, Qt.Key_Space)  # and from the keyboard
    assert QGuiApplication.clipboard().text() == code


def test_a_long_code_line_wraps_inside_its_block_rather_than_being_cut(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(500, 400)
    view.show()
    line = "values = [" + ", ".join(str(i) for i in range(120)) + "]"
    view.show_thread([Message(1, 1, None, "assistant", f"```python\n{line}\n```", 0.0)])
    (block,) = view.message_widget(1).findChildren(CodeBlock)
    qtbot.waitUntil(lambda: block.isVisible() and view.page.width() == view.viewport().width())
    qtbot.waitUntil(lambda: block.mapTo(view.page, block.rect().topRight()).x() < view.page.width())
    right = block.code.mapTo(view.page, block.code.rect().topRight()).x()
    assert right < view.page.width() and block.code.minimumSizeHint().width() < view.page.width()
    assert block.code.height() > 3 * block.code.fontMetrics().lineSpacing()  # the line goes on below, whole
    assert block.source == line + "\n"  # Copy still gives the one line
