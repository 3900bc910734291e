"""The live panel of a chat that runs on a remote server: the server's own KV usage and prefix hit rate where
its /metrics reports them ("not reported by this server" where it does not), and the speed measured here."""

from __future__ import annotations

from collections import deque
from statistics import median

from PySide6.QtWidgets import QFormLayout, QGroupBox, QLabel, QVBoxLayout, QWidget

from engine.remote import ServerMetrics

from ..data.remote_store import RemoteChoice
from ..engines.remote_engines import RemoteEngines
from ..theme import SERIES
from .engine_panel import value_rows
from .sparkline import Sparkline

NOT_REPORTED = "not reported by this server"


class RemotePanel(QWidget):
    """Server, model, the server's KV cache (usage, hit rate, requests) with a minute of history, and TTFT and
    tokens/s of this window's replies measured on the client."""

    def __init__(self, engines: RemoteEngines, parent=None) -> None:
        super().__init__(parent)
        self.engines = engines
        self.choice: RemoteChoice | None = None
        self.setMinimumWidth(270)
        self.labels: dict[str, QLabel] = {}
        self._ttfts: deque[float] = deque(maxlen=50)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 8, 8, 8)
        layout.addWidget(self._group("Remote server", ["Server", "Address", "Model", "Metrics"]))
        layout.addWidget(self._group("KV cache (the server's)", ["Usage", "Prefix hit rate", "Requests"]))
        plots = QGroupBox("Last minute")
        self.plot_layout = plot_layout = QFormLayout(plots)
        self.usage_plot, self.hit_plot = Sparkline(SERIES["prefill"]), Sparkline(SERIES["hit_rate"])
        self.usage_plot.ceiling = self.hit_plot.ceiling = 1.0
        plot_layout.addRow("KV use", self.usage_plot)
        plot_layout.addRow("hit rate", self.hit_plot)
        layout.addWidget(plots)
        layout.addWidget(self._group("Speed (measured here)", ["TTFT (last / median)", "Decode (last reply)"]))
        layout.addStretch(1)
        engines.metrics_updated.connect(self._metrics)

    def _group(self, title: str, names: list[str]) -> QGroupBox:
        box, _, labels = value_rows(title, names)
        self.labels.update(labels)
        return box

    def text(self, name: str) -> str:
        return self.labels[name].text()

    def show_choice(self, choice: RemoteChoice | None) -> None:
        """The chat on screen runs on ``choice``; a new server starts its history afresh."""
        if choice == self.choice:
            return
        if choice is None or self.choice is None or choice.server_id != self.choice.server_id:
            self.usage_plot.values.clear()
            self.hit_plot.values.clear()
            for name in ("Usage", "Prefix hit rate", "Requests"):
                self._set(name, "–")
        self.choice = choice
        if choice is None:
            return
        server = self.engines.server(choice.server_id)
        self._set("Server", server.name if server else "removed")
        self._set("Address", server.base_url if server else "–")
        self._set("Model", choice.model)
        self._set("Metrics", "asking…")
        known = self.engines.metrics.get(choice.server_id)
        if known is not None:
            self._metrics(choice.server_id, known)

    def record_ttft(self, seconds: float) -> None:
        """A remote reply's first token has just arrived."""
        self._ttfts.append(seconds)
        self._set("TTFT (last / median)", f"{self._ttfts[-1] * 1000:.0f} / {median(self._ttfts) * 1000:.0f} ms")

    def record_reply(self, stats: dict) -> None:
        """A remote reply has finished: its tokens/s, measured here."""
        rate = stats.get("decode_tokens_per_s")
        tokens = stats.get("output_tokens", 0)
        self._set("Decode (last reply)", f"{rate:.1f} tok/s ({tokens} tokens)" if rate else f"– ({tokens} tokens)")

    def _metrics(self, server_id: str, m: ServerMetrics) -> None:
        if self.choice is None or server_id != self.choice.server_id:
            return
        self._set("Metrics", f"from {m.server_kind}'s /metrics" if m.server_kind else (m.note or NOT_REPORTED))
        self._set("Usage", f"{m.kv_usage:.0%}" if m.kv_usage is not None else NOT_REPORTED)
        if m.prefix_hit_rate is None:
            self._set("Prefix hit rate", NOT_REPORTED)
        else:
            window = "last minute" if m.hit_rate_recent else "since the server started"
            self._set("Prefix hit rate", f"{m.prefix_hit_rate:.0%} of prompt tokens ({window})")
        requests = [f"{m.num_running} running" if m.num_running is not None else "",
                    f"{m.num_waiting} waiting" if m.num_waiting is not None else ""]
        self._set("Requests", ", ".join(r for r in requests if r) or NOT_REPORTED)
        for plot, value in ((self.usage_plot, m.kv_usage), (self.hit_plot, m.prefix_hit_rate)):
            self.plot_layout.setRowVisible(plot, value is not None)  # no empty plot for what is not reported
            if value is not None:
                plot.add(value)

    def _set(self, name: str, text: str) -> None:
        if self.labels[name].text() != text:
            self.labels[name].setText(text)
