"""Dialogs for a conversation's persona and sampling, and for the defaults new chats start with."""

from __future__ import annotations

import secrets

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from engine import ApiConfig, ApiConfigError

from .settings import DEFAULTS, Preset, sampling_problems, valid_sampling

CUSTOM = "Custom"


class SamplingForm(QGroupBox):
    """Temperature, top-p, top-k, min-p, repetition penalty, max tokens and seed."""

    def __init__(self, values: dict, parent=None) -> None:
        super().__init__("Sampling", parent)
        values = valid_sampling({**DEFAULTS["sampling"], **values})  # stored values may predate validation
        form = QFormLayout(self)
        self.temperature = _double(0.0, 2.0, 0.05, values["temperature"])
        self.top_p = _double(0.01, 1.0, 0.01, values["top_p"])
        self.top_k = _int(0, 1000, values["top_k"])
        self.min_p = _double(0.0, 1.0, 0.01, values["min_p"])
        self.repetition_penalty = _double(0.5, 2.0, 0.05, values["repetition_penalty"])
        self.max_tokens = _int(1, 32768, values["max_tokens"])
        self.fixed_seed = QCheckBox("Fixed seed")
        self.seed = _int(0, 2**31 - 1, values["seed"] or 0)
        self.fixed_seed.setChecked(values["seed"] is not None)
        self.seed.setEnabled(values["seed"] is not None)
        self.fixed_seed.toggled.connect(self.seed.setEnabled)
        form.addRow("Temperature (0 = always the likeliest word)", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Top-k (0 = off)", self.top_k)
        form.addRow("Min-p", self.min_p)
        form.addRow("Repetition penalty", self.repetition_penalty)
        form.addRow("Max tokens per reply", self.max_tokens)
        form.addRow(self.fixed_seed, self.seed)

    def values(self) -> dict:
        return {
            "temperature": self.temperature.value(), "top_p": self.top_p.value(), "top_k": self.top_k.value(),
            "min_p": self.min_p.value(), "repetition_penalty": self.repetition_penalty.value(),
            "max_tokens": self.max_tokens.value(), "seed": self.seed.value() if self.fixed_seed.isChecked() else None,
        }

    def accept_or_explain(self) -> bool:
        """True when the engine accepts these values; otherwise a message says what it refuses."""
        problems = sampling_problems(self.values())
        if problems:
            QMessageBox.warning(self, "Sampling settings not valid", "\n".join(problems.values()))
        return not problems


class ApiForm(QGroupBox):
    """The local OpenAI-compatible endpoint: on or off, where it listens, and its API key."""

    def __init__(self, values: dict, status: str = "", parent=None) -> None:
        super().__init__("Local API (OpenAI-compatible)", parent)
        values = {**DEFAULTS["api"], **values}
        self.enabled = QCheckBox("Serve the model to other programs over HTTP")
        self.enabled.setChecked(values["enabled"])
        self.host = QLineEdit(values["host"])
        self.host.setToolTip("127.0.0.1: this computer only. Any other address needs an API key.")
        self.port = _int(1, 65535, values["port"])
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


class ChatSettingsDialog(QDialog):
    """One conversation's persona (a preset or a custom system prompt) and sampling."""

    def __init__(self, presets: list[Preset], preset: str | None, system_prompt: str, sampling: dict,
                 parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.presets = {p.name: p for p in presets}
        self.preset = QComboBox()
        self.preset.addItems([*self.presets, CUSTOM])
        self.preset.setCurrentText(preset if preset in self.presets else CUSTOM)
        self.prompt = QPlainTextEdit(system_prompt)
        self.prompt.setPlaceholderText("Instructions the model reads before the conversation")
        self.sampling = SamplingForm(sampling)
        persona = QGroupBox("Persona")
        persona_form = QFormLayout(persona)
        persona_form.addRow("Preset", self.preset)
        persona_form.addRow("System prompt", self.prompt)
        _stack_with_ok_cancel(self, persona, self.sampling)
        self.preset.currentTextChanged.connect(self._preset_chosen)
        self.prompt.textChanged.connect(self._prompt_edited)
        self.resize(560, 620)

    def accept(self) -> None:
        if self.sampling.accept_or_explain():
            super().accept()

    def _preset_chosen(self, name: str) -> None:
        if name in self.presets:
            self.prompt.blockSignals(True)
            self.prompt.setPlainText(self.presets[name].system_prompt)
            self.prompt.blockSignals(False)

    def _prompt_edited(self) -> None:
        name = self.preset.currentText()
        if name in self.presets and self.prompt.toPlainText() != self.presets[name].system_prompt:
            self.preset.setCurrentText(CUSTOM)

    def result_values(self) -> dict:
        preset = self.preset.currentText()
        return {"preset": None if preset == CUSTOM else preset, "system_prompt": self.prompt.toPlainText(),
                "settings": self.sampling.values()}


class PreferencesDialog(QDialog):
    """Defaults for new chats, the theme, and the local API (``api_status``: what it is doing now)."""

    def __init__(self, presets: list[Preset], values: dict, parent=None, api_status: str = "") -> None:
        super().__init__(parent)
        self.setWindowTitle("Preferences")
        self.theme = QComboBox()
        self.theme.addItems(["system", "light", "dark"])
        self.theme.setCurrentText(values["theme"])
        self.preset = QComboBox()
        self.preset.addItems([p.name for p in presets])
        self.preset.setCurrentText(values["preset"])
        self.sampling = SamplingForm(values["sampling"])
        general = QGroupBox("New chats and appearance")
        form = QFormLayout(general)
        form.addRow("Theme", self.theme)
        form.addRow("Persona for new chats", self.preset)
        self.api = ApiForm(values.get("api", {}), api_status)
        _stack_with_ok_cancel(self, general, self.sampling, self.api)

    def accept(self) -> None:
        if self.sampling.accept_or_explain() and self.api.accept_or_explain():
            super().accept()

    def result_values(self) -> dict:
        return {"theme": self.theme.currentText(), "preset": self.preset.currentText(),
                "sampling": self.sampling.values(), "api": self.api.values()}


def _stack_with_ok_cancel(dialog: QDialog, *widgets) -> None:
    layout = QVBoxLayout(dialog)
    for widget in widgets:
        layout.addWidget(widget)
    buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    layout.addWidget(buttons)


def _double(low: float, high: float, step: float, value: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox(minimum=low, maximum=high, singleStep=step, decimals=2)
    box.setValue(value)
    return box


def _int(low: int, high: int, value: int) -> QSpinBox:
    box = QSpinBox(minimum=low, maximum=high)
    box.setValue(value)
    return box
