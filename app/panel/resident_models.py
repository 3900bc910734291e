"""The panel's list of resident models: each model's memory, requests, speed and KV use, one row each; picking a
row shows that model's numbers and pool in the rest of the panel."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractScrollArea,
    QGroupBox,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from engine import EngineStats

from ..units import size_text

# The numbers' columns; each model takes two rows: its id across them all, then its numbers.
HEADINGS = (("Memory", "Its weights and the KV cache it has touched"),
            ("Requests", "Running / waiting"),
            ("tok/s", "Decode speed over the last seconds"),
            ("KV", "Share of its KV pool in use"))


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One resident model as the list shows it."""

    model: str
    stats: EngineStats

    @property
    def memory_bytes(self) -> int:
        """What the model holds on its own: its weights and the KV blocks it has touched."""
        return self.stats.model_memory_bytes + self.stats.kv_touched_bytes

    def cells(self) -> list[str]:
        """The numbers row."""
        s = self.stats
        return [f"{self.memory_bytes / 2**20:,.0f} MiB", f"{s.num_running} / {s.num_waiting}",
                f"{s.decode_tokens_per_s:.1f}" if s.num_running else "–", f"{s.kv_usage:.0%}"]

    def tooltip(self) -> str:
        s = self.stats
        return (f"{s.model_name} ({s.quantization}): weights {size_text(s.model_memory_bytes)}, KV "
                f"{size_text(s.kv_touched_bytes)} of {size_text(s.kv_cache_memory_bytes)}; {s.num_running} running, "
                f"{s.num_waiting} waiting")


class ResidentModels(QGroupBox):
    """Shown while two or more models are resident. ``model_chosen(id)`` when the user picks a row,
    ``unload_requested(id)`` when they ask to unload the model shown (never the one the chat on screen runs on)."""

    model_chosen = Signal(str)
    unload_requested = Signal(str)

    def __init__(self, parent=None) -> None:
        super().__init__("Models", parent)
        self.rows: list[ModelRow] = []
        self.shown: str | None = None
        self.on_screen: str | None = None
        self.table = QTableWidget(0, len(HEADINGS))
        self.table.setAccessibleName("Resident models")
        for column, (title, meaning) in enumerate(HEADINGS):
            item = QTableWidgetItem(title)
            item.setToolTip(meaning)
            self.table.setHorizontalHeaderItem(column, item)
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setShowGrid(False)
        self.table.setWordWrap(False)
        self.table.setTextElideMode(Qt.ElideMiddle)
        self.table.setAlternatingRowColors(False)
        self.table.setVerticalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.setSizeAdjustPolicy(QAbstractScrollArea.AdjustToContents)
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.table.cellClicked.connect(lambda row, _: self._chosen(row // 2))
        self.total = QLabel()
        self.total.setWordWrap(True)
        self.unload = QPushButton("Unload")
        self.unload.clicked.connect(lambda: self.shown and self.unload_requested.emit(self.shown))
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(self.total)
        layout.addWidget(self.unload, 0, Qt.AlignRight)
        self.hide()

    def update_models(self, every: dict[str, EngineStats], shown: str | None, on_screen: str | None = None) -> None:
        """``every`` resident model's stats by id, ``shown`` the one the panel shows, ``on_screen`` the one the
        chat on screen runs on (it cannot be unloaded from here); hidden below two models."""
        self.rows = [ModelRow(model, stats) for model, stats in every.items()]
        self.shown, self.on_screen = shown, on_screen
        self.setVisible(len(self.rows) >= 2)
        if len(self.rows) < 2:
            return
        self._show_unload()
        if self.table.rowCount() != 2 * len(self.rows):
            self.table.clearSpans()
            self.table.setRowCount(2 * len(self.rows))
            for index in range(len(self.rows)):
                self.table.setSpan(2 * index, 0, 1, len(HEADINGS))
        for index, row in enumerate(self.rows):
            title = self._item(2 * index, 0, Qt.AlignLeft | Qt.AlignVCenter)
            _set_text(title, row.model)
            font = title.font()
            if font.bold() != (row.model == shown):
                font.setWeight(QFont.Bold if row.model == shown else QFont.Normal)
                title.setFont(font)
            title.setToolTip(row.tooltip())
            for column, text in enumerate(row.cells()):
                item = self._item(2 * index + 1, column, Qt.AlignRight | Qt.AlignVCenter)
                _set_text(item, text)
                item.setToolTip(row.tooltip())
        self.table.setFixedHeight(self.table.horizontalHeader().sizeHint().height() + 2 * self.table.frameWidth()
                                  + self.table.verticalHeader().defaultSectionSize() * 2 * len(self.rows))
        total = sum(r.memory_bytes for r in self.rows)
        self.total.setText(f"{len(self.rows)} models resident, {size_text(total)} between them. The one in bold "
                           "is shown below; pick another to see its numbers and pool.")

    def _show_unload(self) -> None:
        can = self.shown is not None and self.shown != self.on_screen
        self.unload.setEnabled(can)
        self.unload.setText(f"Unload {self.shown}" if can else "Unload")
        self.unload.setToolTip("Free its weights and KV cache; its chats load it again when next used" if can else
                               "The chat on screen runs on this model: pick another model in the list to unload it")

    def _item(self, row: int, column: int, alignment) -> QTableWidgetItem:
        item = self.table.item(row, column)
        if item is None:
            item = QTableWidgetItem()
            item.setTextAlignment(alignment)
            self.table.setItem(row, column, item)
        return item

    def others_bytes(self) -> int:
        """The memory of every resident model but the one shown (the memory bar's 'other models')."""
        return sum(r.memory_bytes for r in self.rows if r.model != self.shown)

    def _chosen(self, row: int) -> None:
        if 0 <= row < len(self.rows):
            self.model_chosen.emit(self.rows[row].model)


def _set_text(item: QTableWidgetItem, text: str) -> None:
    if item.text() != text:
        item.setText(text)
