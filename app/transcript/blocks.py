"""The widgets a message's body is made of, one per segment (see :meth:`MarkdownRenderer.segments`).

Each block shows one kind of segment and updates itself in place (``show``), so a streaming reply redraws only
the block that changed. Long content goes to widgets that lay out lazily: a plain-text box that loads its text a
piece per turn of the event loop, and a table widget, so no block keeps the window waiting.
"""

from __future__ import annotations

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QFontDatabase, QPalette, QTextCursor, QTextDocumentFragment
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QSizePolicy,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from ..theme import CODE_BACKGROUND, MUTED, for_scheme
from ..units import size_text
from .markdown import CodeSegment, PlainSegment, Segment, TableSegment, is_safe_link

LOAD_PIECE_CHARS = 256 * 1024  # what a plain-text box takes in per turn of the event loop (about 30 ms)
LONG_LINE_CHARS = 10_000  # a box breaks longer lines at a space: Qt lays out a line whole, each time it grows
BOX_LINES = 24  # a long block's box shows this many lines and scrolls the rest
TABLE_ROWS_SHOWN = 15


def open_link(href: str) -> None:
    if is_safe_link(href):
        QDesktopServices.openUrl(QUrl(href))


class TextBlock(QLabel):
    """Rich text from Markdown: selectable; a link opens outside the app only when it is http(s) or mailto."""

    def __init__(self, rich: bool, parent=None) -> None:
        super().__init__(parent)
        self.setWordWrap(True)
        self.setTextFormat(Qt.RichText if rich else Qt.PlainText)
        self.setTextInteractionFlags(Qt.TextBrowserInteraction if rich else Qt.TextSelectableByMouse |
                                     Qt.TextSelectableByKeyboard)
        self.setOpenExternalLinks(False)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Minimum)
        self.linkActivated.connect(open_link)

    def show_segment(self, piece: str) -> None:
        if self.text() != piece:
            self.setText(piece)

    def plain_text(self) -> str:
        return QTextDocumentFragment.fromHtml(self.text()).toPlainText() if self.textFormat() == Qt.RichText \
            else self.text()

    def focusables(self) -> list[QWidget]:
        return [self] if self.focusPolicy() & Qt.TabFocus else []


class PlainTextBox(QPlainTextEdit):
    """Long text, read-only, at most :data:`BOX_LINES` lines tall with its own scroll bar. It takes its text in
    pieces of :data:`LOAD_PIECE_CHARS`, one per turn of the event loop, and text that grows (a streaming reply)
    is appended, not set again."""

    loaded_all = Signal()  # the whole text is in the box

    def __init__(self, monospace: bool, parent=None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setFrameShape(QFrame.NoFrame)
        palette = self.palette()
        palette.setColor(QPalette.Base, Qt.transparent)  # the block's own background shows through
        self.setPalette(palette)
        self.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard)
        if monospace:
            self.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)
        self.text = ""  # all of it, loaded or still to load
        self._loaded = 0
        self._run = 0  # characters on the box's last line so far
        self._loader = QTimer(self, singleShot=True, interval=0)
        self._loader.timeout.connect(self._load_piece)

    def show_text(self, text: str) -> None:
        if text == self.text:
            return
        if not text.startswith(self.text[: self._loaded]):
            self.clear()
            self._loaded = self._run = 0
        self.text = text
        self._load_piece()

    @property
    def loaded(self) -> bool:
        return self._loaded == len(self.text)

    def sizeHint(self) -> QSize:
        lines = min(BOX_LINES, max(1, self.document().blockCount()))
        margins = self.contentsMargins()
        height = lines * self.fontMetrics().lineSpacing() + 2 * self.document().documentMargin() + \
            margins.top() + margins.bottom()
        return QSize(super().sizeHint().width(), int(height))

    def _load_piece(self) -> None:
        piece = self.text[self._loaded: self._loaded + LOAD_PIECE_CHARS]
        if piece:
            cursor = QTextCursor(self.document())
            cursor.movePosition(QTextCursor.End)
            cursor.insertText(self._broken(piece))
            self._loaded += len(piece)
            self.updateGeometry()
        if not self.loaded:
            self._loader.start()
        elif piece:
            self.loaded_all.emit()


    def _broken(self, piece: str) -> str:
        """``piece`` with a line break for the last space of every :data:`LONG_LINE_CHARS` on one line (Copy
        gives the text as written; only the box's wrapping is decided here)."""
        out, start = [], 0
        while True:
            newline = piece.find("\n", start)
            end = len(piece) if newline < 0 else newline
            while self._run + end - start > LONG_LINE_CHARS:
                cut = start + LONG_LINE_CHARS - self._run
                space = piece.rfind(" ", start, cut)
                cut = space + 1 if space > start else cut
                out.append(piece[start:cut].rstrip(" ") + "\n")
                start, self._run = cut, 0
            out.append(piece[start:end + (newline >= 0)])
            if newline < 0:
                self._run += end - start
                return "".join(out)
            start, self._run = newline + 1, 0


