"""Adding and editing remote servers: the server list and the add/edit dialog with its connection test."""

from __future__ import annotations

import asyncio
import html

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QMessageBox,
    QPushButton,
    QVBoxLayout,
)

from engine.remote import RemoteClient, RemoteConfig, RemoteError

from ..data.remote_store import RemoteServer, RemoteStoreError
from ..engines.remote_engines import RemoteEngines
from ..theme import CAUTION, ERROR, SUCCESS

ServerIdRole = Qt.UserRole + 2
TEST_TIMEOUT_S = 10.0
STATUS_COLOURS = {"error": ERROR, "warning": CAUTION, "success": SUCCESS}


class RemoteServerListModel(QAbstractListModel):
    """The servers as rows: 'name — address' and what is known of their models; follows the engines' signals."""

    def __init__(self, engines: RemoteEngines, parent=None) -> None:
        super().__init__(parent)
        self.engines = engines
        self.servers: list[RemoteServer] = engines.servers()
        engines.servers_changed.connect(self._reset)
        engines.models_changed.connect(self._models_changed)

    def rowCount(self, parent: QModelIndex = QModelIndex()) -> int:  # noqa: B008 - Qt's signature
        return 0 if parent.isValid() else len(self.servers)

    def data(self, index: QModelIndex, role: int = Qt.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.servers):
            return None
        server = self.servers[index.row()]
        if role == Qt.DisplayRole:
            return f"{server.name} — {server.base_url}\n    {self._status(server)}"
        if role == Qt.ToolTipRole:
            return self.engines.model_errors.get(server.id, server.base_url)
        if role == ServerIdRole:
            return server.id
        return None

    def _status(self, server: RemoteServer) -> str:
        if server.id in self.engines.model_errors:
            return "unreachable: " + self.engines.model_errors[server.id]
        models = self.engines.models.get(server.id)
        if models is None:
            return "connecting…"
        names = ", ".join(m.id for m in models[:4]) + (", …" if len(models) > 4 else "")
        return f"{len(models)} model{'s' if len(models) != 1 else ''}: {names}" if models else "serves no model"

    def _reset(self) -> None:
        self.beginResetModel()
        self.servers = self.engines.servers()
        self.endResetModel()

    def _models_changed(self, server_id: str) -> None:
        row = next((i for i, s in enumerate(self.servers) if s.id == server_id), None)
        if row is not None:
            self.dataChanged.emit(self.index(row), self.index(row))


class ServerDialog(QDialog):
    """Add or edit one server: a name, its address and its API key, with a connection test; the key's place
    (system keyring, or the settings file where there is none) is said before anything is saved."""

    def __init__(self, engines: RemoteEngines, server: RemoteServer | None = None, parent=None) -> None:
        super().__init__(parent)
        self.engines, self.server = engines, server
        self.saved: RemoteServer | None = None
        self.test_task: asyncio.Task | None = None
        self.setWindowTitle("Edit remote server" if server else "Add a remote server")
        self.setMinimumWidth(520)
        self.name = QLineEdit(server.name if server else "")
        self.name.setPlaceholderText("e.g. Lab GPU box")
        self.url = QLineEdit(server.base_url if server else "")
        self.url.setPlaceholderText("http://localhost:8000  (vLLM, SGLang, llama-server, Ollama, Kvasir)")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.Password)
        self.key.setPlaceholderText(self._key_placeholder())
        self.where = QLabel(engines.store.key_storage().description)
        self.where.setWordWrap(True)
        self.where.setObjectName("keyStorage")
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.RichText)
        self.test_button = QPushButton("Test connection")
        self.test_button.clicked.connect(self.test_connection)
        form = QFormLayout()
        form.addRow("Name", self.name)
        form.addRow("Address", self.url)
        form.addRow("API key", self.key)
        buttons = QDialogButtonBox(QDialogButtonBox.Save | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        row = QHBoxLayout()
        row.addWidget(self.test_button)
        row.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.where)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addStretch(1)
        layout.addWidget(buttons)
        self.url.textChanged.connect(self._warn_plain_http)
        self.key.textChanged.connect(self._warn_plain_http)

    def _key_placeholder(self) -> str:
        if self.server is None:
            return "optional; servers without one leave it empty"
        if self.server.key_in == "none":
            return "none set; type one to add it"
        return "kept; type a new one to replace it"

    def _warn_plain_http(self) -> None:
        """A key sent over plain http to another machine can be read on the way: say so, don't refuse."""
        try:
            config = RemoteConfig(self.url.text())
        except ValueError:
            return
        has_key = bool(self.key.text().strip()) or (self.server is not None and self.server.key_in != "none")
        if has_key and config.base_url.startswith("http://") and not config.is_local:
            self._say("This address is plain http: the API key travels unencrypted to that machine. Use "
                      "https:// where the server offers it.", "warning")
        elif self.status.property("kind") == "warning":
            self._say("")

    def _say(self, text: str, kind: str = "") -> None:
        """Show ``text`` below the form; ``kind`` ("error", "warning", "success" or "") picks its colour."""
        shown = html.escape(text)
        color = STATUS_COLOURS.get(kind)
        self.status.setText(f'<span style="color:{color};">{shown}</span>' if color and text else shown)
        self.status.setProperty("kind", kind)

    def test_connection(self) -> asyncio.Task | None:
        """List the server's models with what is typed now (nothing is saved); the result shows below."""
        try:
            RemoteConfig(self.url.text())
        except ValueError as exc:
            self._say(f"Not a usable address: {exc}", "error")
            return None
        self.test_button.setEnabled(False)
        self._say("Connecting…")
        self.test_task = asyncio.ensure_future(self._test(self.url.text(), self.key.text().strip()))
        return self.test_task

    async def _test(self, url: str, typed_key: str) -> None:
        saved = self.server is not None and not typed_key
        key = await asyncio.to_thread(self.engines.store.api_key, self.server.id) if saved else typed_key or None
        config = RemoteConfig(url, api_key=key, connect_retries=0, connect_timeout_s=TEST_TIMEOUT_S,
                              read_timeout_s=TEST_TIMEOUT_S)
        client = RemoteClient(config)
        try:
            models = await client.models()
            metrics = await client.server_metrics()
        except RemoteError as exc:
            self._say(f"Could not use this server: {exc}", "error")
            return
        finally:
            await client.aclose()
            self.test_button.setEnabled(True)
        names = ", ".join(m.id for m in models) or "no model"
        reported = f"its metrics come from {metrics.server_kind}" if metrics.reported else \
            "it reports no KV-cache metrics"
        self._say(f"Connected: {len(models)} model{'s' if len(models) != 1 else ''} ({names}); {reported}.",
                  "success")

    def accept(self) -> None:
        """Save, or say what is wrong and stay open (nothing typed is lost)."""
        try:
            self.saved = self.engines.save_server(self.name.text(), self.url.text(), self.key.text(),
                                                  self.server.id if self.server else None,
                                                  keep_key=self.server is not None and not self.key.text().strip())
        except RemoteStoreError as exc:
            self._say(f"Not saved: {exc}", "error")
            return
        super().accept()


