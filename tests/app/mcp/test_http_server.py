"""The toolbox over streamable HTTP, against the same real MCP server served by uvicorn on a local port (with a
header sent along, as an API key would be)."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading

import pytest

from app.data.mcp_servers import McpServer
from app.mcp.results import DONE
from app.mcp.toolbox import McpToolbox

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def http_url():
    """The server's URL, once uvicorn says it is listening; the server stops after the test."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tests.helpers.mcp_server", "http", str(port)],
                              stderr=subprocess.PIPE, text=True)
    for line in server.stderr:  # blocks until each log line: the server's own word that it listens
        if "Uvicorn running on" in line:
            break
    threading.Thread(target=server.stderr.read, daemon=True).start()  # its later log must not fill the pipe
    yield f"http://127.0.0.1:{port}/mcp"
    server.terminate()
    server.wait()


def test_tools_are_listed_and_called_over_http(qloop, http_url):
    box = McpToolbox(timeout_s=20)
    qloop.run_until_complete(box.connect([McpServer("web", "http", url=http_url, headers={"X-Client": "kvasir"})]))
    try:
        assert box.statuses == {"web": "connected, 4 tools"}
        outcome = qloop.run_until_complete(box.call("add", '{"a": 20, "b": 22}'))
        assert (outcome.status, outcome.text) == (DONE, "42")
    finally:
        qloop.run_until_complete(box.close())


def test_a_url_where_no_server_listens_says_so(qloop):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # free, and nobody listens once the probe is closed
    box = McpToolbox()
    qloop.run_until_complete(box.connect([McpServer("gone", "http", url=f"http://127.0.0.1:{port}/mcp")]))
    assert box.tools() == [] and box.statuses["gone"].startswith("not connected: ")
