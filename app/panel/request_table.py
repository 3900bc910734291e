"""The panel's list of live requests: a table model whose columns are one list (:data:`COLUMNS`), so a new
column is one line there."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QColor, QPixmap

from engine import RequestSnapshot

from .formatting import ms_text

# Roles as plain ints: the view asks data() for every role of every cell at each repaint, and comparing an int
# with one of PySide6's enum members costs microseconds each time.
DISPLAY, DECORATION, TOOLTIP, ALIGNMENT, ACCESSIBLE = (
    int(role.value) for role in (Qt.DisplayRole, Qt.DecorationRole, Qt.ToolTipRole, Qt.TextAlignmentRole,
                                 Qt.AccessibleTextRole))
RIGHT = int((Qt.AlignRight | Qt.AlignVCenter).value)


@dataclass(frozen=True, slots=True)
class RequestRow:
    """One live request as the panel lists it: the engine's snapshot, whose it is, and its colour in the pool."""

    snapshot: RequestSnapshot
    title: str
    color: str


@dataclass(frozen=True, slots=True)
class Column:
    """A column: its header, its text for a row, and what it means (the header's tooltip)."""

    title: str
    text: Callable[[RequestRow], str]
    meaning: str


def speed_text(row: RequestRow) -> str:
    r = row.snapshot
    if not r.running:
        return "queued"
    return f"{r.decode_tokens_per_s:.1f}" if r.decode_tokens_per_s else "prefill"


COLUMNS: tuple[Column, ...] = (
    Column("Blocks", lambda r: f"{r.snapshot.exclusive_blocks:,}", "KV blocks this request holds alone"),
    Column("tok/s", speed_text, "Decode speed in tokens per second, or what the request is doing"),
    Column("TTFT", lambda r: ms_text(r.snapshot.ttft_s), "Time to first token, queue included"),
    Column("Queue", lambda r: ms_text(r.snapshot.queue_time_s), "Time waiting before its first step"),
)


class RequestTableModel(QAbstractTableModel):
    """The live requests, two rows each so that titles keep their room in a narrow panel: the chat's title in
    its pool colour (a row the view spans across every column, see :meth:`is_title_row`), then one cell per
    :data:`COLUMNS`."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.rows: list[RequestRow] = []

    def set_rows(self, rows: list[RequestRow]) -> None:
        """Show ``rows``: the same requests are updated in place (scroll position stays), others reset."""
        same = [r.snapshot.request_id for r in rows] == [r.snapshot.request_id for r in self.rows]
        if same and rows:
            self.rows = rows
            self.dataChanged.emit(self.index(0, 0), self.index(self.rowCount() - 1, len(COLUMNS) - 1))
        elif not same:
            self.beginResetModel()
            self.rows = rows
            self.endResetModel()

    @staticmethod
    def is_title_row(row: int) -> bool:
        return row % 2 == 0

    def request_at(self, row: int) -> RequestRow:
        return self.rows[row // 2]

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else 2 * len(self.rows)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(COLUMNS)

    def data(self, index: QModelIndex, role: int = DISPLAY):
        role = int(role)
        if role not in (DISPLAY, TOOLTIP, ACCESSIBLE, DECORATION, ALIGNMENT) or not index.isValid():
            return None
        row = index.row()
        if not 0 <= row < 2 * len(self.rows):
            return None
        request = self.rows[row // 2]
        if row % 2 == 0:
            return self._title_data(request, index.column(), role)
        column = COLUMNS[index.column()]
        if role == DISPLAY:
            return column.text(request)
        if role in (TOOLTIP, ACCESSIBLE):
            return f"{request.title}, {column.title}: {column.text(request)}"
        return RIGHT if role == ALIGNMENT else None

    @staticmethod
    def _title_data(request: RequestRow, column: int, role: int):
        if column != 0:
            return None
        if role in (DISPLAY, TOOLTIP, ACCESSIBLE):
            return request.title
        return _swatch(request.color) if role == DECORATION else None

    def headerData(self, section: int, orientation: Qt.Orientation, role: int = DISPLAY):
        role = int(role)
        if role not in (DISPLAY, TOOLTIP) or orientation != Qt.Horizontal or not 0 <= section < len(COLUMNS):
            return None
        return COLUMNS[section].title if role == DISPLAY else COLUMNS[section].meaning


@functools.cache
def _swatch(color: str, side: int = 10) -> QPixmap:
    """A pool cell's colour as a small square, so the title keeps its room."""
    pixmap = QPixmap(side, side)
    pixmap.fill(QColor(color))
    return pixmap
