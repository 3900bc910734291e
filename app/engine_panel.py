"""The live panel: what the engine is doing, from ``stats()`` a few times a second."""

from __future__ import annotations

from collections import deque
from statistics import median

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from engine import API_SOURCE, EngineStats, RequestSnapshot

HISTORY = 240  # samples: one minute at four a second
COLORS = {"shared": QColor("#8e44ad"), "cached": QColor("#2eaa6a"), "free": QColor("#9aa1aa")}
CONVERSATION_COLORS = ["#3a7bd5", "#e67e22", "#16a085", "#c0392b", "#d4ac0d", "#2c3e50", "#e84393", "#7f8c8d"]


def _mib(n: int) -> str:
    return f"{n / 1024**2:,.0f} MiB"


class BlockPoolView(QWidget):
    """The KV pool at any size, from 64 blocks to 100,000.

    A bar across the top is the whole pool to scale: blocks in use, cached, free. Below it, the blocks that
    hold something are drawn as cells: each conversation's own blocks in its colour, then the shared ones
    (a white dot) and the cached, reusable ones (hatched), so they read without colour too. When they are too
    many for one cell each, a cell stands for several blocks (:attr:`blocks_per_cell`); free blocks are only
    in the bar, so a few chats in a large pool still show.
    """

    BAR_HEIGHT = 8
    CELL = 10  # pixels per cell side, gap included, when the cells fit

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumHeight(90)
        self.segments: list[tuple[int, QColor, str]] = []  # (blocks, colour, kind: "chat" | "shared" | "cached")
        self.free = 0
        self.blocks_per_cell = 1

    def set_segments(self, segments: list[tuple[int, QColor, str]], free: int) -> None:
        self.segments = [s for s in segments if s[0] > 0]
        self.free = free
        self._grid(sum(n for n, _, _ in self.segments))  # the scale, for the caption
        self.update()

    def caption(self) -> str:
        scale = "1 cell = 1 block" if self.blocks_per_cell == 1 else f"1 cell ≈ {self.blocks_per_cell:,} blocks"
        return f"{scale} · {self.free:,} free (in the bar)"

    def _grid(self, cells: int) -> tuple[int, int, float]:
        """Columns, rows and cell side for ``cells`` cells in the space below the bar."""
        width, height = self.width(), max(1, self.height() - self.BAR_HEIGHT - 4)
        cols = max(1, width // self.CELL)
        capacity = cols * max(1, height // self.CELL)
        self.blocks_per_cell = max(1, -(-cells // capacity))
        return cols, -(-cells // self.blocks_per_cell // cols), float(self.CELL)

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        self._paint_bar(painter)
        used = sum(n for n, _, _ in self.segments)
        if not used:
            return
        cols, _, side = self._grid(used)
        top = self.BAR_HEIGHT + 4
        i = 0
        for count, color, kind in self.segments:
            for _ in range(-(-count // self.blocks_per_cell)):
                r, c = divmod(i, cols)
                cell = QRectF(c * side, top + r * side, side - 1, side - 1)
                painter.fillRect(cell, color)
                if kind == "cached":
                    painter.fillRect(cell, QBrush(QColor("white"), Qt.BDiagPattern))
                elif kind == "shared":
                    painter.setBrush(QColor("white"))
                    painter.setPen(Qt.NoPen)
                    painter.drawEllipse(cell.center(), side / 5, side / 5)
                i += 1

    def _paint_bar(self, painter: QPainter) -> None:
        """The whole pool to scale; a segment that holds anything gets at least two pixels."""
        in_use = sum(n for n, _, kind in self.segments if kind != "cached")
        cached = sum(n for n, _, kind in self.segments if kind == "cached")
        total = in_use + cached + self.free
        if not total:
            return
        x = 0.0
        for count, color in ((in_use, CONVERSATION_COLORS[0]), (cached, COLORS["cached"]), (self.free, COLORS["free"])):
            if count:
                width = max(2.0, self.width() * count / total)
                painter.fillRect(QRectF(x, 0, width, self.BAR_HEIGHT), QColor(color))
                x += width


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


class EnginePanel(QWidget):
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
        legend = QLabel("■ each chat's own blocks, in its colour · ◉ shared · ▨ cached, reusable · "
                        "bar: the whole pool (in use, cached, free)")
        legend.setWordWrap(True)
        self.pool_caption = QLabel("")
        self.pool_caption.setObjectName("poolCaption")
        self.pool_caption.setWordWrap(True)
        cache.layout().addRow(legend)
        cache.layout().addRow(self.pool_caption)
        self.requests_label = QLabel("")
        self.requests_label.setWordWrap(True)
        self.requests_label.setTextFormat(Qt.RichText)
        cache.layout().addRow(self.requests_label)
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
        """A reply's first token has just arrived: show its TTFT now, not at the next stats tick."""
        self._ttfts.append(seconds)
        self._set("TTFT (last / median)", f"{self._ttfts[-1] * 1000:.0f} / {median(self._ttfts) * 1000:.0f} ms")

    def update_stats(self, s: EngineStats, owners: dict[str, tuple[int, str]] | None = None) -> None:
        """``owners``: request id -> (conversation id, title), to colour and name each request."""
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
        self.labels["Attention"].setToolTip(s.attention_reason)  # why this backend; the row stays one line
        self._set("Memory", f"model {_mib(s.model_memory_bytes)}, KV {_mib(s.kv_cache_memory_bytes)}")
        self._show_requests(s, owners or {})
        self.decode_plot.add(s.decode_tokens_per_s)
        self.usage_plot.add(s.kv_usage)
        self.hit_plot.add(s.prefix_hit_rate)

    def _show_requests(self, s: EngineStats, owners: dict[str, tuple[int, str]]) -> None:
        segments, rows = [], []
        for request in s.requests:
            conversation, title = owners.get(request.request_id, (None, _unowned_title(request)))
            color = QColor(conversation_color(conversation))
            segments.append((request.exclusive_blocks, color, "chat"))
            rate = f"{request.decode_tokens_per_s:.1f} tok/s" if request.decode_tokens_per_s else "prefill"
            state = rate if request.running else "waiting"
            queue = f", queued {request.queue_time_s * 1000:.0f} ms" if request.queue_time_s else ""
            ttft = f", TTFT {request.ttft_s * 1000:.0f} ms" if request.ttft_s is not None else ""
            rows.append(f'<span style="color:{color.name()};">■</span> {_escape(title)[:28]}: {state}{ttft}{queue}')
        segments += [(s.kv_blocks_shared, COLORS["shared"], "shared"), (s.kv_blocks_cached, COLORS["cached"], "cached")]
        self.pool.set_segments(segments, s.kv_blocks_free)
        self.pool_caption.setText(self.pool.caption())
        self.requests_label.setText("<br>".join(rows) if rows else "No request running.")

    def _set(self, name: str, text: str) -> None:
        if self.labels[name].text() != text:
            self.labels[name].setText(text)


def conversation_color(conversation_id: int | None) -> str:
    """A stable colour per conversation (grey when the request is not a chat's)."""
    if conversation_id is None:
        return "#7f8c8d"
    return CONVERSATION_COLORS[conversation_id % len(CONVERSATION_COLORS)]


def _unowned_title(request: RequestSnapshot) -> str:
    """How a request that is not one of the window's chats is named: API requests say so."""
    return f"API · {request.request_id}" if request.source == API_SOURCE else request.request_id


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
