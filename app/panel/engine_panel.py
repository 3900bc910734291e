"""The live panel: what the engine is doing, from ``stats()`` a few times a second.

"Now" holds the numbers, the block pool and the live requests; "Charts" the last minutes. Every snapshot is
recorded in the panel's :class:`EngineHistory`, shown or not (:meth:`EnginePanel.record`); the labels and charts
are only drawn while on screen (:meth:`EnginePanel.update_stats`).
"""

from __future__ import annotations

from statistics import median

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QAbstractScrollArea,
    QFormLayout,
    QGroupBox,
    QHeaderView,
    QLabel,
    QScrollArea,
    QSizePolicy,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine import API_SOURCE, EngineStats, RequestSnapshot

from ..units import size_text
from .charts import EngineCharts
from .formatting import (
    cpu_threads_text,
    device_text,
    errors_text,
    gpu_load_text,
    gpu_memory_text,
    ms_text,
    speculation_text,
    speculation_tip,
)
from .history import EngineHistory
from .kv_blocks import COLORS, BlockPoolView, PoolLegend, conversation_color
from .memory_bar import MemoryBar, MemoryParts
from .request_table import RequestRow, RequestTableModel
from .resident_models import ResidentModels

TTFT = "TTFT (last / median)"
GAP = "Gap p99 / max"  # between two tokens of one reply
SPECULATION = "Drafts"  # speculative decoding
GPU_ROWS = ("GPU memory", "GPU load")
CPU_THREADS = "CPU threads"
REQUEST_ROWS_SHOWN = 8  # the list grows to this many rows (four requests), then scrolls


