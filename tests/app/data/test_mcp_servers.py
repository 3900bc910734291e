"""MCP servers in settings.json: the valid ones kept (a duplicate name dropped), anything else ignored, and the
tool-call timeout checked; the dialog's NAME=value lines read or refused by line."""

import json

import pytest

from app.data.mcp_servers import McpServer, parse_pairs, servers_of, tool_timeout_s
from app.data.settings import Settings


def test_valid_servers_are_kept_and_bad_ones_dropped(tmp_path):
    good = McpServer("files", command="npx", args=("-y", "server"), env={"K": "v"})
    web = McpServer("web", "http", url="https://example.org/mcp", headers={"A": "b"}, enabled=False)
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"mcp_servers": [
        good.to_dict(), web.to_dict(), {"name": "FILES", "command": "again"}, {"name": "no command"},
        {"name": "bad args", "command": "x", "args": "not a list"}, {"name": "x", "transport": "carrier pigeon"},
        {"name": "ftp", "transport": "http", "url": "ftp://x"}, {"name": "env", "command": "x", "env": {"A": 1}},
        "junk", 42], "tool_timeout_s": 12}))
    settings = Settings(path)
    assert servers_of(settings) == [good, web]
    assert tool_timeout_s(settings) == 12.0


@pytest.mark.parametrize("timeout", [0, -1, "30", True, 10_000])
def test_a_bad_timeout_falls_back_to_the_default(tmp_path, timeout):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"tool_timeout_s": timeout, "mcp_servers": "not a list"}))
    settings = Settings(path)
    assert tool_timeout_s(settings) == 30.0 and servers_of(settings) == []


def test_pairs_are_read_line_by_line():
    assert parse_pairs("A=1\n\n B = two=2 \n", "=", "Environment") == {"A": "1", "B": "two=2"}
    with pytest.raises(ValueError, match="Headers, line 2: write it as NAME:value"):
        parse_pairs("X: y\nno separator", ":", "Headers")
