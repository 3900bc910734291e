"""Big content stays cheap to show: long replies are laid out on the render thread in chunks, long code and
long messages go to a box that loads a piece at a time, long tables to a table widget, and a streaming block
updates only what grew."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtCore import Qt

from app.data.store import Message
from app.tools.content_bench import cases, table
from app.transcript import blocks
from app.transcript.blocks import LONG_LINE_CHARS, PlainBlock, PlainTextBox, TableBlock, TableModel, TextBlock
from app.transcript.markdown import (
    CHUNK_HTML_CHARS,
    LONG_CODE_CHARS,
    MARKDOWN_LIMIT,
    TABLE_WIDGET_CELLS,
    CodeSegment,
    MarkdownRenderer,
    PlainSegment,
    TableSegment,
)
from app.transcript.render_worker import SYNC_RENDER_CHARS

PROSE = cases()["prose_100kB"]


@pytest.fixture
def md():
    return MarkdownRenderer()


def reply(text: str, role: str = "assistant") -> list[Message]:
    return [Message(1, 1, None, "user", "Show me.", 0.0), Message(2, 1, 1, role, text, 1.0)]


def test_long_prose_comes_in_chunks_that_together_are_the_whole_page(md):
    pieces = md.segments(PROSE)
    assert len(pieces) > 10 and all(isinstance(p, str) for p in pieces)
    paragraph = len(md.render(PROSE.split("\n\n")[0]))
    assert all(len(p) < CHUNK_HTML_CHARS + paragraph for p in pieces)
    assert "".join(pieces) == md.render(PROSE)


def test_a_message_too_long_for_markdown_is_shown_as_written(md):
    text = "*" * (MARKDOWN_LIMIT + 1)
    assert md.segments(text) == [PlainSegment(text)]


def test_a_long_code_block_is_not_highlighted_and_a_short_one_is(md):
    (long,) = md.segments("```python\n" + "x = 1\n" * (LONG_CODE_CHARS // 6 + 1) + "```")
    (short,) = md.segments("```python\nx = 1\n```")
    assert isinstance(long, CodeSegment) and long.highlighted == "" and long.code.startswith("x = 1\n")
    assert "<span" in short.highlighted


def test_a_large_table_becomes_its_cells_and_a_small_one_stays_rich_text(md):
    text = "Rows:\n\n" + table(40, columns=4) + "\nAfter."
    intro, grid, after = md.segments(text)
    assert isinstance(grid, TableSegment) and 40 * 4 > TABLE_WIDGET_CELLS
    assert grid.header == ("col 0", "col 1", "col 2", "col 3") and len(grid.rows) == 40
    assert grid.rows[3] == ("r3 c0 x", "r3 c1 x", "r3 c2 x", "r3 c3 x")  # the bold is dropped, the text kept
    assert grid.source == table(40, columns=4)
    assert "Rows:" in intro and "After." in after
    (small,) = md.segments(table(3, columns=4))
    assert isinstance(small, str) and "<table" in small


def test_a_long_reply_is_laid_out_off_the_gui_thread_and_then_shown(view, qtbot, monkeypatch):
    threads = []
    segments = MarkdownRenderer.segments
    monkeypatch.setattr(MarkdownRenderer, "segments",
                        lambda self, text: threads.append(threading.current_thread().name) or segments(self, text))
    with qtbot.waitSignal(view.renders.rendered, timeout=60_000):
        view.show_thread(reply(PROSE))
        assert view.message_widget(2).findChildren(TextBlock)[0].text().endswith("Laying out a long message…</span>")
    assert threads == ["kvasir-markdown"] and len(PROSE) > SYNC_RENDER_CHARS
    widget = view.message_widget(2)
    assert len(widget.findChildren(TextBlock)) > 10
    assert "a link" in widget.plain_text() and "Laying out" not in widget.plain_text()


def test_an_older_text_laid_out_late_does_not_replace_a_newer_one(view, qtbot):
    view.show_thread(reply("short"))
    view._rendered(2, PROSE, False, MarkdownRenderer().segments(PROSE))  # arrives after the text changed
    assert [b.text() for b in view.message_widget(2).findChildren(TextBlock)][-1] == "<p>short</p>\n"


def test_a_ten_megabyte_message_loads_into_its_box_a_piece_at_a_time(view, qtbot):
    text = "".join(f"line {i} of a very long message\n" for i in range(330_000))
    with qtbot.waitSignal(view.renders.rendered, timeout=60_000):
        view.show_thread(reply(text))
    (block,) = view.message_widget(2).findChildren(PlainBlock)
    assert not block.box.loaded and len(block.box.toPlainText()) < len(text)  # the first piece only
    assert block.note.text().startswith("Shown as written, without formatting: this message is 10.")
    with qtbot.waitSignal(block.box.loaded_all, timeout=120_000):
        pass
    assert block.box.toPlainText() == text


def test_a_long_message_of_the_users_goes_to_a_box_without_a_note(view):
    view.show_thread([Message(1, 1, None, "user", "pasted " * 5000, 0.0)])
    (block,) = view.message_widget(1).findChildren(PlainBlock)
    assert block.note.isHidden() and block.box.text == "pasted " * 5000


def test_a_box_breaks_very_long_lines_at_spaces_and_keeps_every_word(qtbot):
    box = PlainTextBox(monospace=False)
    qtbot.addWidget(box)
    words = " ".join(f"word{i}" for i in range(3000))
    box.show_text(words + "\nshort line\n" + words)
    lines = box.toPlainText().split("\n")
    assert max(map(len, lines)) <= LONG_LINE_CHARS and "short line" in lines
    assert box.toPlainText().split() == (words + " short line " + words).split()


def test_a_growing_box_appends_and_never_starts_over(qtbot, monkeypatch):
    box = PlainTextBox(monospace=True)
    qtbot.addWidget(box)
    monkeypatch.setattr(blocks, "LOAD_PIECE_CHARS", 1000)
    box.show_text("a\n" * 400)
    cleared = []
    monkeypatch.setattr(box, "clear", lambda: cleared.append(True))
    with qtbot.waitSignal(box.loaded_all, timeout=10_000):
        box.show_text("a\n" * 400 + "b\n" * 1000)
    assert cleared == [] and box.toPlainText() == "a\n" * 400 + "b\n" * 1000


def test_a_streaming_table_adds_only_its_new_rows_and_copies_its_markdown(view, qtbot, md):
    first, more = md.segments(table(30)), md.segments(table(32))
    block = TableBlock(first[0], view.copy)
    qtbot.addWidget(block)
    inserted, changed, reset = [], [], []
    block.model.rowsInserted.connect(lambda _parent, start, end: inserted.append((start, end)))
    block.model.dataChanged.connect(lambda top, bottom: changed.append((top.row(), bottom.row())))
    block.model.modelReset.connect(lambda: reset.append(True))
    block.show_segment(more[0])
    assert inserted == [(30, 31)] and changed == [] and reset == []
    assert block.model.rowCount() == 32 and block.model.index(31, 2).data() == "r31 c2 x"
    assert block.model.headerData(2, Qt.Horizontal) == "col 2"
    edited = md.segments(table(32).replace("r5 c1 **x**", "r5 c1 **y**"))
    block.show_segment(edited[0])
    assert changed == [(5, 5)] and block.model.index(5, 1).data() == "r5 c1 y"
    with qtbot.waitSignal(view.copied) as copied:
        qtbot.mouseClick(block.copy_button, Qt.LeftButton)
    assert copied.args == [edited[0].source]


def test_the_table_model_passes_qts_model_checks(qtmodeltester, md):
    model = TableModel()
    model.show_table(md.segments(table(40, columns=4))[0])
    qtmodeltester.check(model, force_py=True)