class EnginePanel(QWidget):
    """Numbers, the block pool and the live requests in one tab, charts in the other. ``update_stats`` is cheap:
    labels, one table, one repaint, and the charts only when they are on screen."""

    def __init__(self, history: EngineHistory | None = None, parent=None) -> None:
        super().__init__(parent)
        self.setMinimumWidth(270)
        self.history = history or EngineHistory()
        self.labels: dict[str, QLabel] = {}
        self._forms: dict[str, QFormLayout] = {}
        self._live_ttft_at: float | None = None  # when a reply's first token was shown before its snapshot
        self.tabs = QTabWidget()
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(_scrolled(self._now_page()), "Now")
        self.charts = EngineCharts(self.history)
        self.tabs.addTab(_scrolled(self.charts), "Charts")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.tabs)

    def _now_page(self) -> QWidget:
        page = QWidget()
        layout = QVBoxLayout(page)
        layout.setContentsMargins(2, 4, 6, 4)
        self.models = ResidentModels()
        layout.addWidget(self.models)
        layout.addWidget(self._group("Speed", [TTFT, "Queue (median)", "Decode", SPECULATION, GAP, "Prefill",
                                               "Requests", "Errors", "Preemptions"]))
        cache = self._group("KV cache", ["Usage", "Blocks", "Prefix hit rate", "On disk"])
        self.pool = BlockPoolView()
        self.legend = PoolLegend()
        self.pool_caption = QLabel("")
        self.pool_caption.setObjectName("poolCaption")
        self.pool_caption.setWordWrap(True)
        for widget in (self.pool, self.legend, self.pool_caption, self._request_list()):
            cache.layout().addRow(widget)
        layout.addWidget(cache)
        layout.addWidget(self._group("Model", ["Model", "Quantisation", "Device", CPU_THREADS, "Attention", "Memory",
                                               *GPU_ROWS]))
        self.memory_bar = MemoryBar()
        model_rows = self._forms["Memory"]
        row, _ = model_rows.getWidgetPosition(self.labels["Memory"])
        model_rows.insertRow(row + 1, self.memory_bar)  # the Memory row's parts to scale, right under it
        self._show_gpu_rows(False)
        self._forms[CPU_THREADS].setRowVisible(self.labels[CPU_THREADS], False)
        layout.addStretch(1)
        return page

    def _request_list(self) -> QWidget:
        box = QWidget()
        layout = QVBoxLayout(box)
        layout.setContentsMargins(0, 0, 0, 0)
        self.requests = RequestTableModel(self)
        self.request_view = QTableView()
        self.request_view.setModel(self.requests)
        self.request_view.setAccessibleName("Live requests")
        self.request_view.verticalHeader().hide()
        self.request_view.setSelectionMode(QAbstractItemView.NoSelection)
        self.request_view.setFocusPolicy(Qt.NoFocus)
        self.request_view.setWordWrap(False)
        self.request_view.setShowGrid(False)
        self.request_view.setAlternatingRowColors(True)  # a request's title and numbers read as a pair
        self.request_view.setTextElideMode(Qt.ElideRight)
        self.request_view.setVerticalScrollBarPolicy(Qt.ScrollBarAsNeeded)
        self.request_view.setSizeAdjustPolicy(QAbstractScrollArea.AdjustToContents)  # as tall as its rows
        self.request_view.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Maximum)
        header = self.request_view.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.Stretch)
        header.setMinimumSectionSize(24)
        self.requests.modelReset.connect(self._span_titles)
        self.request_view.setIconSize(QSize(10, 10))
        self.request_view.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        self.no_requests = QLabel("No request running.")
        layout.addWidget(self.request_view)
        layout.addWidget(self.no_requests)
        self._fit_request_view()
        return box

    def _group(self, title: str, names: list[str]) -> QGroupBox:
        box, form, labels = value_rows(title, names)
        self.labels.update(labels)
        self._forms.update(dict.fromkeys(names, form))
        return box

    # -- updates ------------------------------------------------------------------------------------

    def use_history(self, history: EngineHistory) -> None:
        """Show and keep recording ``history`` (another model's) from now on; the charts redraw from it."""
        self.history = self.charts.history = history
        self._live_ttft_at = None
        self.charts.refresh()

    def record(self, stats: EngineStats) -> int:
        """Keep ``stats`` in the history (also while the panel is hidden); returns how many first tokens were new."""
        return self.history.add(stats)

    def record_ttft(self, seconds: float) -> None:
        """A reply's first token has just arrived: show its TTFT now, not at the next stats tick."""
        self._live_ttft_at = self.history.latest
        self._show_ttft(seconds, median([*self.history.values("ttft"), seconds * 1000]) / 1000)

    def update_stats(self, s: EngineStats, owners: dict[str, tuple[int, str]] | None = None,
                     record: bool = True) -> None:
        """Show ``s`` (and ``record`` it: False where it is in the history already). ``owners``: request id ->
        (conversation id, title), to colour and name each request."""
        if record:
            self.record(s)
        self._show_speed(s)
        used_tokens = s.kv_blocks_used * s.block_size
        self._set("Usage", f"{s.kv_usage:.0%} ({used_tokens:,} of {s.kv_blocks_total * s.block_size:,} tokens)")
        self._set("Blocks", f"{s.kv_blocks_used} used ({s.kv_blocks_shared} shared), {s.kv_blocks_cached} cached, "
                            f"{s.kv_blocks_free} free")
        self._set("Prefix hit rate", f"{s.prefix_hit_rate:.0%} of prompt tokens")
        self._set("On disk", disk_cache_text(s.disk_cache))
        self.labels["On disk"].setToolTip(s.disk_cache.failure if s.disk_cache and s.disk_cache.failure else
                                          "earlier conversations' KV blocks, read back instead of computed again "
                                          "(Preferences → KV cache)")
        self._show_model(s)
        self._show_requests(s, owners or {})
        self.charts.refresh()

    def update_models(self, every: dict[str, EngineStats], shown: str | None, on_screen: str | None = None) -> None:
        """Every resident model's row (the list shows from two models on); ``shown`` is the one whose numbers
        the rest of the panel shows, the others count as 'other models' in its memory bar; ``on_screen`` the one
        the chat on screen runs on."""
        self.models.update_models(every, shown, on_screen)

    def _show_speed(self, s: EngineStats) -> None:
        ttfts = self.history.points["ttft"]
        if ttfts and (self._live_ttft_at is None or ttfts[-1][0] > self._live_ttft_at):
            self._show_ttft(ttfts[-1][1] / 1000, median(self.history.values("ttft")) / 1000)
        self._set("Queue (median)", ms_text(s.queue_time_p50_s))
        self._set("Decode", f"{s.decode_tokens_per_s:.1f} tok/s")
        self._set(SPECULATION, speculation_text(s.speculation))
        self.labels[SPECULATION].setToolTip(speculation_tip(s.speculation))
        self._set(GAP, gap_text(s.inter_token_p99_s, s.inter_token_max_s))
        self._set("Prefill", f"{s.prefill_tokens_per_s:.0f} tok/s")
        self._set("Requests", f"{s.num_running} running, {s.num_waiting} waiting")
        self._set("Errors", errors_text(s.num_errors_total))
        self._set("Preemptions", f"{s.num_preempted_total}")

    def _show_ttft(self, last_s: float, median_s: float) -> None:
        self._set(TTFT, f"{last_s * 1000:.0f} / {median_s * 1000:.0f} ms")

    def _show_model(self, s: EngineStats) -> None:
        self._set("Model", s.model_name)
        kv = f"; KV {s.kv_cache_dtype}" if s.kv_cache_dtype else ""
        self._set("Quantisation", f"{s.quantization}, {s.dtype}{kv}")
        self.labels["Quantisation"].setToolTip(f"KV cache: {s.kv_cache_dtype_reason}" if s.kv_cache_dtype else "")
        self._set("Device", device_text(s))
        self._set("Attention", s.attention_backend)
        self.labels["Attention"].setToolTip(s.attention_reason)  # why this backend; the row stays one line
        parts = MemoryParts.of(s, self.models.others_bytes())
        self._set("Memory", parts.summary() if parts else
                  f"model {size_text(s.model_memory_bytes)}, KV {size_text(s.kv_cache_memory_bytes)}")
        self.memory_bar.set_parts(parts)
        self._forms[CPU_THREADS].setRowVisible(self.labels[CPU_THREADS], s.cpu is not None)
        if s.cpu is not None:
            self._set(CPU_THREADS, cpu_threads_text(s.cpu))
            self.labels[CPU_THREADS].setToolTip(s.cpu.note or ("set in Preferences" if s.cpu.threads_fixed else
                                                "auto: a core another program keeps busy is given up, and taken "
                                                "back when it is free"))
        self._show_gpu_rows(s.gpu is not None)
        if s.gpu is not None:
            self._set("GPU memory", gpu_memory_text(s.gpu))
            self._set("GPU load", gpu_load_text(s.gpu))

    def _show_gpu_rows(self, shown: bool) -> None:
        for name in GPU_ROWS:
            self._forms[name].setRowVisible(self.labels[name], shown)

    def gpu_rows_shown(self) -> bool:
        """Whether the GPU's rows are part of the panel (they are hidden on the CPU)."""
        return self._forms[GPU_ROWS[0]].isRowVisible(self.labels[GPU_ROWS[0]])

    def _show_requests(self, s: EngineStats, owners: dict[str, tuple[int, str]]) -> None:
        segments, rows = [], []
        for request in s.requests:
            conversation, title = owners.get(request.request_id, (None, _unowned_title(request)))
            color = conversation_color(conversation)
            segments.append((request.exclusive_blocks, QColor(color), "chat"))
            rows.append(RequestRow(request, title, color))
        segments += [(s.kv_blocks_shared, COLORS["shared"], "shared"), (s.kv_blocks_cached, COLORS["cached"], "cached")]
        self.pool.set_segments(segments, s.kv_blocks_free)
        self._set_text(self.pool_caption, self.pool.caption())
        self.requests.set_rows(rows)
        self._fit_request_view()

    def _span_titles(self) -> None:
        """Each request's title row across every column."""
        self.request_view.clearSpans()
        for row in range(0, self.requests.rowCount(), 2):
            self.request_view.setSpan(row, 0, 1, self.requests.columnCount())

    def _fit_request_view(self) -> None:
        """The list, or the placeholder when no request runs; the list scrolls past :data:`REQUEST_ROWS_SHOWN`."""
        rows = self.requests.rowCount()
        self.request_view.setVisible(rows > 0)
        self.no_requests.setVisible(rows == 0)
        view = self.request_view
        header = max(view.horizontalHeader().sizeHint().height(), view.fontMetrics().height() + 4)
        view.setMaximumHeight(header + 2 * view.frameWidth()
                              + view.verticalHeader().defaultSectionSize() * REQUEST_ROWS_SHOWN)

    def _set(self, name: str, text: str) -> None:
        self._set_text(self.labels[name], text)

    @staticmethod
    def _set_text(label: QLabel, text: str) -> None:
        if label.text() != text:
            label.setText(text)



