"""Preferences: the defaults new chats start with, the theme, the text size, the engine's CPU use, the KV cache's
format, the local API and the MCP servers."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable
from concurrent.futures import Future

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSpinBox,
)

from engine import ApiConfig, ApiConfigError

from ..data.settings import DEFAULTS, MAX_IDLE_MINUTES, TEXT_SCALES, Preset
from ..mcp.toolbox import McpToolbox
from .kv_cache_form import KVCacheForm
from .mcp_servers_form import McpServersForm
from .sampling_form import SamplingForm, int_box, stack_with_ok_cancel


class ApiForm(QGroupBox):
    """The local OpenAI-compatible endpoint: on or off, where it listens, and its API key."""

    def __init__(self, values: dict, status: str = "", parent=None) -> None:
        super().__init__("Local API (OpenAI-compatible)", parent)
        values = {**DEFAULTS["api"], **values}
        self.enabled = QCheckBox("Serve the model to other programs over HTTP")
        self.enabled.setChecked(values["enabled"])
        self.host = QLineEdit(values["host"])
        self.host.setToolTip("127.0.0.1: this computer only. Any other address needs an API key.")
        self.port = int_box(1, 65535, values["port"])
        self.api_key = QLineEdit(values["api_key"])
        self.api_key.setEchoMode(QLineEdit.PasswordEchoOnEdit)
        self.api_key.setPlaceholderText("none (only allowed on 127.0.0.1)")
        self.generate = QPushButton("Generate")
        self.generate.setToolTip("A new random key; clients send it as 'Authorization: Bearer <key>'")
        self.generate.clicked.connect(lambda: self.api_key.setText(secrets.token_urlsafe(24)))
        key_row = QHBoxLayout()
        key_row.addWidget(self.api_key, 1)
        key_row.addWidget(self.generate)
        self.status = QLabel(status or "Off")
        self.status.setObjectName("apiStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextSelectableByMouse)
        form = QFormLayout(self)
        form.addRow(self.enabled)
        form.addRow("Address", self.host)
        form.addRow("Port", self.port)
        form.addRow("API key", key_row)
        form.addRow("Status", self.status)
        self.enabled.toggled.connect(self._enable_fields)
        self._enable_fields(self.enabled.isChecked())

    def _enable_fields(self, on: bool) -> None:
        for field in (self.host, self.port, self.api_key, self.generate):
            field.setEnabled(on)

    def values(self) -> dict:
        return {"enabled": self.enabled.isChecked(), "host": self.host.text().strip(), "port": self.port.value(),
                "api_key": self.api_key.text().strip()}

    def accept_or_explain(self) -> bool:
        """True unless the endpoint is on with settings it can't start with (another address without a key)."""
        values = self.values()
        if not values["enabled"]:
            return True
        try:
            ApiConfig(values["host"], values["port"], values["api_key"] or None)
        except ApiConfigError as exc:
            QMessageBox.warning(self, "Local API settings not valid", f"{str(exc)[0].upper()}{str(exc)[1:]}.")
            return False
        return True


AUTO_THREADS = "auto: as many as other programs leave free"


class CpuForm(QGroupBox):
    """The engine's CPU threads (auto, or a count) and whether it yields to other programs."""

    def __init__(self, values: dict, parent=None) -> None:
        super().__init__("Engine on the CPU", parent)
        self.threads = QComboBox()
        self.threads.addItem(AUTO_THREADS, "auto")
        for count in range(1, max(os.cpu_count() or 1, values["threads"] if values["threads"] != "auto" else 1) + 1):
            self.threads.addItem(str(count), count)
        self.threads.setCurrentIndex(max(0, self.threads.findData(values["threads"])))
        self.threads.setAccessibleDescription("auto: the engine gives a core up while another program keeps it "
                                              "busy, and takes it back when it is free")
        self.lower_priority = QCheckBox("Lower priority while others need the CPU")
        self.lower_priority.setChecked(values["lower_priority"])
        self.lower_priority.setToolTip("Other programs get the larger share of a busy CPU; replies are slower "
                                       "then, and as fast as ever when the CPU is free")
        form = QFormLayout(self)
        form.addRow("Threads", self.threads)
        form.addRow(self.lower_priority)

    def values(self) -> dict:
        return {"threads": self.threads.currentData(), "lower_priority": self.lower_priority.isChecked()}


