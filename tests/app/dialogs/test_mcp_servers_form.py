"""Preferences' MCP servers: a server typed into its dialog (bad input explained, the dialog kept open), the list
with each server's status in words, and OK saving them and connecting, after which their tools are offered."""

import sys

import pytest

from app.data.mcp_servers import McpServer
from app.data.settings import Settings
from app.dialogs.mcp_servers_form import McpServerDialog, McpServersForm
from app.dialogs.preferences import PreferencesDialog

pytestmark = pytest.mark.timeout(120)


def test_a_stdio_server_is_read_from_its_fields(qtbot):
    dialog = McpServerDialog(None, ["other"])
    qtbot.addWidget(dialog)
    dialog.name.setText("files")
    dialog.command.setText("npx -y '@mcp/server files' ~/Documents")
    dialog.env.setPlainText("TOKEN=abc\n\nLEVEL = debug")
    dialog.url.setText("http://ignored")
    assert dialog.built() == McpServer("files", "stdio", "npx", ("-y", "@mcp/server files", "~/Documents"),
                                       {"TOKEN": "abc", "LEVEL": "debug"})


def test_an_http_server_is_read_from_its_fields(qtbot):
    dialog = McpServerDialog(None, [])
    qtbot.addWidget(dialog)
    dialog.name.setText("web")
    dialog.transport.setCurrentIndex(dialog.transport.findData("http"))
    dialog.url.setText("https://example.org/mcp")
    dialog.headers.setPlainText("Authorization: Bearer xyz")
    dialog.enabled.setChecked(False)
    assert dialog.built() == McpServer("web", "http", url="https://example.org/mcp",
                                       headers={"Authorization": "Bearer xyz"}, enabled=False)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda d: d.name.setText("Other"), "there is already a server named Other"),
    (lambda d: d.name.setText("  "), "an MCP server needs a name"),
    (lambda d: d.command.setText(""), "x: a stdio server needs a command to start"),
    (lambda d: d.command.setText("run 'unclosed"), "the command can't be read: No closing quotation"),
    (lambda d: d.env.setPlainText("JUSTANAME"), "Environment, line 1: write it as NAME=value"),
    (lambda d: (d.transport.setCurrentIndex(1), d.url.setText("ftp://x")),
     "x: an HTTP server needs a URL starting with http:// or https://"),
])
def test_bad_input_is_explained_and_the_dialog_stays_open(qtbot, monkeypatch, change, reason):
    warnings = []
    monkeypatch.setattr("app.dialogs.mcp_servers_form.QMessageBox.warning",
                        lambda parent, title, text: warnings.append(text))
    dialog = McpServerDialog(McpServer("x", command="run"), ["other"])
    qtbot.addWidget(dialog)
    change(dialog)
    dialog.accept()
    assert warnings == [f"{reason[:1].upper()}{reason[1:]}."] and dialog.server is None


def test_the_list_shows_each_servers_status(qtbot, qloop, session):
    servers = [McpServer("tests", command=sys.executable), McpServer("off", command="x", enabled=False)]
    session.tools.statuses = {"tests": "connected, 4 tools"}
    form = McpServersForm({"mcp_servers": [s.to_dict() for s in servers], "tool_timeout_s": 12.5}, session.tools)
    qtbot.addWidget(form)
    assert [form.list.item(i).text() for i in range(form.list.count())] == [
        "tests — connected, 4 tools", "off — disabled"]
    session.tools.status_changed.emit("tests", "not connected: it stopped")
    assert form.list.item(0).text() == "tests — not connected: it stopped"
    form.list.setCurrentRow(1)
    form.remove_button.click()
    assert form.values() == {"mcp_servers": [servers[0].to_dict()], "tool_timeout_s": 12.5}


def test_ok_saves_the_servers_and_connects_to_them(window, qloop, monkeypatch):
    from tests.app.mcp.test_toolbox import TEST_SERVER

    def add_server(dialog):
        dialog.mcp.servers.append(TEST_SERVER)
        dialog.mcp.timeout.setValue(7)
        return 1

    monkeypatch.setattr(PreferencesDialog, "exec", add_server)
    window.edit_preferences()
    qloop.run_until_complete(window.session.tools_connecting)
    try:
        saved = Settings(window.settings.path)
        assert saved["mcp_servers"] == [TEST_SERVER.to_dict()] and saved["tool_timeout_s"] == 7
        assert window.session.tools.statuses == {"tests": "connected, 4 tools"}
        assert window.session.tools.timeout_s == 7 and window.pane.tools.text() == "Use tools (4)"
        assert window.statusBar().currentMessage() == "MCP server tests: connected, 4 tools"
    finally:
        qloop.run_until_complete(window.session.tools.close())
