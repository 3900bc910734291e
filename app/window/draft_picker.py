"""The model bar's draft picker: which model writes drafts beside the one serving (speculative decoding).

It offers "No draft model" and the library's models that can draft for the serving one: the same tokens, and
fewer weight bytes as int4 (:func:`engine.models.draft_candidates.draft_candidates`, read on a worker thread:
each model's tokenizer is read once), each with the memory its weights take. A model that cannot is never
offered; replies are the same whichever is picked, only their speed and the memory change.
"""

from __future__ import annotations

import contextlib

from PySide6.QtCore import QObject, QSize, Qt, QThreadPool, Signal
from PySide6.QtWidgets import QComboBox, QStyle, QStyleOptionComboBox

from engine.models.draft_candidates import DraftCandidate, draft_candidates

from ..units import size_text

NO_DRAFT = "No draft model"
CHECKING = "Drafts: checking…"
TIP = ("A smaller model with the same tokenizer guesses the next few tokens, and the model checks them all in one "
       "step: replies are the same, faster where its guesses are kept (auto drafts only while they pay). It loads "
       "beside the model as int4; its weights take the memory shown, and its KV cache some more per token.")

NONE_OFFERED = ("No model in the library can draft for this one: a draft needs the same tokenizer and fewer weight "
                "bytes at int4 (a model at full precision can draft with its own int4 copy).")


def candidate_text(candidate: DraftCandidate, target: str) -> str:
    """How the picker names a draft: "Draft: SmolLM2-135M-Instruct int4 (itself) · 92.1 MiB"."""
    itself = " (itself)" if candidate.spec == target else ""
    return f"Draft: {candidate.name} {candidate.quantization}{itself} · {size_text(candidate.weight_bytes)}"


class _Found(QObject):
    done = Signal(object, object)  # the question (target, quantisation, specs, device), its answer: list or error


def _candidates(target: str, quantization: str, specs: tuple[str, ...], device: str):
    try:
        return draft_candidates(target, quantization, list(specs), device)
    except Exception as exc:  # whatever the files hold, the picker says so and offers no draft
        return exc


class DraftPicker(QComboBox):
    """``show_for(...)`` fills it for a serving model; ``picked(spec or None)`` when the user picks another."""

    picked = Signal(object)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setAccessibleName("Draft model")
        self.setToolTip(TIP)
        self.currentIndexChanged.connect(lambda _: self.updateGeometry())
        self._question: tuple | None = None
        self._found = _Found()  # no parent: a look still under way when the bar closes answers no one
        self._found.done.connect(self._fill)
        self.activated.connect(lambda _: self.picked.emit(self.currentData()))
        self._show_only(NO_DRAFT)

    def show_for(self, target: str, quantization: str, specs: list[str], chosen: str | None,
                 device: str = "auto") -> None:
        """Offer the drafts for ``target`` loaded in ``quantization`` among ``specs``, ``chosen`` shown."""
        question = (target, quantization, tuple(specs), device)
        self._question, self._chosen = question, chosen
        self._show_only(CHECKING)
        found = self._found
        QThreadPool.globalInstance().start(lambda: _look(found, question))

    def sizeHint(self) -> QSize:
        """As wide as the draft shown; a narrow bar shrinks it to :meth:`minimumSizeHint` (the text elided)."""
        return QSize(self._width_for(self.currentText()), super().sizeHint().height())

    def minimumSizeHint(self) -> QSize:
        return QSize(self._width_for(NO_DRAFT), super().minimumSizeHint().height())

    def _width_for(self, text: str) -> int:
        option = QStyleOptionComboBox()
        self.initStyleOption(option)
        contents = QSize(self.fontMetrics().horizontalAdvance(text), self.fontMetrics().height())
        return self.style().sizeFromContents(QStyle.CT_ComboBox, option, contents, self).width()

    def checking(self) -> bool:
        """Whether the drafts are still being looked for."""
        return not self.isEnabled() and self.itemText(0) == CHECKING

    def _show_only(self, text: str) -> None:
        self.clear()
        self.addItem(text, None)
        self.setEnabled(False)

    def _fill(self, question: tuple, found) -> None:
        if question != self._question:
            return  # the model changed meanwhile
        self.clear()
        self.addItem(NO_DRAFT, None)
        if isinstance(found, Exception):
            self.setItemData(0, f"No draft can be offered: {found}", Qt.ToolTipRole)
            found = []
        for candidate in found:
            self.addItem(candidate_text(candidate, question[0]), candidate.spec)
        if self._chosen is not None and self.findData(self._chosen) < 0:  # loaded, though no longer offered
            self.addItem(f"Draft: {self._chosen}", self._chosen)
        self.select(self._chosen)
        self.setEnabled(self.count() > 1)
        self.view().setMinimumWidth(self.view().sizeHintForColumn(0) + 24)  # the list shows whole names
        self.setToolTip(TIP if self.count() > 1 else f"{NONE_OFFERED} {TIP}")

    def select(self, spec: str | None) -> None:
        """Show ``spec`` (None: no draft) as the draft, as after a load or a switch the user called off."""
        self._chosen = spec
        if not self.checking():
            self.setCurrentIndex(max(0, self.findData(spec)))


def _look(found: _Found, question: tuple) -> None:
    """On a pool thread: the drafts for ``question``, answered through ``found``."""
    candidates = _candidates(*question)
    with contextlib.suppress(RuntimeError):  # the bar was closed and its answerer deleted while this looked
        found.done.emit(question, candidates)
