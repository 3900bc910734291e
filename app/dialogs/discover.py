"""Discover: the model manager's page for finding models on the Hugging Face Hub and downloading them.

Search, pick a repository, see each file's quantisation, size and whether it fits on this machine (estimated
from remote headers, before anything is downloaded), download with progress, cancel, resume, load. All network
work runs on worker threads; their answers come back as queued signals, and an answer to a question the user
has since replaced (another search, another repository) is dropped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from PySide6.QtCore import QAbstractTableModel, QEvent, QModelIndex, QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from engine import (
    DownloadCancelled,
    DownloadProgress,
    HubDownload,
    HubFit,
    HubModel,
    HubOption,
    HubRepo,
    ModelLibrary,
    fit_hub_options,
    hub_repo_options,
    search_hub,
)

from ..units import size_text

FORMAT_CHOICES = (("GGUF and safetensors", None), ("GGUF only", "gguf"), ("safetensors only", "safetensors"))
PATIENCE_S = 30  # then the page says the Hub is not answering (huggingface_hub keeps retrying a while)
RESULT_COLUMNS = ("Model", "Downloads", "Likes", "Updated", "Formats")
FILE_COLUMNS = ("File", "Quantisation", "Size", "Fit on this machine")


def count_in_words(n: int) -> str:
    """A count as the Hub shows it: 812, 12.3k, 4.1M."""
    if n >= 1_000_000:
        return f"{n / 1_000_000:.1f}M"
    return f"{n / 1000:.1f}k" if n >= 10_000 else f"{n:,}"


class HubResultsModel(QAbstractTableModel):
    """Search results as rows."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.models: list[HubModel] = []

    def set_models(self, models: list[HubModel]) -> None:
        self.beginResetModel()
        self.models = list(models)
        self.endResetModel()

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.models)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(RESULT_COLUMNS)

    def headerData(self, section: int, orientation, role: int = Qt.DisplayRole):
        if role == Qt.DisplayRole and orientation == Qt.Horizontal and 0 <= section < len(RESULT_COLUMNS):
            return RESULT_COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.models):
            return None
        model = self.models[index.row()]
        if role == Qt.UserRole:
            return model.repo_id
        if role == Qt.ToolTipRole:
            return model.repo_id + (" (gated: accept its conditions on the Hub first)" if model.gated else "")
        if role != Qt.DisplayRole:
            return None
        updated = model.updated.strftime("%Y-%m-%d") if model.updated else "–"
        return (model.repo_id, count_in_words(model.downloads), count_in_words(model.likes), updated,
                ", ".join(model.formats))[index.column()]


class HubFilesModel(QAbstractTableModel):
    """A repository's options (a GGUF file each, or the safetensors model) with their fit."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.options: list[HubOption] = []
        self.fits: dict[str, HubFit] = {}

    def set_repo(self, repo: HubRepo | None) -> None:
        self.beginResetModel()
        self.options = list(repo.options) if repo else []
        self.fits = {}
        self.endResetModel()

    def set_fits(self, fits: dict[str, HubFit]) -> None:
        """Show the estimates (by option name) in the fit column."""
        self.fits = dict(fits)
        if self.options:
            self.dataChanged.emit(self.index(0, 3), self.index(len(self.options) - 1, 3))

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.options)

    def columnCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(FILE_COLUMNS)

    def headerData(self, section: int, orientation, role: int = Qt.DisplayRole):
        if role == Qt.DisplayRole and orientation == Qt.Horizontal and 0 <= section < len(FILE_COLUMNS):
            return FILE_COLUMNS[section]
        return None

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.options):
            return None
        option = self.options[index.row()]
        if role == Qt.UserRole:
            return option.name
        if role == Qt.ToolTipRole:
            return f"{option.name}: " + (option.problem or self._fit_text(option, long=True))
        if role != Qt.DisplayRole:
            return None
        name = option.name if option.kind == "gguf" else f"safetensors ({len(option.weight_files)} file(s))"
        return (name, option.quantization, size_text(option.size), self._fit_text(option))[index.column()]

    def _fit_text(self, option: HubOption, long: bool = False) -> str:
        if option.problem:
            return "can't be used"
        fit = self.fits.get(option.name)
        if fit is None:
            return "estimating…"
        return fit.explanation() if long else fit.label()


class _Answers(QObject):
    """Carries a worker's answer to the GUI thread (a queued signal): (what, ticket, result or exception)."""

    answered = Signal(str, int, object)
    progressed = Signal(int, object)  # ticket, DownloadProgress