class RemoteServersDialog(QDialog):
    """The servers the user added, with add, edit, remove and refresh."""

    def __init__(self, engines: RemoteEngines, parent=None) -> None:
        super().__init__(parent)
        self.engines = engines
        self.setWindowTitle("Remote servers")
        self.resize(620, 380)
        self.model = RemoteServerListModel(engines, self)
        self.view = QListView()
        self.view.setModel(self.model)
        self.view.setAlternatingRowColors(True)
        self.view.setWordWrap(True)
        intro = QLabel("Chats can run on an OpenAI-compatible server instead of this computer: vLLM, SGLang, "
                       "llama.cpp's llama-server, Ollama or another Kvasir. Add a server here, then pick one of "
                       "its models in the model bar; each chat remembers where it runs.")
        intro.setWordWrap(True)
        self.empty = QLabel(f"The server list could not be read: {engines.store.load_error}"
                            if engines.store.load_error else "No server yet.")
        self.empty.setWordWrap(True)
        buttons = QHBoxLayout()
        self.add_button, self.edit_button = QPushButton("Add…"), QPushButton("Edit…")
        self.remove_button, self.refresh_button = QPushButton("Remove"), QPushButton("Refresh")
        for button in (self.add_button, self.edit_button, self.remove_button, self.refresh_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        close = QDialogButtonBox(QDialogButtonBox.Close)
        close.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(intro)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.empty)
        layout.addLayout(buttons)
        layout.addWidget(close)
        self.add_button.clicked.connect(lambda: self.edit(None))
        self.edit_button.clicked.connect(lambda: self.edit(self.selected()))
        self.remove_button.clicked.connect(self.remove_selected)
        self.refresh_button.clicked.connect(engines.refresh_all)
        self.view.doubleClicked.connect(lambda _: self.edit(self.selected()))
        self.model.modelReset.connect(self._update_buttons)
        self.view.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        self._update_buttons()

    def selected(self) -> RemoteServer | None:
        rows = self.view.selectionModel().selectedRows()
        return self.engines.server(rows[0].data(ServerIdRole)) if rows else None

    def edit(self, server: RemoteServer | None) -> ServerDialog:
        """Open the add (``server`` None) or edit dialog."""
        dialog = ServerDialog(self.engines, server, self)
        dialog.open()
        return dialog

    def remove_selected(self) -> None:
        server = self.selected()
        if server is None:
            return
        answer = QMessageBox.question(self, "Remove the server?",
                                      f"Remove “{server.name}” and its API key? Chats that ran on it keep their "
                                      "messages; to go on with one, pick another model in the model bar.")
        if answer == QMessageBox.Yes:
            self.engines.remove_server(server.id)

    def _update_buttons(self) -> None:
        chosen = bool(self.view.selectionModel().selectedRows())
        self.edit_button.setEnabled(chosen)
        self.remove_button.setEnabled(chosen)
        self.empty.setVisible(self.model.rowCount() == 0)