class CodeBlock(QFrame):
    """A code block: a header with its language and a Copy button, then the code, highlighted, or for a long
    block plain in a scrolled box."""

    def __init__(self, segment: CodeSegment, copy, dark: bool, parent=None) -> None:
        super().__init__(parent)
        self.setObjectName("codeBlock")
        self.dark: bool | None = None
        self.header, self.language, self.copy_button = _header(self, copy)
        self.code: QLabel | PlainTextBox | None = None
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(0, 0, 0, 6)
        self._layout.setSpacing(0)
        self._layout.addLayout(self.header)
        self.show_segment(segment, dark)

    def show_segment(self, segment: CodeSegment, dark: bool) -> None:
        self.source = segment.code
        what = segment.language or "code"
        long = not segment.highlighted and bool(segment.code)
        self.language.setText(f"{what} · {segment.code.count(chr(10)):,} lines, not highlighted" if long else what)
        self.copy_button.setToolTip(f"Copy the {what} block")
        self.copy_button.setAccessibleName(f"Copy the {what} block")
        self._body(long).setAccessibleName(f"{what} block" if segment.language else "Code block")
        if long:
            self.code.show_text(segment.code)
        else:
            # long lines wrap rather than run past the block's edge, where they were cut off; Copy gives them whole
            self.code.setText(f'<pre style="margin: 0 8px; font-family: monospace; white-space: pre-wrap;">'
                              f'{segment.highlighted}</pre>')
        if dark != self.dark:  # the theme changed: the background follows the highlighting's colours
            self.dark = dark
            self.setStyleSheet(f"QFrame#codeBlock {{ background: {for_scheme(CODE_BACKGROUND, dark)}; "
                               "border-radius: 6px; }")

    def _body(self, long: bool) -> QLabel | PlainTextBox:
        """The widget the code shows in; replaced when a streaming block grows past the highlighting limit."""
        if isinstance(self.code, PlainTextBox if long else QLabel):
            return self.code
        if self.code is not None:
            self._layout.removeWidget(self.code)
            self.code.deleteLater()
        if long:
            self.code = PlainTextBox(monospace=True)
        else:
            self.code = QLabel()
            self.code.setTextFormat(Qt.RichText)
            self.code.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard)
            self.code.setWordWrap(True)
        self._layout.addWidget(self.code)
        return self.code

    def plain_text(self) -> str:
        return self.source

    def focusables(self) -> list[QWidget]:
        return [self.copy_button, self.code]


