"""The top bar: which model serves, in which quantisation, with which draft model, on which device, and the load
under way.

The pickers show what serves: after a failed switch they return to the model that still does, and a
successful load is remembered (``model``, ``quantization``, ``device``, and the draft for that model and
quantisation in ``drafts``) so the next start opens on it. The remote servers' models follow the local ones;
while the chat on screen runs on one of them (:meth:`ModelBar.show_remote`), the bar shows that model and its
server instead. "Auto (routed)" lets the router pick a resident model for each message of the chat on screen.
"""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import QSize, Qt, Signal
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QProgressBar, QPushButton, QSizePolicy, QWidget

from engine import AUTO_QUANTIZATION_RULE, QUANTIZATIONS, EngineConfig, EngineStats, ModelLibrary
from engine.models.draft_candidates import DRAFT_QUANTIZATION
from engine.routing.router import AUTO

from ..data.remote_store import RemoteChoice
from ..data.settings import Settings, local_config, with_draft
from ..engines.bridge import ChatEngine
from ..engines.remote_engines import RemoteEngines
from .draft_picker import DraftPicker

REMOTE_ROLE = Qt.UserRole + 1  # a model bar item's RemoteChoice (local items hold their spec in Qt.UserRole)
AUTO_LABEL = "Auto (routed)"
AUTO_TIP = "Each message goes to the resident model the routing rules choose (Models > Routing)"


def add_remote_items(box: QComboBox, engines: RemoteEngines, shown: RemoteChoice | None) -> None:
    """The servers' models after the local ones, each as 'server · model' holding its :class:`RemoteChoice`;
    a server whose models are unknown shows as one disabled row saying why. ``shown`` is kept even when its
    server no longer lists it, so the bar can always show what the chat on screen runs on."""
    choices = [RemoteChoice(s.id, m.id) for s in engines.servers() for m in engines.models.get(s.id, [])]
    if shown is not None and shown not in choices:
        choices.append(shown)
    unknown = [s for s in engines.servers() if s.id not in engines.models]
    if not choices and not unknown:
        return
    box.insertSeparator(box.count())
    for choice in choices:
        box.addItem(engines.label(choice))
        box.setItemData(box.count() - 1, choice, REMOTE_ROLE)
        box.setItemData(box.count() - 1, f"A model on the remote server {engines.label(choice)}", Qt.ToolTipRole)
    for server in unknown:
        reason = engines.model_errors.get(server.id, "asking the server for its models…")
        box.addItem(f"{server.name} · {'unreachable' if server.id in engines.model_errors else 'connecting…'}")
        box.setItemData(box.count() - 1, reason, Qt.ToolTipRole)
        box.model().item(box.count() - 1).setEnabled(False)


def index_of(box: QComboBox, choice: RemoteChoice) -> int:
    """The row of ``choice`` in the model bar, or -1."""
    return next((i for i in range(box.count()) if box.itemData(i, REMOTE_ROLE) == choice), -1)


