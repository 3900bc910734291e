"""The panel's memory bar: the process's resident memory, split into what holds it, to scale."""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import QWidget

from engine import EngineStats

from .. import theme
from ..units import size_text


@dataclass(frozen=True, slots=True)
class MemoryParts:
    """Resident memory as parts that add up to it: the model's weights, its KV cache, CUDA graphs, the other
    resident models (their weights and KV) and the rest (the runtime: Python, torch, the tokenizer, buffers).
    ``kv_reserved`` is the pool's whole size, resident or not."""

    resident: int
    weights: int
    kv: int
    kv_reserved: int
    graphs: int
    others: int = 0

    @property
    def runtime(self) -> int:
        return max(0, self.resident - self.weights - self.kv - self.graphs - self.others)

    @classmethod
    def of(cls, s: EngineStats, others: int = 0) -> MemoryParts | None:
        """The parts of ``s`` beside ``others`` bytes of other resident models (None for an engine that does not
        report its resident memory: a remote one)."""
        if not s.process_resident_bytes:
            return None
        on_gpu = s.gpu is not None  # weights, pool and graphs live on the device: the process holds the runtime
        host = 0 if on_gpu else 1
        return cls(s.process_resident_bytes, s.model_memory_bytes * host, s.kv_touched_bytes * host,
                   s.kv_cache_memory_bytes, s.cuda_graph_memory_bytes * host, others * host)

    def pieces(self) -> list[tuple[str, int]]:
        return [("weights", self.weights), ("kv", self.kv), ("graphs", self.graphs), ("others", self.others),
                ("runtime", self.runtime)]

    def summary(self) -> str:
        """One line: the total, then each part."""
        kv = f"KV {size_text(self.kv)} of {size_text(self.kv_reserved)}"
        parts = [f"weights {size_text(self.weights)}", kv]
        if self.graphs:
            parts.append(f"graphs {size_text(self.graphs)}")
        if self.others:
            parts.append(f"other models {size_text(self.others)}")
        parts.append(f"runtime {size_text(self.runtime)}")
        return f"{size_text(self.resident)} resident: " + ", ".join(parts)


class MemoryBar(QWidget):
    """A bar of :class:`MemoryParts`, each in its colour (``theme.MEMORY``), to scale."""

    HEIGHT = 8

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setFixedHeight(self.HEIGHT)
        self.parts: MemoryParts | None = None
        self.setAccessibleName("Memory")

    def set_parts(self, parts: MemoryParts | None) -> None:
        if parts == self.parts:
            return
        self.parts = parts
        text = parts.summary() if parts else ""
        self.setToolTip(text)
        self.setAccessibleDescription(text)
        self.update()

    def paintEvent(self, event) -> None:
        if self.parts is None or self.parts.resident <= 0:
            return
        painter = QPainter(self)
        x, width = 0.0, self.width()
        for name, size in self.parts.pieces():
            span = width * size / self.parts.resident
            painter.fillRect(int(x), 0, max(0, round(x + span) - int(x)), self.height(), QColor(theme.MEMORY[name]))
            x += span
