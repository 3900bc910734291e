"""A real MCP server for the tests, run over stdio: ``python -m tests.helpers.mcp_server`` (or over streamable
HTTP: ``... http PORT``).

Tools: ``add`` (a sum), ``slow`` (answers after a minute: longer than any test's timeout), ``broken`` (raises),
``picture`` (an image and a line of text)."""

from __future__ import annotations

import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.types import Image

server = MCPServer("test-tools")

PNG_1PX = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6300010000000500010d0a2db40000000049454e44ae426082")


@server.tool()
def add(a: int, b: int) -> str:
    """Add two whole numbers."""
    return str(a + b)


@server.tool()
def slow() -> str:
    """Answer after a minute."""
    time.sleep(60)
    return "finally"


@server.tool()
def broken() -> str:
    """Always fail."""
    raise ToolError("the tool broke")


@server.tool()
def picture() -> list:
    """An image and a caption."""
    return [Image(data=PNG_1PX, format="png"), "a red dot"]


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["http"]:  # streamable HTTP on 127.0.0.1 at the port given, path /mcp
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