SPECULATION_CHOICES = (
    ("auto", "Auto: draft where it is measured to pay"),
    ("ngram", "Always draft from earlier text"),
    ("off", "Off"),
)


class SpeculationForm(QGroupBox):
    """Speculative decoding's mode: replies are the same whatever it is; only their speed changes."""

    def __init__(self, values: dict, parent=None) -> None:
        super().__init__("Speculative decoding", parent)
        self.mode = QComboBox()
        for mode, text in SPECULATION_CHOICES:
            self.mode.addItem(text, mode)
        self.mode.setCurrentIndex(max(0, self.mode.findData(values["speculation"])))
        self.mode.setToolTip("The engine guesses the next few tokens from earlier text (quoted passages, code being "
                             "edited), or has a draft model chosen in the model bar guess them, and checks them all "
                             "in one step. A reply is the same either way; auto drafts only while its measurements "
                             "say replies come faster.")
        self.mode.setAccessibleDescription(self.mode.toolTip())
        form = QFormLayout(self)
        form.addRow("Drafts", self.mode)

    def values(self) -> dict:
        return {"speculation": self.mode.currentData()}


class ModelsForm(QGroupBox):
    """Several models resident at once: when one nobody uses is given back."""

    def __init__(self, values: dict, parent=None) -> None:
        super().__init__("Several models", parent)
        self.idle_minutes = int_box(0, MAX_IDLE_MINUTES, values["idle_unload_minutes"])
        self.idle_minutes.setSuffix(" min")
        self.idle_minutes.setSpecialValueText("never")
        self.idle_minutes.setToolTip("A model loaded beside the first that no chat has used for this long is "
                                     "unloaded, and its memory given back; a chat on it loads it again")
        self.idle_minutes.setAccessibleDescription(self.idle_minutes.toolTip())
        form = QFormLayout(self)
        form.addRow("Unload a model unused for", self.idle_minutes)

    def values(self) -> dict:
        return {"idle_unload_minutes": self.idle_minutes.value()}


class PreferencesDialog(QDialog):
    """Defaults for new chats, the theme, the text size, the engine's CPU use, and the local API (``api_status``:
    what it is doing now)."""

    def __init__(self, presets: list[Preset], values: dict, parent=None, api_status: str = "",
                 check_kv: Callable[[], Future | None] | None = None,
                 clear_disk: Callable[[], Future | None] | None = None,
                 tools: McpToolbox | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Preferences")
        self.theme = QComboBox()
        self.theme.addItems(["system", "light", "dark"])
        self.theme.setCurrentText(values["theme"])
        self.theme.setAccessibleDescription("“system” follows the desktop's light or dark setting as it changes")
        self.text_scale = QSpinBox(minimum=TEXT_SCALES[0], maximum=TEXT_SCALES[-1], singleStep=10, suffix=" %")
        self.text_scale.setValue(values.get("text_scale", DEFAULTS["text_scale"]))
        self.text_scale.setAccessibleDescription("The size of the conversation's text; Ctrl+= and Ctrl+- change "
                                                 "it, Ctrl+0 puts it back to 100 %")
        self.preset = QComboBox()
        self.preset.addItems([p.name for p in presets])
        self.preset.setCurrentText(values["preset"])
        self.sampling = SamplingForm(values["sampling"])
        general = QGroupBox("New chats and appearance")
        form = QFormLayout(general)
        form.addRow("Theme", self.theme)
        form.addRow("Text size", self.text_scale)
        form.addRow("Persona for new chats", self.preset)
        self.cpu = CpuForm(values)
        self.speculation = SpeculationForm(values)
        self.models = ModelsForm(values)
        self.kv_cache = KVCacheForm(values, check_kv, clear_disk)
        self.api = ApiForm(values.get("api", {}), api_status)
        self.mcp = McpServersForm(values, tools)
        stack_with_ok_cancel(self, general, self.sampling, self.cpu, self.speculation, self.models, self.kv_cache,
                            self.api, self.mcp)

    def accept(self) -> None:
        if self.sampling.accept_or_explain() and self.api.accept_or_explain():
            super().accept()

    def result_values(self) -> dict:
        return {"theme": self.theme.currentText(), "text_scale": self.text_scale.value(),
                "preset": self.preset.currentText(), "sampling": self.sampling.values(), **self.cpu.values(),
                **self.speculation.values(), **self.models.values(), **self.kv_cache.values(),
                "api": self.api.values(), **self.mcp.values()}
