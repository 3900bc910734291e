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
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
)

from engine import ApiConfig, ApiConfigError

from .personas import CUSTOM, PersonaError, Personas
from .settings import DEFAULTS, TEXT_SCALES, Preset, sampling_problems, valid_sampling

DESCRIPTIONS = {  # what each sampling setting does, for tooltips and screen readers
    "temperature": "Higher values make replies more varied, lower ones more predictable; 0 always picks the "
                   "likeliest word.",
    "top_p": "Only the likeliest words that together reach this probability are considered.",
    "top_k": "Only this many of the likeliest words are considered; 0 turns the limit off.",
    "min_p": "Words less likely than this share of the likeliest word are left out.",
    "repetition_penalty": "Above 1, words already used become less likely, so the reply repeats itself less.",
    "max_tokens": "The longest a reply may get; a reply cut here can be continued.",
    "seed": "The same seed and settings give the same reply again.",
}


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
        self.seed.setAccessibleName("Seed")
        self.fixed_seed.setAccessibleDescription("Use the seed beside it, so the same reply can be written again")
        for key, description in DESCRIPTIONS.items():
            widget = getattr(self, key)
            widget.setToolTip(description)
            widget.setAccessibleDescription(description)

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
    """One conversation's persona (built-in, the user's own, or a custom system prompt) and sampling.

    Saving, renaming and deleting the user's personas happens at once (they are shared by every chat); OK and
    Cancel decide only this chat's choice."""

    def __init__(self, personas: Personas, preset: str | None, system_prompt: str, sampling: dict,
                 parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Chat settings")
        self.personas = personas
        self.preset = QComboBox()
        self.preset.setAccessibleName("Persona")
        self.prompt = QPlainTextEdit(system_prompt)
        self.prompt.setPlaceholderText("Instructions the model reads before the conversation")
        self.prompt.setTabChangesFocus(True)
        self.prompt.setAccessibleName("System prompt")
        self.save_button = QPushButton("Save as persona…")
        self.save_button.setToolTip("Save this system prompt under a name, to pick it for other chats")
        self.rename_button = QPushButton("Rename…")
        self.rename_button.setAccessibleName("Rename this persona")
        self.delete_button = QPushButton("Delete")
        self.delete_button.setAccessibleName("Delete this persona")
        self.note = QLabel(wordWrap=True)
        self.note.setStyleSheet("color: palette(placeholder-text);")
        self.sampling = SamplingForm(sampling)
        persona = QGroupBox("Persona")
        persona_form = QFormLayout(persona)
        row = QHBoxLayout()
        row.addWidget(self.preset, 1)
        for button in (self.save_button, self.rename_button, self.delete_button):
            row.addWidget(button)
        persona_form.addRow("Persona", row)
        persona_form.addRow("System prompt", self.prompt)
        persona_form.addRow(self.note)
        _stack_with_ok_cancel(self, persona, self.sampling)
        self._fill(preset if preset in personas.names() else CUSTOM)
        self.preset.currentTextChanged.connect(self._preset_chosen)
        self.prompt.textChanged.connect(self._prompt_edited)
        self.save_button.clicked.connect(self.save_persona)
        self.rename_button.clicked.connect(self.rename_persona)
        self.delete_button.clicked.connect(self.delete_persona)
        self.resize(600, 640)

    def accept(self) -> None:
        if self.sampling.accept_or_explain():
            super().accept()

    # -- the user's personas ---------------------------------------------------------------------------

    def save_persona(self) -> bool:
        """Ask for a name and save the prompt in the box under it; True when saved."""
        current = self.preset.currentText()
        name = self.ask_name("Save as persona", "Name of the persona:",
                             current if self.personas.is_own(current) else "")
        if name is None:
            return False
        existing = self.personas.get(" ".join(name.split()))
        if existing is not None and not existing.builtin and existing.system_prompt != self.prompt.toPlainText() \
                and not self.confirm(f"Replace the system prompt of your persona “{existing.name}”?"):
            return False
        return self._try(lambda: self._fill(self.personas.save(name, self.prompt.toPlainText()).name))

    def rename_persona(self) -> bool:
        old = self.preset.currentText()
        new = self.ask_name("Rename persona", "New name:", old) if self.personas.is_own(old) else None
        if new is None:
            return False
        return self._try(lambda: (self.personas.rename(old, new), self._fill(" ".join(new.split()))))

    def delete_persona(self) -> bool:
        name = self.preset.currentText()
        if not self.personas.is_own(name) or not self.confirm(
                f"Delete your persona “{name}”? Chats that use it keep its system prompt."):
            return False
        return self._try(lambda: (self.personas.delete(name), self._fill(CUSTOM)))

    def ask_name(self, title: str, label: str, text: str) -> str | None:
        """The name the user typed, or None when they cancelled."""
        name, ok = QInputDialog.getText(self, title, label, text=text)
        return name if ok else None

    def confirm(self, question: str) -> bool:
        return QMessageBox.question(self, "Personas", question) == QMessageBox.Yes

    def _try(self, change) -> bool:
        try:
            change()
        except PersonaError as exc:
            QMessageBox.warning(self, "Personas", str(exc))
            return False
        return True

    # -- choosing --------------------------------------------------------------------------------------

    def _fill(self, chosen: str) -> None:
        """The list of personas, showing ``chosen`` (a name, or CUSTOM); the prompt box is left as it is."""
        self.preset.blockSignals(True)
        self.preset.clear()
        self.preset.addItems([*self.personas.names(), CUSTOM])
        self.preset.setCurrentText(chosen)
        self.preset.blockSignals(False)
        self._update_buttons()

    def _update_buttons(self) -> None:
        name = self.preset.currentText()
        own = self.personas.is_own(name)
        self.rename_button.setEnabled(own)
        self.delete_button.setEnabled(own)
        persona = self.personas.get(name)
        self.note.setText("A built-in persona: to change it, edit the prompt and save it as your own." if
                          persona is not None and persona.builtin else
                          "Your own persona: it can be renamed or deleted." if own else
                          "A system prompt for this chat alone; save it as a persona to use it again.")

    def _preset_chosen(self, name: str) -> None:
        persona = self.personas.get(name)
        if persona is not None:
            self.prompt.blockSignals(True)
            self.prompt.setPlainText(persona.system_prompt)
            self.prompt.blockSignals(False)
        self._update_buttons()

    def _prompt_edited(self) -> None:
        persona = self.personas.get(self.preset.currentText())
        if persona is not None and self.prompt.toPlainText() != persona.system_prompt:
            self.preset.setCurrentText(CUSTOM)

    def result_values(self) -> dict:
        preset = self.preset.currentText()
        return {"preset": None if preset == CUSTOM else preset, "system_prompt": self.prompt.toPlainText(),
                "settings": self.sampling.values()}


class PreferencesDialog(QDialog):
    """Defaults for new chats, the theme, the text size, and the local API (``api_status``: what it is doing
    now)."""

    def __init__(self, presets: list[Preset], values: dict, parent=None, api_status: str = "") -> None:
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
        self.api = ApiForm(values.get("api", {}), api_status)
        _stack_with_ok_cancel(self, general, self.sampling, self.api)

    def accept(self) -> None:
        if self.sampling.accept_or_explain() and self.api.accept_or_explain():
            super().accept()

    def result_values(self) -> dict:
        return {"theme": self.theme.currentText(), "text_scale": self.text_scale.value(),
                "preset": self.preset.currentText(), "sampling": self.sampling.values(), "api": self.api.values()}


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