class DiscoverPage(QWidget):
    """Emits ``model_added(spec)`` when a download is in the library, ``load_requested(spec)`` on Load, and
    ``answer_shown(what)`` once a worker's answer ("search", "repo", "fit" or "download") is on the page."""

    model_added = Signal(str)
    load_requested = Signal(str)
    answer_shown = Signal(str)

    def __init__(self, library: ModelLibrary, quantization: Callable[[], str] = lambda: "auto",
                 device: str = "auto", parent=None) -> None:
        super().__init__(parent)
        self.library, self.quantization, self.device = library, quantization, device
        self.repo: HubRepo | None = None
        self.download: HubDownload | None = None
        self._tickets = {"search": 0, "repo": 0, "fit": 0, "download": 0}
        self._answers = _Answers(self)
        self._answers.answered.connect(self._answered)
        self._answers.progressed.connect(self._progressed)
        self._started = (0.0, 0)
        self._build()
        self._connect()
        self._update_buttons()

    # -- layout ---------------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.query = QLineEdit(placeholderText="Search the Hugging Face Hub: qwen, llama, smollm, …")
        self.query.setAccessibleName("Search the Hugging Face Hub")
        self.query.setClearButtonEnabled(True)
        self.format = QComboBox()
        for text, value in FORMAT_CHOICES:
            self.format.addItem(text, value)
        self.format.setAccessibleName("Weight format")
        self.search_button = QPushButton("Search")
        self.search_button.setAccessibleName("Search the Hub")
        self.results_model, self.files_model = HubResultsModel(self), HubFilesModel(self)
        self.results = self._table(self.results_model, "Models found on the Hub")
        self.files = self._table(self.files_model, "Files of the selected model")
        self.details = QLabel("Pick a model, then a file, to see whether it fits before downloading.")
        self.details.setWordWrap(True)
        self.details.setAccessibleName("Details of the selected file")
        self.details.setTextInteractionFlags(Qt.TextSelectableByMouse | Qt.TextSelectableByKeyboard)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("Discover status")
        self.progress = QProgressBar(minimum=0, maximum=1000, textVisible=False)
        self.progress.setAccessibleName("Download progress")
        self.progress.hide()
        self.download_button = QPushButton("Download")
        self.download_button.setAccessibleName("Download the selected file")
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.setAccessibleName("Cancel the download")
        self.load_button = QPushButton("Load")
        self.load_button.setAccessibleName("Load the downloaded model")
        self._lay_out()

    def _table(self, model: QAbstractTableModel, name: str) -> QTableView:
        table = QTableView()
        table.setModel(model)
        table.setAccessibleName(name)
        table.setSelectionBehavior(QAbstractItemView.SelectRows)
        table.setSelectionMode(QAbstractItemView.SingleSelection)
        table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        table.setTabKeyNavigation(False)  # Tab leaves the table, arrows move in it
        table.verticalHeader().hide()
        table.setWordWrap(False)
        table.setTextElideMode(Qt.ElideMiddle)  # owner/name and file names keep both ends; tooltips hold all
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
        table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        return table

    def _lay_out(self) -> None:
        search = QHBoxLayout()
        search.addWidget(self.query, 1)
        search.addWidget(self.format)
        search.addWidget(self.search_button)
        lists = QSplitter(Qt.Horizontal)
        lists.addWidget(self.results)
        lists.addWidget(self.files)
        lists.setSizes([420, 520])
        lists.setChildrenCollapsible(False)
        actions = QHBoxLayout()
        actions.addWidget(self.progress, 1)
        actions.addWidget(self.status, 2)
        for button in (self.download_button, self.cancel_button, self.load_button):
            actions.addWidget(button)
        layout = QVBoxLayout(self)
        layout.addLayout(search)
        layout.addWidget(lists, 1)
        layout.addWidget(self.details)
        layout.addLayout(actions)
        self.setTabOrder(self.query, self.format)
        self.setTabOrder(self.format, self.search_button)
        self.setTabOrder(self.search_button, self.results)
        self.setTabOrder(self.results, self.files)
        self.setTabOrder(self.files, self.download_button)

    def _connect(self) -> None:
        self.query.installEventFilter(self)
        self.search_button.clicked.connect(self.search)
        self.results.selectionModel().selectionChanged.connect(lambda *_: self._repo_selected())
        self.files.selectionModel().selectionChanged.connect(lambda *_: self._option_selected())
        self.download_button.clicked.connect(self.start_download)
        self.cancel_button.clicked.connect(self.cancel_download)
        self.load_button.clicked.connect(self._load)

    def eventFilter(self, watched, event) -> bool:
        """Return in the search box searches, and goes no further: in the model manager it would otherwise
        press the dialog's default button."""
        if watched is self.query and event.type() == QEvent.KeyPress and event.key() in (Qt.Key_Return,
                                                                                          Qt.Key_Enter):
            self.search()
            return True
        return super().eventFilter(watched, event)

    # -- what the user does -----------------------------------------------------------------------------

    def search(self) -> None:
        """Ask the Hub for models matching the search box (on a worker thread)."""
        query, fmt = self.query.text().strip(), self.format.currentData()
        self._say(f"Searching the Hub for “{query}”…" if query else "Listing the most downloaded chat models…")
        ticket = self._run("search", lambda: search_hub(query, fmt))
        QTimer.singleShot(int(PATIENCE_S * 1000), self, lambda: self._still_waiting("search", ticket))

    def selected_option(self) -> HubOption | None:
        rows = self.files.selectionModel().selectedRows()
        return self.files_model.options[rows[0].row()] if rows else None

    def start_download(self) -> None:
        """Download the selected file (continuing what an earlier attempt left) on a worker thread."""
        option = self.selected_option()
        if self.repo is None or option is None or self.download is not None or option.problem:
            return
        repo = self.repo
        ticket = self._tickets["download"] + 1
        download = HubDownload(repo, option, self.library,
                               progress=lambda p: self._emit(self._answers.progressed, ticket, p))
        self.download = download
        kept = download.partial_bytes()
        self._started = (time.monotonic(), kept)
        self.progress.setValue(int(1000 * kept / max(option.size, 1)))
        self.progress.show()
        self._say(f"Resuming {option.name} from {size_text(kept)}…" if kept else f"Downloading {option.name}…")
        self._run("download", download.run)
        self._update_buttons()

    def cancel_download(self) -> None:
        """Stop the download; what arrived is kept, and Download continues from it."""
        if self.download is not None:
            self.download.cancel()
            self._say("Cancelling…")

    def _load(self) -> None:
        spec = self._downloaded_spec(self.selected_option())
        if spec:
            self.load_requested.emit(spec)

    # -- answers ----------------------------------------------------------------------------------------

    def _answered(self, what: str, ticket: int, result) -> None:
        if ticket != self._tickets[what]:
            return  # a question the user has since replaced
        getattr(self, f"_{what}_answered")(result)
        self.answer_shown.emit(what)

    def _search_answered(self, result) -> None:
        if isinstance(result, Exception):
            self._say(str(result))
            return
        self.results_model.set_models(result)
        self.files_model.set_repo(None)
        self.repo = None
        self._tickets["repo"] += 1  # a listing or an estimate still under way belongs to the old results
        self._tickets["fit"] += 1
        self._say(f"{len(result)} models. Pick one to see its files." if result else "No chat model with GGUF or "
                  "safetensors weights matches this search.")
        self._update_buttons()

    def _repo_selected(self) -> None:
        rows = self.results.selectionModel().selectedRows()
        if not rows:
            return
        repo_id = self.results_model.models[rows[0].row()].repo_id
        self.repo = None
        self.files_model.set_repo(None)
        self._tickets["fit"] += 1  # the fit of the previous repository is no longer wanted
        self._say(f"Listing the files of {repo_id}…")
        ticket = self._run("repo", lambda: hub_repo_options(repo_id))
        QTimer.singleShot(int(PATIENCE_S * 1000), self, lambda: self._still_waiting("repo", ticket))
        self._update_buttons()

    def _repo_answered(self, result) -> None:
        if isinstance(result, Exception):
            self._say(str(result))
            return
        self.repo = result
        self.files_model.set_repo(result)
        if not result.options:
            self._say(f"{result.repo_id} has no GGUF or safetensors weights Kvasir can load.")
            return
        self.refit()
        self.files.selectRow(0)

    def refit(self) -> None:
        """Estimate the shown repository's fit again (the quantisation to estimate for has changed)."""
        repo = self.repo
        if repo is None or not repo.options:
            return
        self.files_model.set_fits({})
        self._say(f"{len(repo.options)} option(s) in {repo.repo_id}; estimating the fit from their headers…")
        quantization, device = self.quantization(), self.device
        self._run("fit", lambda: fit_hub_options(repo, quantization, device))
        self._option_selected()

    def _fit_answered(self, result) -> None:
        if isinstance(result, Exception):
            self._say(f"The fit could not be estimated: {result}")
            return
        self.files_model.set_fits(result)
        self._say(f"{len(result)} option(s) in {self.repo.repo_id}." if self.repo else "")
        self._option_selected()

    def _download_answered(self, result) -> None:
        download, self.download = self.download, None
        self.progress.hide()
        if isinstance(result, DownloadCancelled):
            kept = download.partial_bytes() if download else 0
            self._say(f"Cancelled. {size_text(kept)} kept; Download continues from there.")
        elif isinstance(result, Exception):
            self._say(f"{result}. Download again to continue from what arrived.")
        else:
            entry = result
            self._say(f"{entry.name} is in the library. Load it now, or later from the Library tab.")
            self.model_added.emit(entry.spec)
        self._option_selected()

    def _progressed(self, ticket: int, progress: DownloadProgress) -> None:
        if ticket != self._tickets["download"] or self.download is None:
            return
        self.progress.setValue(int(1000 * progress.done / max(progress.total, 1)))
        started, kept = self._started
        elapsed = time.monotonic() - started
        rate = (progress.done - kept) / elapsed if elapsed > 0.5 else 0
        text = f"{size_text(progress.done)} of {size_text(progress.total)}"
        if rate > 0:
            left = (progress.total - progress.done) / rate
            text += f" · {size_text(int(rate))}/s · {_duration(left)} left"
        self._say(text)
        self.progress.setAccessibleDescription(text)

    def _option_selected(self) -> None:
        option = self.selected_option()
        if option is None:
            self._update_buttons()
            return
        if option.problem:
            text = f"{option.name} can't be used: {option.problem}."
        elif self._downloaded_spec(option):
            text = f"{option.name} is downloaded and in the library."
        else:
            fit = self.files_model.fits.get(option.name)
            text = fit.explanation() if fit else "Estimating whether it fits…"
            if kept := self._partial(option):
                text += f" {size_text(kept)} of it is already here; Download continues from there."
        if self.repo and self.repo.licence:
            text += f" Licence: {self.repo.licence}."
        self.details.setText(text)
        self._update_buttons()

    # -- helpers ----------------------------------------------------------------------------------------

    def _run(self, what: str, work: Callable[[], object]) -> int:
        """Run ``work`` on a daemon thread (a dead network may hold it for a while; it never holds the window)."""
        self._tickets[what] += 1
        ticket = self._tickets[what]

        def worker() -> None:
            try:
                result = work()
            except Exception as exc:  # every failure reaches the user in words
                result = exc
            self._emit(self._answers.answered, what, ticket, result)

        threading.Thread(target=worker, name=f"kvasir-hub-{what}", daemon=True).start()
        self._update_buttons()
        return ticket

    @staticmethod
    def _emit(signal, *args) -> None:
        try:
            signal.emit(*args)
        except RuntimeError:
            pass  # the page was closed while the worker ran

    def _still_waiting(self, what: str, ticket: int) -> None:
        if ticket == self._tickets[what] and self.status.text().endswith("…"):
            self._say(f"The Hub has not answered in {PATIENCE_S} s; still trying. Check the network, or search "
                      "again later.")

    def _partial(self, option: HubOption | None) -> int:
        if option is None or self.repo is None or option.problem:
            return 0
        return HubDownload(self.repo, option, self.library).partial_bytes()

    def _downloaded_spec(self, option: HubOption | None) -> str | None:
        """The library spec of ``option`` when it was downloaded (now or before) and is in the library."""
        if option is None or self.repo is None or option.problem:
            return None
        spec = str(HubDownload(self.repo, option, self.library).target.resolve())
        try:
            known = {e.spec for e in self.library.entries()}
        except Exception:  # a damaged library is the Library tab's to report
            return None
        return spec if spec in known else None

    def _say(self, text: str) -> None:
        self.status.setText(text)

    def _update_buttons(self) -> None:
        option = self.selected_option()
        busy = self.download is not None
        usable = option is not None and not option.problem and self.repo is not None
        done = self._downloaded_spec(option) is not None
        self.download_button.setEnabled(usable and not busy and not done)
        self.download_button.setText("Resume" if usable and not done and self._partial(option) else "Download")
        self.cancel_button.setEnabled(busy)
        self.load_button.setEnabled(done and not busy)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
