"""A conversation's persona and sampling."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
)

from ..data.personas import CUSTOM, PersonaError, Personas
from .sampling_form import SamplingForm, stack_with_ok_cancel


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
        stack_with_ok_cancel(self, persona, self.sampling)
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