class TableModel(QAbstractTableModel):
    """A table's cells for a view: nothing is made per cell, so 8,000 cells cost what 80 do."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.header: tuple[str, ...] = ()
        self.rows: tuple[tuple[str, ...], ...] = ()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.header)

    def data(self, index: QModelIndex, role=Qt.DisplayRole):
        if role != Qt.DisplayRole or not index.isValid():
            return None
        row = self.rows[index.row()]
        return row[index.column()] if index.column() < len(row) else ""

    def headerData(self, section: int, orientation, role=Qt.DisplayRole):
        if role == Qt.DisplayRole and orientation == Qt.Horizontal and section < len(self.header):
            return self.header[section]
        return None

    def show_table(self, segment: TableSegment) -> None:
        """Take ``segment``'s cells: a new header resets the table; otherwise rows are changed and added."""
        if segment.header != self.header:
            self.beginResetModel()
            self.header, self.rows = segment.header, segment.rows
            self.endResetModel()
            return
        old, new = self.rows, segment.rows
        kept = min(len(old), len(new))
        changed = [i for i in range(kept) if old[i] != new[i]]
        if len(new) < len(old):
            self.beginRemoveRows(QModelIndex(), len(new), len(old) - 1)
            self.rows = new
            self.endRemoveRows()
        elif len(new) > len(old):
            self.beginInsertRows(QModelIndex(), len(old), len(new) - 1)
            self.rows = new
            self.endInsertRows()
        self.rows = new
        if changed:
            self.dataChanged.emit(self.index(changed[0], 0), self.index(changed[-1], len(self.header) - 1))


class TableBlock(QFrame):
    """A large table: its size and a Copy button (the Markdown), then a table view of its rows."""

    def __init__(self, segment: TableSegment, copy, parent=None) -> None:
        super().__init__(parent)
        self.header, self.label, self.copy_button = _header(self, copy)
        self.model = TableModel(self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setWordWrap(False)
        self.table.verticalHeader().setVisible(False)
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 8)
        self.table.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Fixed)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 6)
        layout.setSpacing(2)
        layout.addLayout(self.header)
        layout.addWidget(self.table)
        self.copy_button.setToolTip("Copy the table (Markdown)")
        self.copy_button.setAccessibleName("Copy the table")
        self.show_segment(segment)

    def show_segment(self, segment: TableSegment) -> None:
        self.source = segment.source
        self.model.show_table(segment)
        self.label.setText(f"table · {len(segment.rows):,} rows")
        rows = min(TABLE_ROWS_SHOWN, len(segment.rows)) + 1
        self.table.setFixedHeight(rows * self.table.verticalHeader().defaultSectionSize() + 4)

    def plain_text(self) -> str:
        return self.source

    def focusables(self) -> list[QWidget]:
        return [self.copy_button, self.table]


class PlainBlock(QFrame):
    """A message too long for Markdown: a line saying so, then the text as written in a scrolled box."""

    def __init__(self, segment: PlainSegment, note: bool, parent=None) -> None:
        super().__init__(parent)
        self.note = QLabel()
        self.note.setTextFormat(Qt.PlainText)
        self.note.setStyleSheet(f"color: {MUTED};")
        self.note.setVisible(note)
        self.box = PlainTextBox(monospace=False)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.note)
        layout.addWidget(self.box)
        self.show_segment(segment)

    def show_segment(self, segment: PlainSegment) -> None:
        size = size_text(len(segment.text.encode("utf-8", "replace")))
        self.note.setText(f"Shown as written, without formatting: this message is {size}.")
        self.box.show_text(segment.text)

    def plain_text(self) -> str:
        return self.box.text

    def focusables(self) -> list[QWidget]:
        return [self.box]


def _header(block: QFrame, copy) -> tuple[QHBoxLayout, QLabel, QToolButton]:
    """A block's header: what it is, then its Copy button (which copies ``block.source``)."""
    label = QLabel()
    label.setTextFormat(Qt.PlainText)  # the model wrote it: never markup (an <img> would load a file)
    label.setStyleSheet(f"color: {MUTED};")
    button = QToolButton(text="Copy")
    button.setAutoRaise(True)
    button.setFocusPolicy(Qt.StrongFocus)
    button.clicked.connect(lambda: copy(block.source))
    header = QHBoxLayout()
    header.setContentsMargins(8, 2, 4, 0)
    header.addWidget(label)
    header.addStretch(1)
    header.addWidget(button)
    return header, label, button


def block_class(segment: Segment) -> type:
    """The widget a segment shows in."""
    return {CodeSegment: CodeBlock, TableSegment: TableBlock, PlainSegment: PlainBlock}.get(type(segment), TextBlock)
