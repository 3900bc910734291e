"""Preferences' MCP servers: the list (each with its status in words), Add / Edit / Remove, and how long a tool
call may take. One server is edited in :class:`McpServerDialog`."""

from __future__ import annotations

import shlex

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
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
)

from ..data.mcp_servers import (
    DEFAULT_TOOL_TIMEOUT_S,
    MAX_TOOL_TIMEOUT_S,
    McpServer,
    pairs_text,
    parse_pairs,
    valid_servers,
)
from ..mcp.toolbox import McpToolbox

TRANSPORT_CHOICES = (("stdio", "A program on this computer (stdio)"), ("http", "A server at a URL (streamable HTTP)"))


class McpServersForm(QGroupBox):
    """The servers in ``values["mcp_servers"]`` with their statuses as ``tools`` reports them."""

    def __init__(self, values: dict, tools: McpToolbox | None = None, parent=None) -> None:
        super().__init__("MCP servers (tools for the model)", parent)
        self.servers = [McpServer.from_dict(s) for s in valid_servers(values.get("mcp_servers", []))]
        self.statuses = dict(tools.statuses) if tools is not None else {}
        self.list = QListWidget()
        self.list.setAccessibleName("MCP servers")
        self.list.setMaximumHeight(110)
        self.add_button, self.edit_button, self.remove_button = (QPushButton(t) for t in ("Add…", "Edit…", "Remove"))
        self.add_button.clicked.connect(lambda: self._edit(None))
        self.edit_button.clicked.connect(lambda: self._edit(self.list.currentRow()))
        self.remove_button.clicked.connect(self._remove)
        self.list.itemDoubleClicked.connect(lambda _item: self._edit(self.list.currentRow()))
        self.list.currentRowChanged.connect(lambda _row: self._enable_buttons())
        self.timeout = QDoubleSpinBox(minimum=0.5, maximum=MAX_TOOL_TIMEOUT_S, decimals=1, suffix=" s")
        self.timeout.setValue(float(values.get("tool_timeout_s", DEFAULT_TOOL_TIMEOUT_S)))
        self.timeout.setToolTip("A tool call that has not answered after this long ends, and the model is told so")
        buttons = QHBoxLayout()
        for button in (self.add_button, self.edit_button, self.remove_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        note = QLabel("A chat offers these tools to its model when its “Use tools” switch is on; you are asked "
                      "before each call runs.")
        note.setWordWrap(True)
        form = QFormLayout(self)
        form.addRow(note)
        form.addRow(self.list)
        form.addRow(buttons)
        form.addRow("Tool calls time out after", self.timeout)
        self._show()
        if tools is not None:
            tools.status_changed.connect(self.set_status)

    def values(self) -> dict:
        return {"mcp_servers": [s.to_dict() for s in self.servers], "tool_timeout_s": self.timeout.value()}

    def set_status(self, name: str, status: str) -> None:
        self.statuses[name] = status
        self._show()

    def _show(self) -> None:
        row = self.list.currentRow()
        self.list.clear()
        for server in self.servers:
            item = QListWidgetItem(f"{server.name} — {self._status(server)}")
            item.setToolTip(_where(server))
            self.list.addItem(item)
        self.list.setCurrentRow(min(row, self.list.count() - 1))
        self._enable_buttons()

    def _status(self, server: McpServer) -> str:
        if not server.enabled:
            return "disabled"
        return self.statuses.get(server.name, "connects when you press OK")

    def _enable_buttons(self) -> None:
        chosen = 0 <= self.list.currentRow() < len(self.servers)
        self.edit_button.setEnabled(chosen)
        self.remove_button.setEnabled(chosen)

    def _edit(self, row: int | None) -> None:
        editing = self.servers[row] if row is not None and 0 <= row < len(self.servers) else None
        dialog = McpServerDialog(editing, [s.name for s in self.servers if s is not editing], self)
        if dialog.exec() and dialog.server is not None:
            if editing is None:
                self.servers.append(dialog.server)
            else:
                self.servers[row] = dialog.server
            self.statuses.pop(dialog.server.name, None)  # changed: its status is known again after OK
            self._show()

    def _remove(self) -> None:
        row = self.list.currentRow()
        if 0 <= row < len(self.servers):
            del self.servers[row]
            self._show()


def _where(server: McpServer) -> str:
    if server.transport == "http":
        return server.url
    return shlex.join([server.command, *server.args])


class McpServerDialog(QDialog):
    """One server's settings; :attr:`server` is the result once accepted (a bad field is explained, and the
    dialog stays open with what was typed)."""

    def __init__(self, server: McpServer | None, other_names: list[str], parent=None) -> None:
        super().__init__(parent)
        self.setWindowTitle("MCP server")
        self.server: McpServer | None = None
        self.other_names = {n.casefold() for n in other_names}
        server = server or McpServer("New server", command="command")
        self.name = QLineEdit(server.name)
        self.transport = QComboBox()
        for value, text in TRANSPORT_CHOICES:
            self.transport.addItem(text, value)
        self.transport.setCurrentIndex(max(0, self.transport.findData(server.transport)))
        self.command = QLineEdit(shlex.join([server.command, *server.args]) if server.command else "")
        self.command.setPlaceholderText("npx -y @modelcontextprotocol/server-filesystem ~/Documents")
        self.env = _text_box(pairs_text(server.env, "="), "NAME=value, one a line")
        self.url = QLineEdit(server.url)
        self.url.setPlaceholderText("http://127.0.0.1:8000/mcp")
        self.headers = _text_box(pairs_text(server.headers, ": "), "Name: value, one a line")
        self.enabled = QCheckBox("Offer this server's tools to chats")
        self.enabled.setChecked(server.enabled)
        self.form = QFormLayout()
        self.form.addRow("Name", self.name)
        self.form.addRow("Kind", self.transport)
        self.form.addRow("Command", self.command)
        self.form.addRow("Environment", self.env)
        self.form.addRow("URL", self.url)
        self.form.addRow("Headers", self.headers)
        self.form.addRow(self.enabled)
        buttons = QDialogButtonBox(QDialogButtonBox.Ok | QDialogButtonBox.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(self.form)
        layout.addWidget(buttons)
        self.transport.currentIndexChanged.connect(lambda _i: self._show_fields())
        self._show_fields()

    def _show_fields(self) -> None:
        stdio = self.transport.currentData() == "stdio"
        for field, shown in ((self.command, stdio), (self.env, stdio), (self.url, not stdio),
                             (self.headers, not stdio)):
            self.form.setRowVisible(field, shown)

    def built(self) -> McpServer:
        """The server as typed; a ValueError says what is wrong."""
        name = self.name.text().strip()
        if name.casefold() in self.other_names:
            raise ValueError(f"there is already a server named {name}")
        stdio = self.transport.currentData() == "stdio"
        try:
            words = shlex.split(self.command.text()) if stdio else []
        except ValueError as exc:
            raise ValueError(f"the command can't be read: {exc}") from None
        return McpServer(name, self.transport.currentData(), words[0] if words else "", tuple(words[1:]),
                         parse_pairs(self.env.toPlainText(), "=", "Environment") if stdio else {},
                         "" if stdio else self.url.text().strip(),
                         {} if stdio else parse_pairs(self.headers.toPlainText(), ":", "Headers"),
                         self.enabled.isChecked())

    def accept(self) -> None:
        try:
            self.server = self.built()
        except ValueError as exc:
            text = str(exc)
            QMessageBox.warning(self, "MCP server not valid", f"{text[:1].upper()}{text[1:]}.")
            return
        super().accept()


def _text_box(text: str, placeholder: str) -> QPlainTextEdit:
    box = QPlainTextEdit(text)
    box.setPlaceholderText(placeholder)
    box.setTabChangesFocus(True)
    box.setMaximumHeight(70)
    box.setLineWrapMode(QPlainTextEdit.NoWrap)
    return box