class ModelBar(QWidget):
    """Model and quantisation pickers, load progress, the device in words and the panel switch.

    Emits ``switch_requested(EngineConfig)`` when the user picks another model or quantisation and
    ``remote_requested(RemoteChoice)`` when they pick a remote server's model; follows the engine's load events
    by itself."""

    switch_requested = Signal(object)  # EngineConfig
    remote_requested = Signal(object)  # RemoteChoice
    auto_requested = Signal()  # the chat on screen is routed from now on

    def __init__(self, library: ModelLibrary, bridge: ChatEngine, settings: Settings, parent=None,
                 remote: RemoteEngines | None = None) -> None:
        super().__init__(parent)
        self.library, self.bridge, self.settings, self.remote = library, bridge, settings, remote
        self.serving: tuple[str, str] | None = None  # (model spec, quantisation) of the model that serves
        self.remote_shown: RemoteChoice | None = None  # the remote model the chat on screen runs on
        self.routed_shown = False  # the chat on screen is routed
        self.model_box = QComboBox()
        self.model_box.setToolTip("Model (Ctrl+K)")
        self.model_box.setAccessibleName("Model")
        self.model_box.setMinimumWidth(190)
        self.quant_box = QComboBox()
        self.quant_box.addItems(QUANTIZATIONS)
        self.quant_box.setToolTip("Quantisation. " + AUTO_QUANTIZATION_RULE)
        self.quant_box.setAccessibleName("Quantisation")
        self.draft_box = DraftPicker()
        self.progress = QProgressBar(textVisible=True)
        self.progress.setFixedWidth(120)
        self.progress.setFormat("%p%")
        self.progress.setAccessibleName("Model loading")
        self.progress.hide()
        self.phase = ElidedLabel()  # what the load is doing, beside the bar: a bar's own text is cut to its width
        self.phase.hide()
        self.device_label = ElidedLabel("loading…")  # the whole text in its tooltip where the bar is narrow
        self.device_label.setObjectName("deviceLabel")
        self.panel_button = QPushButton("Engine panel", checkable=True, checked=True)
        self.panel_button.setToolTip("Show or hide the live engine panel (Ctrl+J)")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 6, 8, 0)
        for widget in (QLabel("Model"), self.model_box, self.quant_box, self.draft_box, self.progress, self.phase):
            layout.addWidget(widget)
        layout.addStretch(1)
        layout.addWidget(self.device_label)
        layout.addWidget(self.panel_button)
        self.refill()
        self._show(settings["model"], settings["quantization"])
        self.model_box.activated.connect(lambda _: self._picked())
        self.quant_box.activated.connect(lambda _: self._picked())
        self.draft_box.picked.connect(self._draft_picked)
        bridge.load_progress.connect(self._progress)
        bridge.loaded.connect(self._loaded)
        bridge.load_failed.connect(self._load_failed)
        bridge.engine_failed.connect(self._engine_failed)
        bridge.stats_updated.connect(self._stats)
        if remote is not None:
            remote.servers_changed.connect(self.refill)
            remote.models_changed.connect(lambda _: self.refill())

    def refill(self) -> None:
        """The library's models and the remote servers' ones, keeping the one shown."""
        current = self.model_box.currentData()
        self.model_box.clear()
        for entry in self.library.entries():
            self.model_box.addItem(entry.name, entry.spec)
        self.model_box.addItem(AUTO_LABEL, AUTO)
        self.model_box.setItemData(self.model_box.count() - 1, AUTO_TIP, Qt.ToolTipRole)
        if self.remote is not None:
            add_remote_items(self.model_box, self.remote, self.remote_shown)
        shown = index_of(self.model_box, self.remote_shown) if self.remote_shown else -1
        self.model_box.setCurrentIndex(shown if shown >= 0 else max(0, self.model_box.findData(current)))
        if self.bridge.serving and self.bridge.config is not None:
            self._offer_drafts(self.bridge.config)  # the library changed: other models may draft now

    def choose(self, spec: str, quantization: str) -> None:
        """Show ``spec`` in ``quantization`` (the model manager's choice) and ask for it."""
        self.refill()
        self._show(spec, quantization)
        self._picked()

    def show_serving(self) -> None:
        """Put the pickers back on the model that serves (a switch refused or cancelled), or on the remote
        model of the chat on screen."""
        if self.remote_shown is not None:
            self.model_box.setCurrentIndex(index_of(self.model_box, self.remote_shown))
        elif self.routed_shown:
            self.model_box.setCurrentIndex(self.model_box.findData(AUTO))
        elif self.serving is not None:
            self._show(*self.serving)
            self.draft_box.select(self.bridge.config.draft_model if self.bridge.config else None)
        else:  # nothing has loaded yet: the model being loaded, as at the start
            self._show(self.settings["model"], self.settings["quantization"])

    def show_remote(self, choice: RemoteChoice | None, routed: bool = False) -> None:
        """The chat on screen runs on ``choice`` (None: on the local engine; ``routed``: on the router's choice):
        show that in the bar."""
        self._runs_on(choice, routed and choice is None)
        if choice is not None:
            if index_of(self.model_box, choice) < 0:
                self.refill()
            server = self.remote.server(choice.server_id) if self.remote else None
            self.device_label.setText(f"remote · {server.base_url}" if server else "remote · server removed")
        self.show_serving()

    def show_local(self, config: EngineConfig) -> None:
        """The chat on screen runs on ``config``'s local model from now on: the bar shows it while it loads."""
        self._runs_on(None, False)
        self._show(config.model, config.quantization)

    def _runs_on(self, choice: RemoteChoice | None, routed: bool) -> None:
        self.remote_shown, self.routed_shown = choice, routed
        local = choice is None and not routed
        self.quant_box.setEnabled(local)
        self.draft_box.setVisible(local)
        if choice is None and self.bridge.stats() is not None:
            self._stats(self.bridge.stats())

    def _show(self, spec: str, quantization: str) -> None:
        index = self.model_box.findData(spec)
        if index >= 0:
            self.model_box.setCurrentIndex(index)
        self.quant_box.setCurrentText(quantization)

    def _picked(self) -> None:
        choice = self.model_box.currentData(REMOTE_ROLE)
        if choice is not None:
            self.remote_requested.emit(choice)
            return
        if self.model_box.currentData() == AUTO:
            self.auto_requested.emit()
            return
        self._request(local_config(self.settings, self.model_box.currentData(), self.quant_box.currentText()))

    def _draft_picked(self, draft: str | None) -> None:
        """Reload the serving model with ``draft`` beside it (kept as the model's draft once it loads)."""
        config = self.bridge.config
        if config is None or draft == config.draft_model:
            return
        self._request(dataclasses.replace(config, draft_model=draft, draft_quantization=DRAFT_QUANTIZATION))

    def _request(self, config: EngineConfig) -> None:
        self._show_progress(True)
        self.switch_requested.emit(config)

    def _offer_drafts(self, config: EngineConfig) -> None:
        specs = [entry.spec for entry in self.library.entries()]
        self.draft_box.show_for(config.model, config.quantization, specs, config.draft_model, config.device)

    def _show_progress(self, shown: bool) -> None:
        self.progress.setVisible(shown)
        self.phase.setVisible(shown)

    def _progress(self, fraction: float, phrase: str) -> None:
        self._show_progress(True)
        self.progress.setValue(int(fraction * 100))
        self.phase.setText(phrase)  # and its tooltip (ElidedLabel)
        self.progress.setAccessibleDescription(phrase)

    def _loaded(self, stats: EngineStats) -> None:
        self._show_progress(False)
        config = self.bridge.config
        if config is not None:
            self.serving = (config.model, config.quantization)
            self.show_serving()
            for key, value in (("model", config.model), ("quantization", config.quantization),
                               ("device", config.device)):
                self.settings[key] = value
            self.settings["drafts"] = with_draft(self.settings["drafts"], config.model, config.quantization,
                                                 config.draft_model)
            self.settings.save()
            self._offer_drafts(config)
        self._stats(stats)

    def _load_failed(self, message: str) -> None:
        self._show_progress(False)
        if self.bridge.serving:
            self.show_serving()  # the previous model keeps serving, and the pickers say so
        elif self.remote_shown is None:
            self.device_label.setText("no model loaded")

    def _engine_failed(self, reason: str) -> None:
        self._show_progress(False)
        if self.remote_shown is None:
            self.device_label.setText("engine stopped")

    def _stats(self, stats: EngineStats) -> None:
        if self.remote_shown is not None:
            return  # the label says where the chat on screen runs
        self.device_label.setText(f"{stats.device.upper()} · {stats.device_reason}")


class ElidedLabel(QLabel):
    """One line of plain text that ends in "…" where the bar is too narrow for it, rather than being cut."""

    def __init__(self, text: str = "", parent=None) -> None:
        super().__init__(text, parent)
        self.setTextFormat(Qt.PlainText)
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)

    def setText(self, text: str) -> None:
        super().setText(text)
        self.setToolTip(text)

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self.text()) + 4, super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance("building…"), super().minimumSizeHint().height())

    def paintEvent(self, event) -> None:
        painter = QPainter(self)
        shown = self.fontMetrics().elidedText(self.text(), Qt.ElideRight, self.contentsRect().width())
        painter.drawText(self.contentsRect(), int(Qt.AlignVCenter | Qt.AlignLeft), shown)
