"""The tools of every enabled MCP server, for the chats: connecting, each server's status in words, the tool
list the model is offered, and calls by the offered name."""

from __future__ import annotations

import asyncio
import json

from PySide6.QtCore import QObject, Signal

from ..data.mcp_servers import CONNECT_TIMEOUT_S, DEFAULT_TOOL_TIMEOUT_S, McpServer
from .python_import import python_import
from .results import ToolOutcome
from .tool_names import OfferedTool, offered_tools


class McpToolbox(QObject):
    """Holds a connection per enabled server; :meth:`connect` (again after a change) and :meth:`call`."""

    status_changed = Signal(str, str)  # server name, its status in words
    tools_changed = Signal()

    def __init__(self, timeout_s: float = DEFAULT_TOOL_TIMEOUT_S, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.timeout_s = timeout_s
        self.connect_timeout_s = CONNECT_TIMEOUT_S
        self.statuses: dict[str, str] = {}
        self._connections: dict = {}  # server name -> its McpConnection
        self._offered: dict[str, OfferedTool] = {}
        self._connecting = asyncio.Lock()  # one (re)connection at a time: a second waits for the first, then redoes it

    async def connect(self, servers: list[McpServer]) -> None:
        """Close every connection, then open one to each enabled server of ``servers`` at once."""
        async with self._connecting:
            await self._connect(servers)

    async def _connect(self, servers: list[McpServer]) -> None:
        await self.close()
        self.statuses = {s.name: "disabled" if not s.enabled else "connecting…" for s in servers}
        for name, status in self.statuses.items():
            self.status_changed.emit(name, status)
        await asyncio.gather(*(self._open(s) for s in servers if s.enabled))
        self._offered = {t.name: t for t in offered_tools({n: c.tools for n, c in self._connections.items()})}
        self.tools_changed.emit()

    def tools(self) -> list[dict]:
        """The tools offered to the model, as OpenAI tool definitions."""
        return [tool.to_openai() for tool in self._offered.values()]

    def knows(self, name: str) -> bool:
        return name in self._offered

    async def call(self, name: str, arguments: str) -> ToolOutcome:
        """Call the tool the model named ``name`` with ``arguments`` (JSON text); never raises."""
        tool = self._offered.get(name)
        if tool is None:
            return ToolOutcome.failed(f"there is no tool named {name!r}")
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError as exc:
            return ToolOutcome.failed(f"the arguments are not JSON ({exc})")
        if not isinstance(parsed, dict):
            return ToolOutcome.failed("the arguments must be a JSON object")
        return await self._connections[tool.server].call(tool.tool, parsed, self.timeout_s)

    async def close(self) -> None:
        """Close every connection (their stdio programs stop)."""
        connections, self._connections, self._offered = self._connections, {}, {}
        await asyncio.gather(*(c.close() for c in connections.values()))

    def shutdown(self) -> None:
        """The app is closing: ask every session to end, without waiting (stdio servers also stop when their
        input closes with the app)."""
        for connection in self._connections.values():
            connection.stop()

    async def _open(self, server: McpServer) -> None:
        # the MCP SDK takes a second or more to import: only an app with a server enabled pays for it, on connecting
        with python_import():
            from .connection import McpConnection

        connection = McpConnection(server)
        try:
            await connection.open(self.connect_timeout_s)
        except ConnectionError as exc:
            self._set_status(server.name, f"not connected: {exc}")
            return
        self._connections[server.name] = connection
        count = len(connection.tools)
        self._set_status(server.name, f"connected, {count} tool{'s' if count != 1 else ''}")

    def _set_status(self, name: str, status: str) -> None:
        self.statuses[name] = status
        self.status_changed.emit(name, status)
