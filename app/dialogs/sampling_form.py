"""The sampling settings as a form (with what each does), shared by a chat's settings and the Preferences."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QMessageBox,
    QSpinBox,
    QVBoxLayout,
)

from ..data.settings import DEFAULTS, sampling_problems, valid_sampling

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
        self.temperature = double_box(0.0, 2.0, 0.05, values["temperature"])
        self.top_p = double_box(0.01, 1.0, 0.01, values["top_p"])
        self.top_k = int_box(0, 1000, values["top_k"])
        self.min_p = double_box(0.0, 1.0, 0.01, values["min_p"])
        self.repetition_penalty = double_box(0.5, 2.0, 0.05, values["repetition_penalty"])
        self.max_tokens = int_box(1, 32768, values["max_tokens"])
        self.fixed_seed = QCheckBox("Fixed seed")
        self.seed = int_box(0, 2**31 - 1, values["seed"] or 0)
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


def stack_with_ok_cancel(dialog: QDialog, *widgets) -> None:
    layout = QVBoxLayout(dialog)
    for widget in widgets:
        layout.addWidget(widget)
    buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
    buttons.accepted.connect(dialog.accept)
    buttons.rejected.connect(dialog.reject)
    layout.addWidget(buttons)


def double_box(low: float, high: float, step: float, value: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox(minimum=low, maximum=high, singleStep=step, decimals=2)
    box.setValue(value)
    return box


def int_box(low: int, high: int, value: int) -> QSpinBox:
    box = QSpinBox(minimum=low, maximum=high)
    box.setValue(value)
    return box