def disk_cache_text(disk) -> str:
    """The disk tier in one line: tokens read back since the model loaded, and the folder's size."""
    if disk is None:
        return "off"
    text = f"{disk.hit_tokens_total:,} tokens read back, {size_text(disk.bytes_on_disk)} of {size_text(disk.max_bytes)}"
    return text + ("; writing stopped" if disk.failure else "")


def value_rows(title: str, names: list[str]) -> tuple[QGroupBox, QFormLayout, dict[str, QLabel]]:
    """A group of named rows, each a selectable value label (shown as "–" until set); the remote panel's too."""
    box = QGroupBox(title)
    form = QFormLayout(box)
    form.setLabelAlignment(Qt.AlignLeft)
    labels = {}
    for name in names:
        label = labels[name] = QLabel("–")
        label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        label.setWordWrap(True)
        form.addRow(name, label)
    return box, form, labels

def _unowned_title(request: RequestSnapshot) -> str:
    """How a request that is not one of the window's chats is named: API requests say so."""
    return f"API · {request.request_id}" if request.source == API_SOURCE else request.request_id


def _scrolled(widget: QWidget) -> QScrollArea:
    """``widget`` in a scroll area that follows the panel's width, so a short window scrolls instead of squashing."""
    area = QScrollArea()
    area.setWidget(widget)
    area.setWidgetResizable(True)
    area.setFrameShape(QScrollArea.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    return area


def gap_text(p99_s: float | None, worst_s: float | None) -> str:
    """'42 / 120 ms' (p99 / worst): the gaps between a reply's tokens over the last seconds ('–' with none)."""
    if p99_s is None or worst_s is None:
        return "–"
    return f"{p99_s * 1000:.0f} / {worst_s * 1000:.0f} ms"
