"""A small plot of the last minute of one number, for the remote server's panel (the local panel has charts)."""

from __future__ import annotations

from collections import deque

from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QWidget

HISTORY = 240  # samples: one minute at four a second


class Sparkline(QWidget):
    """The last :data:`HISTORY` values of one number, scaled to ``ceiling`` (else to their maximum)."""

    def __init__(self, color: str, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(34)
        self.values: deque[float] = deque(maxlen=HISTORY)
        self.color = QColor(color)
        self.ceiling: float | None = None

    def add(self, value: float) -> None:
        self.values.append(value)
        self.update()

    def paintEvent(self, event) -> None:
        if len(self.values) < 2:
            return
        top = self.ceiling or max(max(self.values), 1e-9)
        path = QPainterPath()
        step = self.width() / (HISTORY - 1)
        offset = self.width() - step * (len(self.values) - 1)
        for i, v in enumerate(self.values):
            point = (offset + i * step, self.height() - 2 - (self.height() - 4) * min(v / top, 1.0))
            path.moveTo(*point) if i == 0 else path.lineTo(*point)
        painter = QPainter(self)
        painter.setRenderHint(QPainter.Antialiasing)
        painter.setPen(QPen(self.color, 1.5))
        painter.drawPath(path)
