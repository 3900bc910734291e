"""The KV block pool as a picture, and its legend: each chat's blocks in the chat's colour, shared blocks dotted,
cached blocks hatched, so the kinds read without colour too."""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QPainter
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

from ..theme import BLOCKS, CHATS

COLORS = {kind: QColor(BLOCKS[kind]) for kind in ("shared", "cached", "free")}
CONVERSATION_COLORS = list(CHATS)
UNOWNED_COLOR = BLOCKS["unowned"]  # a request that is no chat's


def conversation_color(conversation_id: int | None) -> str:
    """A stable colour per conversation, the same in the request list and the pool (grey when no chat's)."""
    if conversation_id is None:
        return UNOWNED_COLOR
    return CONVERSATION_COLORS[conversation_id % len(CONVERSATION_COLORS)]


def paint_cell(painter: QPainter, cell: QRectF, color: QColor, kind: str) -> None:
    """One cell of the pool: ``kind`` "chat" is plain colour, "shared" has a white dot, "cached" is hatched."""
    painter.fillRect(cell, color)
    if kind == "cached":
        painter.fillRect(cell, QBrush(QColor("white"), Qt.BDiagPattern))
    elif kind == "shared":
        painter.save()
        painter.setRenderHint(QPainter.Antialiasing)
        painter.setBrush(QColor("white"))
        painter.setPen(Qt.NoPen)
        radius = max(1.5, min(cell.width(), cell.height()) / 5)
        painter.drawEllipse(cell.center(), radius, radius)
        painter.restore()


class BlockPoolView(QWidget):
    """The KV pool at any size, from 64 blocks to 100,000.

    A bar across the top is the whole pool to scale: each segment in its colour and pattern, then the free
    blocks. Below it, the blocks that hold something are drawn as cells: each conversation's own blocks in its
    colour, then the shared ones and the cached, reusable ones. When they are too many for one cell each, a
    cell stands for several blocks (:attr:`blocks_per_cell`); free blocks are only in the bar, so a few chats in
    a large pool still show.
    """

    BAR_HEIGHT = 8
    CELL = 10  # pixels per cell side, gap included, when the cells fit
    ROWS = (2, 8)  # the view grows with its cells between these many rows, then aggregates

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setFixedHeight(self._height_for(self.ROWS[0]))
        self.segments: list[tuple[int, QColor, str]] = []  # (blocks, colour, kind: "chat" | "shared" | "cached")
        self.free = 0
        self.blocks_per_cell = 1
        self.setAccessibleName("KV block pool")

    def set_segments(self, segments: list[tuple[int, QColor, str]], free: int) -> None:
        self.segments = [s for s in segments if s[0] > 0]
        self.free = free
        self._fit()
        self.setAccessibleDescription(self.caption())
        self.update()

    def caption(self) -> str:
        scale = "1 cell = 1 block" if self.blocks_per_cell == 1 else f"1 cell ≈ {self.blocks_per_cell:,} blocks"
        return f"{scale} · {self.free:,} free (in the bar)"

    def _grid(self) -> tuple[int, float]:
        """Columns and cell side in the space below the bar; sets the blocks per cell so that every segment's
        cells fit (each segment rounds up to whole cells, so the plain quotient can overflow)."""
        # the fixed height asked for, which the layout may not have applied yet
        width, height = self.width(), max(1, self.maximumHeight() - self.BAR_HEIGHT - 4)
        cols = max(1, width // self.CELL)
        capacity = cols * max(1, height // self.CELL)
        counts = [n for n, _, _ in self.segments]
        per_cell = max(1, -(-sum(counts) // capacity))
        while sum(-(-n // per_cell) for n in counts) > capacity and per_cell < sum(counts):
            per_cell += max(1, per_cell // 64)
        self.blocks_per_cell = per_cell
        return cols, float(self.CELL)

    def _height_for(self, rows: int) -> int:
        return self.BAR_HEIGHT + 4 + rows * self.CELL

    def _fit(self) -> None:
        """As many rows as the cells need at this width (within :attr:`ROWS`); then the scale, for the caption."""
        cells = sum(n for n, _, _ in self.segments)
        rows = min(max(-(-cells // max(1, self.width() // self.CELL)), self.ROWS[0]), self.ROWS[1])
        if self.height() != self._height_for(rows) or self.minimumHeight() != self._height_for(rows):
            self.setFixedHeight(self._height_for(rows))
        self._grid()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self._fit()

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        self._paint_bar(painter)
        used = sum(n for n, _, _ in self.segments)
        if not used:
            return
        cols, side = self._grid()
        top = self.BAR_HEIGHT + 4
        i = 0
        for count, color, kind in self.segments:
            for _ in range(-(-count // self.blocks_per_cell)):
                r, c = divmod(i, cols)
                paint_cell(painter, QRectF(c * side, top + r * side, side - 1, side - 1), color, kind)
                i += 1

    def _paint_bar(self, painter: QPainter) -> None:
        """The whole pool to scale; a segment that holds anything gets at least two pixels."""
        total = sum(n for n, _, _ in self.segments) + self.free
        if not total:
            return
        x = 0.0
        for count, color, kind in (*self.segments, (self.free, COLORS["free"], "free")):
            if count:
                width = max(2.0, self.width() * count / total)
                painter.fillRect(QRectF(x, 0, width, self.BAR_HEIGHT), color)
                if kind == "cached":
                    painter.fillRect(QRectF(x, 0, width, self.BAR_HEIGHT), QBrush(QColor("white"), Qt.BDiagPattern))
                x += width


class CellSwatch(QWidget):
    """One pool cell, as the legend shows it (a bar piece for "free")."""

    def __init__(self, color: QColor, kind: str, parent=None) -> None:
        super().__init__(parent)
        self.color, self.kind = QColor(color), kind
        self.setFixedSize(18 if kind == "free" else BlockPoolView.CELL, BlockPoolView.CELL)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        if self.kind == "free":
            painter.fillRect(QRectF(0, 1, self.width(), BlockPoolView.BAR_HEIGHT), self.color)
        else:
            paint_cell(painter, QRectF(0, 0, self.width() - 1, self.height() - 1), self.color, self.kind)


LEGEND = (  # kind, colour, text, what it means
    ("chat", QColor(CONVERSATION_COLORS[0]), "a chat's own (its colour)",
     "Blocks only this request holds, in the colour beside its title in the list below"),
    ("shared", COLORS["shared"], "shared (dot)", "Blocks several requests read: a prompt prefix they have in common"),
    ("cached", COLORS["cached"], "cached (hatched)",
     "Blocks no request holds now, kept so that a prompt starting the same way reuses them"),
    ("free", COLORS["free"], "free (bar only)",
     "Empty blocks: drawn only in the bar, which is the whole pool to scale"),
)



class PoolLegend(QWidget):
    """What the pool's cells mean, with the very cells the pool draws: two entries a line."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setHorizontalSpacing(4)
        grid.setVerticalSpacing(2)
        self.texts: list[str] = []
        for i, (kind, color, text, meaning) in enumerate(LEGEND):
            row, col = divmod(i, 2)
            label = QLabel(text)
            label.setWordWrap(True)
            label.setToolTip(meaning)
            grid.addWidget(CellSwatch(color, kind), row, 2 * col, Qt.AlignVCenter)
            grid.addWidget(label, row, 2 * col + 1)
            self.texts.append(text)
        grid.setColumnStretch(1, 1)
        grid.setColumnStretch(3, 1)
        self.setAccessibleName("Pool legend")
        self.setAccessibleDescription(". ".join(f"{t}: {m}" for _, _, t, m in LEGEND))
