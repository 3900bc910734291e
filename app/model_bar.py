"""The top bar: which model serves, in which quantisation, on which device, and the load under way.

The pickers show what serves: after a failed switch they return to the model that still does, and a
successful load is remembered (``model``, ``quantization`` and ``device`` in the settings) so the next start
opens on it.
"""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from engine import AUTO_QUANTIZATION_RULE, QUANTIZATIONS, EngineConfig, EngineStats, ModelLibrary

from .bridge import ChatEngine
from .settings import Settings


class ModelBar(QWidget):
    """Model and quantisation pickers, load progress, the device in words and the panel switch.

    Emits ``switch_requested(EngineConfig)`` when the user picks another model or quantisation; follows the
    engine's load events by itself."""

    switch_requested = Signal(object)  # EngineConfig

    def __init__(self, library: ModelLibrary, bridge: ChatEngine, settings: Settings, parent=None) -> None:
        super().__init__(parent)
        self.library, self.bridge, self.settings = library, bridge, settings
        self.serving: tuple[str, str] | None = None  # (model spec, quantisation) of the model that serves
        self.model_box = QComboBox()
        self.model_box.setToolTip("Model (Ctrl+K)")
        self.model_box.setAccessibleName("Model")
        self.model_box.setMinimumWidth(220)
        self.quant_box = QComboBox()
        self.quant_box.addItems(QUANTIZATIONS)
        self.quant_box.setToolTip("Quantisation. " + AUTO_QUANTIZATION_RULE)
        self.quant_box.setAccessibleName("Quantisation")
        self.progress = QProgressBar(maximumWidth=260, textVisible=True)
        self.progress.setAccessibleName("Model loading")
        self.progress.hide()
        self.device_label = QLabel("loading…")
        self.device_label.setObjectName("deviceLabel")
        self.panel_button = QPushButton("Engine panel", checkable=True, checked=True)
        self.panel_button.setToolTip("Show or hide the live engine panel (Ctrl+J)")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 0)
        for widget in (QLabel("Model"), self.model_box, self.quant_box, self.progress):
            layout.addWidget(widget)
        layout.addStretch(1)
        layout.addWidget(self.device_label)
        layout.addWidget(self.panel_button)
        self.refill()
        self._show(settings["model"], settings["quantization"])
        self.model_box.activated.connect(lambda _: self._picked())
        self.quant_box.activated.connect(lambda _: self._picked())
        bridge.load_progress.connect(self._progress)
        bridge.loaded.connect(self._loaded)
        bridge.load_failed.connect(self._load_failed)
        bridge.engine_failed.connect(self._engine_failed)
        bridge.stats_updated.connect(self._stats)

    def refill(self) -> None:
        """The library's models, keeping the one shown."""
        current = self.model_box.currentData()
        self.model_box.clear()
        for entry in self.library.entries():
            self.model_box.addItem(entry.name, entry.spec)
        self.model_box.setCurrentIndex(max(0, self.model_box.findData(current)))

    def choose(self, spec: str, quantization: str) -> None:
        """Show ``spec`` in ``quantization`` (the model manager's choice) and ask for it."""
        self.refill()
        self._show(spec, quantization)
        self._picked()

    def show_serving(self) -> None:
        """Put the pickers back on the model that serves (a switch refused or cancelled)."""
        if self.serving is not None:
            self._show(*self.serving)

    def _show(self, spec: str, quantization: str) -> None:
        index = self.model_box.findData(spec)
        if index >= 0:
            self.model_box.setCurrentIndex(index)
        self.quant_box.setCurrentText(quantization)

    def _picked(self) -> None:
        config = EngineConfig(model=self.model_box.currentData(), quantization=self.quant_box.currentText(),
                              device=self.settings["device"])
        self.progress.show()
        self.switch_requested.emit(config)

    def _progress(self, fraction: float, phrase: str) -> None:
        self.progress.show()
        self.progress.setValue(int(fraction * 100))
        self.progress.setFormat(f"{phrase} %p%")

    def _loaded(self, stats: EngineStats) -> None:
        self.progress.hide()
        config = self.bridge.config
        if config is not None:
            self.serving = (config.model, config.quantization)
            self._show(*self.serving)
            for key, value in (("model", config.model), ("quantization", config.quantization),
                               ("device", config.device)):
                self.settings[key] = value
            self.settings.save()
        self._stats(stats)

    def _load_failed(self, message: str) -> None:
        self.progress.hide()
        if self.bridge.serving:
            self.show_serving()  # the previous model keeps serving, and the pickers say so
        else:
            self.device_label.setText("no model loaded")

    def _engine_failed(self, reason: str) -> None:
        self.progress.hide()
        self.device_label.setText("engine stopped")

    def _stats(self, stats: EngineStats) -> None:
        self.device_label.setText(f"{stats.device.upper()} · {stats.device_reason}")
