"""Preferences' KV cache group: how the cache stores keys and values, and a one-click check of what each format
changes on the loaded model."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QPushButton

from engine import KV_CACHE_DTYPES, KVQuality

from ..units import size_text

# what each format costs, beside its name (keys and values of one token against float32's)
FORMAT_NOTES = {
    "auto": "the smallest format measured to keep this model's quality (eval-quant --kv), else exact",
    "float32": "exact on the CPU; 4 bytes a value",
    "bfloat16": "half of float32's memory",
    "float16": "half of float32's memory",
    "q8_0": "27% of float32's memory (8 bits and a scale per 32 values, as llama.cpp's)",
    "fp8": "a quarter of float32's memory; CUDA only",
}
CHECK_HINT = ("How much each format changes the loaded model's next-token choices, against a float32 cache, on "
              "1,024 tokens of text; replies pause while it runs (seconds).")


class KVCacheForm(QGroupBox):
    """The format (``values()["kv_cache_dtype"]``) with its measured quality, and the disk tier
    (``values()["kv_disk_cache"]``); a change of either reloads the model.

    ``check``: starts :meth:`ChatEngine.check_kv_formats` and returns its future; ``clear``: starts
    :meth:`ChatEngine.clear_disk_cache` (each None when no model serves). Emits ``check_shown(text)`` when the
    check's result (or why it failed) is on screen, and ``cleared(text)`` when the clearing's is."""

    check_shown = Signal(str)
    cleared = Signal(str)
    _finished = Signal(object)  # the check's future, from the engine's thread to this one
    _cleared = Signal(object)  # the clearing's future, likewise

    def __init__(self, values: dict, check: Callable[[], Future | None] | None = None,
                 clear: Callable[[], Future | None] | None = None, parent=None) -> None:
        super().__init__("KV cache", parent)
        value = values["kv_cache_dtype"]
        self.check, self.clear = check, clear
        self.format = QComboBox()
        for name in KV_CACHE_DTYPES:
            self.format.addItem(f"{name}: {FORMAT_NOTES[name]}", name)
        self.format.setCurrentIndex(max(0, self.format.findData(value)))
        self.format.setAccessibleName("KV cache format")
        self.format.setToolTip("How keys and values are kept for every chat; changing it reloads the model")
        self.figures = QLabel(CHECK_HINT, wordWrap=True)
        self.check_button = QPushButton("Check on the loaded model")
        self.check_button.setEnabled(check is not None)
        self.check_button.clicked.connect(self._start_check)
        self._finished.connect(self._show_check)
        self.disk = QCheckBox("Keep recent conversations on disk, so a restart computes nothing again")
        self.disk.setChecked(values["kv_disk_cache"])
        self.disk.setToolTip("Full KV blocks are written in the background to the cache folder (at most 2 GiB, the "
                             "least recently used go first) and read back when a chat goes on after a restart")
        self.clear_button = QPushButton("Clear")
        self.clear_button.setToolTip("Delete the loaded model's KV blocks on disk")
        self.clear_button.setEnabled(clear is not None)
        self.clear_button.clicked.connect(self._start_clear)
        self._cleared.connect(self._show_cleared)
        disk_row = QHBoxLayout()
        disk_row.addWidget(self.disk, 1)
        disk_row.addWidget(self.clear_button)
        form = QFormLayout(self)
        form.addRow("Format", self.format)
        form.addRow(self.figures)
        form.addRow(self.check_button)
        form.addRow(disk_row)

    def values(self) -> dict:
        return {"kv_cache_dtype": self.format.currentData(), "kv_disk_cache": self.disk.isChecked()}

    def _start_clear(self) -> None:
        future = self.clear() if self.clear is not None else None
        if future is None:
            self.cleared.emit("No model is loaded.")
            return
        self.clear_button.setEnabled(False)
        future.add_done_callback(self._cleared.emit)

    def _show_cleared(self, future: Future) -> None:
        self.clear_button.setEnabled(True)
        try:
            freed = future.result()
        except Exception as exc:
            text = f"Clearing failed: {exc}"
        else:
            text = f"Cleared {size_text(freed)} of this model's KV blocks on disk."
        self.clear_button.setToolTip(text)
        self.cleared.emit(text)

    def _start_check(self) -> None:
        future = self.check() if self.check is not None else None
        if future is None:
            self._say("No model is loaded: load one, then check it.")
            return
        self.check_button.setEnabled(False)
        self.figures.setText("Checking each format on the loaded model…")
        future.add_done_callback(self._finished.emit)  # called on the engine's thread: the signal queues it here

    def _show_check(self, future: Future) -> None:
        self.check_button.setEnabled(True)
        try:
            rows: list[KVQuality] = future.result()
        except Exception as exc:  # the engine's failure, in words; the dialog stays usable
            self._say(f"The check failed: {exc}")
            return
        reference = next((r for r in rows if r.kv_dtype == "float32"), None)
        for row in rows:
            index = self.format.findData(row.kv_dtype)
            share = row.bytes_per_token / reference.bytes_per_token if reference else 1.0
            figure = "the reference" if row is reference else row.summary()
            self.format.setItemText(index, f"{row.kv_dtype}: {share:.0%} of float32's memory, {figure}")
        lines = [f"{r.kv_dtype}: {r.summary()}, perplexity {r.perplexity:.2f}" for r in rows if r is not reference]
        self._say("Against a float32 cache on the loaded model: " + "; ".join(lines) + ". Thresholds for auto: "
                  "KL at most 0.002 and top-1 at least 99%.")

    def _say(self, text: str) -> None:
        self.figures.setText(text)
        self.check_shown.emit(text)
