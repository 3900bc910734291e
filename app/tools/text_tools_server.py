"""A small MCP server with text tools, run over stdio (``python -m app.tools.text_tools_server``): what
``make screenshots`` connects the app to for its tool-call picture, and a first server to try in Preferences >
MCP servers (command: the app's Python, arguments: ``-m app.tools.text_tools_server``).

Tools: ``count_letter`` (how often a letter occurs in a word: the question small models famously get wrong) and
``word_count``."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("text-tools")


@server.tool()
def count_letter(word: str, letter: str) -> str:
    """How many times a letter occurs in a word (upper and lower case alike)."""
    if len(letter) != 1:
        raise ToolError(f"letter must be one character, not {letter!r}")
    return str(word.lower().count(letter.lower()))


@server.tool()
def word_count(text: str) -> str:
    """The number of words in a text."""
    return str(len(text.split()))


if __name__ == "__main__":
    server.run("stdio")
