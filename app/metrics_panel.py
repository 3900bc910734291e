"""The live panel: what the engine is doing, from ``stats()`` a few times a second."""

from __future__ import annotations

from collections import deque
from statistics import median

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from engine import EngineStats

HISTORY = 240  # samples: one minute at four a second
COLORS = {"used": QColor("#3a7bd5"), "shared": QColor("#8e44ad"), "cached": QColor("#2eaa6a"),
          "free": QColor("#cfd4da")}


def _mib(n: int) -> str:
    return f"{n / 1024**2:,.0f} MiB"


class BlockPoolView(QWidget):
    """The KV pool as a grid: blocks in use, shared, cached (reusable) and free."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(90)
        self.counts = (0, 0, 0, 0)  # used, shared, cached, free

    def set_stats(self, stats: EngineStats) -> None:
        self.counts = (stats.kv_blocks_used - stats.kv_blocks_shared, stats.kv_blocks_shared,
                       stats.kv_blocks_cached, stats.kv_blocks_free)
        self.update()

    def paintEvent(self, event) -> None:
        total = sum(self.counts)
        if not total:
            return
        painter = QPainter(self)
        cols = max(1, int((self.width() * total / max(self.height(), 1)) ** 0.5))
        rows = -(-total // cols)
        cell_w, cell_h = self.width() / cols, self.height() / rows
        colors = [COLORS["used"]] * self.counts[0] + [COLORS["shared"]] * self.counts[1]
        colors += [COLORS["cached"]] * self.counts[2] + [COLORS["free"]] * self.counts[3]
        gap = 1.0 if min(cell_w, cell_h) > 3 else 0.0
        for i, color in enumerate(colors):
            r, c = divmod(i, cols)
            painter.fillRect(QRectF(c * cell_w, r * cell_h, cell_w - gap, cell_h - gap), color)


class Sparkline(QWidget):
    """A small plot of the last minute of one number."""

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


class MetricsPanel(QWidget):
    """Numbers, the block pool and three sparklines. ``update_stats`` is cheap: labels and two repaints."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumWidth(270)
        self.labels: dict[str, QLabel] = {}
        self._ttfts: deque[float] = deque(maxlen=50)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 8, 8, 8)
        layout.addWidget(self._group("Speed", ["TTFT (last / median)", "Decode", "Prefill", "Requests",
                                                "Preemptions"]))
        self.pool = BlockPoolView()
        cache = self._group("KV cache", ["Usage", "Blocks", "Prefix hit rate"])
        cache.layout().addRow(self.pool)
        legend = QLabel(" ".join(f'<span style="color:{COLORS[k].name()};">■</span> {k}' for k in COLORS))
        cache.layout().addRow(legend)
        layout.addWidget(cache)
        plots = QGroupBox("Last minute")
        plot_layout = QFormLayout(plots)
        self.decode_plot, self.usage_plot, self.hit_plot = Sparkline("#3a7bd5"), Sparkline("#e67e22"), Sparkline(
            "#2eaa6a")
        self.usage_plot.ceiling = self.hit_plot.ceiling = 1.0
        plot_layout.addRow("tok/s", self.decode_plot)
        plot_layout.addRow("KV use", self.usage_plot)
        plot_layout.addRow("hit rate", self.hit_plot)
        layout.addWidget(plots)
        layout.addWidget(self._group("Model", ["Model", "Quantisation", "Device", "Attention", "Memory"]))
        layout.addStretch(1)

    def _group(self, title: str, names: list[str]) -> QGroupBox:
        box = QGroupBox(title)
        form = QFormLayout(box)
        form.setLabelAlignment(Qt.AlignLeft)
        for name in names:
            label = QLabel("–")
            label.setTextInteractionFlags(Qt.TextSelectableByMouse)
            label.setWordWrap(True)
            self.labels[name] = label
            form.addRow(name, label)
        return box

    def record_ttft(self, seconds: float) -> None:
        self._ttfts.append(seconds)

    def update_stats(self, s: EngineStats) -> None:
        if self._ttfts:
            self._set("TTFT (last / median)", f"{self._ttfts[-1] * 1000:.0f} / {median(self._ttfts) * 1000:.0f} ms")
        self._set("Decode", f"{s.decode_tokens_per_s:.1f} tok/s")
        self._set("Prefill", f"{s.prefill_tokens_per_s:.0f} tok/s")
        self._set("Requests", f"{s.num_running} running, {s.num_waiting} waiting")
        self._set("Preemptions", f"{s.num_preempted_total}")
        used_tokens = s.kv_blocks_used * s.block_size
        self._set("Usage", f"{s.kv_usage:.0%} ({used_tokens:,} of {s.kv_blocks_total * s.block_size:,} tokens)")
        self._set("Blocks", f"{s.kv_blocks_used} used ({s.kv_blocks_shared} shared), {s.kv_blocks_cached} cached, "
                            f"{s.kv_blocks_free} free")
        self._set("Prefix hit rate", f"{s.prefix_hit_rate:.0%} of prompt tokens")
        self._set("Model", s.model_name)
        self._set("Quantisation", f"{s.quantization}, {s.dtype}")
        self._set("Device", f"{s.device} — {s.device_reason}")
        self._set("Attention", s.attention_backend)
        self._set("Memory", f"model {_mib(s.model_memory_bytes)}, KV {_mib(s.kv_cache_memory_bytes)}")
        self.pool.set_stats(s)
        self.decode_plot.add(s.decode_tokens_per_s)
        self.usage_plot.add(s.kv_usage)
        self.hit_plot.add(s.prefix_hit_rate)

    def _set(self, name: str, text: str) -> None:
        if self.labels[name].text() != text:
            self.labels[name].setText(text)
