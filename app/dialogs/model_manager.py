"""The model manager: the library as a table, add and remove, the fit estimate before loading, and Discover
(models from the Hugging Face Hub, :mod:`app.dialogs.discover`)."""

from __future__ import annotations

import logging

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, Qt, QThreadPool, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPushButton,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine import QUANTIZATIONS, EngineConfig, EngineError, LibraryEntry, ModelLibrary, estimate_fit

from ..units import size_text
from .discover import DiscoverPage

COLUMNS = ("Name", "Architecture", "Parameters", "Context", "On disk", "Licence", "Source")


log = logging.getLogger(__name__)


class LibraryTableModel(QAbstractTableModel):
    """The model library as rows."""

    def __init__(self, library: ModelLibrary, parent=None) -> None:
        super().__init__(parent)
        self.library = library
        self.entries: list[LibraryEntry] = library.entries()

    def refresh(self) -> None:
        self.beginResetModel()
        self.entries = self.library.entries()
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.entries)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation, role: int = Qt.DisplayRole):
        if role == Qt.DisplayRole and orientation == Qt.Horizontal and 0 <= section < len(COLUMNS):
            return COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.entries):
            return None
        entry = self.entries[index.row()]
        if role == Qt.UserRole:
            return entry.spec
        if role != Qt.DisplayRole:
            return None
        info = entry.info
        return (info.name, info.architecture, f"{info.parameter_count / 1e6:,.0f} M", f"{info.context_length:,}",
                size_text(info.size_on_disk), info.licence or "–",
                "bundled" if entry.builtin else entry.spec)[index.column()]


class ModelDialog(QDialog):
    """Emits ``load_requested(spec, quantization)`` when the user loads a model."""

    load_requested = Signal(str, str)
    fit_shown = Signal()  # the selected model's fit estimate is on screen

    def __init__(self, library: ModelLibrary, quantization: str = "auto", parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.library = library
        self.model = LibraryTableModel(library, self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.quant = QComboBox()
        self.quant.addItems(QUANTIZATIONS)
        self.quant.setCurrentText(quantization)
        self.fit = QLabel("Select a model to see whether it fits.")
        self.fit.setWordWrap(True)
        self.add_file, self.add_folder = QPushButton("Add GGUF file…"), QPushButton("Add model folder…")
        self.remove, self.load = QPushButton("Remove"), QPushButton("Load")
        self.load.setDefault(True)
        details = QFormLayout()
        details.addRow("Quantisation", self.quant)
        details.addRow("Fit", self.fit)
        buttons = QHBoxLayout()
        for button in (self.add_file, self.add_folder, self.remove):
            buttons.addWidget(button)
        buttons.addStretch(1)
        buttons.addWidget(self.load)
        library_page = QWidget()
        layout = QVBoxLayout(library_page)
        layout.addWidget(self.table, 1)
        layout.addLayout(details)
        layout.addLayout(buttons)
        self.discover = DiscoverPage(library, self.quant.currentText, parent=self)
        self.discover.model_added.connect(self._downloaded)
        self.discover.load_requested.connect(self._load_spec)
        self.tabs = QTabWidget()
        self.tabs.addTab(library_page, "Library")
        self.tabs.addTab(self.discover, "Discover")
        self.tabs.setAccessibleName("Model manager pages")
        QVBoxLayout(self).addWidget(self.tabs)
        self._fits: dict[tuple[str, str], object] = {}  # (spec, quantisation) -> FitEstimate or the error
        self._wanted_fit: tuple[str, str] | None = None
        self._fit_ready = _FitReady(self)
        self._fit_ready.done.connect(self._show_fit)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self.update_fit())
        self.quant.currentTextChanged.connect(lambda _: self.update_fit())
        self.quant.currentTextChanged.connect(lambda _: self.discover.refit())
        self.add_file.clicked.connect(self._ask_file)
        self.add_folder.clicked.connect(self._ask_folder)
        self.remove.clicked.connect(self.remove_selected)
        self.load.clicked.connect(self._load)
        self.table.selectRow(0)
        self.resize(1000, 560)

    def selected(self) -> LibraryEntry | None:
        rows = self.table.selectionModel().selectedRows()
        return self.model.entries[rows[0].row()] if rows else None

    def update_fit(self) -> None:
        """Show whether the selected model fits: estimated on a worker thread (it reads file headers and probes
        the device), remembered per model and quantisation while the dialog is open."""
        entry = self.selected()
        self.remove.setEnabled(entry is not None and not entry.builtin)
        if entry is None:
            return
        key = (entry.spec, self.quant.currentText())
        self._wanted_fit = key
        if key in self._fits:
            self._show_fit(key, self._fits[key])
            return
        self.fit.setText("Estimating…")
        QThreadPool.globalInstance().start(lambda: self._fit_ready.done.emit(key, _estimate(*key)))

    def _show_fit(self, key: tuple[str, str], result) -> None:
        self._fits[key] = result
        if key != self._wanted_fit:
            return  # the user has moved on; this answer waits in the cache
        if isinstance(result, Exception):  # whatever the files hold, the user reads why, never nothing
            self.fit.setText(f"Can't be loaded: {_in_words(result)}")
        else:
            verdict = "Fits." if result.fits else "Does not fit in the free memory."
            self.fit.setText(f"{verdict} {result.summary()}")
        self.fit_shown.emit()

    def add(self, spec: str) -> LibraryEntry | None:
        try:
            entry = self.library.add(spec)
        except Exception as exc:  # whatever the files hold, the user reads why, never nothing
            QMessageBox.warning(self, "Can't add this model", _in_words(exc))
            return None
        self.model.refresh()
        self.table.selectRow(next(i for i, e in enumerate(self.model.entries) if e.spec == entry.spec))
        return entry

    def remove_selected(self) -> None:
        entry = self.selected()
        if entry is not None and not entry.builtin:
            try:
                self.library.remove(entry.name)
            except Exception as exc:
                QMessageBox.warning(self, "Can't remove this model", _in_words(exc))
                return
            self.model.refresh()
            self.table.selectRow(0)

    def _ask_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Add a GGUF model", "", "GGUF models (*.gguf)")
        if path:
            self.add(path)

    def _ask_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Add a Hugging Face model folder")
        if path:
            self.add(path)

    def _load(self) -> None:
        entry = self.selected()
        if entry is not None:
            self._load_spec(entry.spec)

    def _load_spec(self, spec: str) -> None:
        self.load_requested.emit(spec, self.quant.currentText())
        self.accept()

    def _downloaded(self, spec: str) -> None:
        """A download from Discover is in the library: show it in the table."""
        self.model.refresh()
        rows = [i for i, e in enumerate(self.model.entries) if e.spec == spec]
        if rows:
            self.table.selectRow(rows[0])

    def done(self, result: int) -> None:
        """Closing the manager stops a download under way; what arrived stays, and Download continues it."""
        self.discover.cancel_download()
        super().done(result)


class _FitReady(QObject):
    """Carries a finished estimate from the worker thread to the dialog (a queued signal)."""

    done = Signal(object, object)  # (spec, quantisation), FitEstimate or the exception


def _estimate(spec: str, quantization: str):
    try:
        return estimate_fit(EngineConfig(model=spec, quantization=quantization))
    except Exception as exc:  # shown in words by the dialog
        return exc


def _in_words(exc: Exception) -> str:
    """The engine's own errors are already sentences; anything else also names its kind."""
    if isinstance(exc, EngineError):
        return str(exc)
    log.exception("unexpected error from the model library")
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
