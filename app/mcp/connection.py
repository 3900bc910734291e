"""One MCP server's session, kept open in a task of its own on the app's asyncio loop (the SDK's transports
must be opened and closed in the same task). No Qt in here."""

from __future__ import annotations

import asyncio
import os
from contextlib import AsyncExitStack

import httpx2
from mcp import ClientSession, StdioServerParameters, types
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from ..data.mcp_servers import CONNECT_TIMEOUT_S, McpServer
from .results import ToolOutcome, outcome_of


class McpConnection:
    """A live session with ``server``: :meth:`open` it, list its tools, call them, :meth:`close` it."""

    def __init__(self, server: McpServer) -> None:
        self.server = server
        self.tools: list = []  # the MCP Tools it listed
        self._session: ClientSession | None = None
        self._ready: asyncio.Future | None = None
        self._closing = asyncio.Event()
        self._task: asyncio.Task | None = None

    async def open(self, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
        """Start or reach the server and list its tools; raises ConnectionError saying why that failed."""
        self._ready = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._hold())
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)
        except TimeoutError:
            await self.close()
            if self._ready.done():
                self._ready.exception()  # read: the time it took is the reason given, not the cancellation's
            raise ConnectionError(f"{self.server.name} did not answer within {timeout_s:g} s") from None

    async def call(self, tool: str, arguments: dict, timeout_s: float) -> ToolOutcome:
        """Call ``tool``; whatever happens, an outcome: the result as text, or why the call failed."""
        if self._session is None:
            return ToolOutcome.failed(f"{self.server.name} is not connected")
        try:
            result = await asyncio.wait_for(self._session.call_tool(tool, arguments), timeout_s)
        except TimeoutError:
            return ToolOutcome.failed(f"the tool did not answer within {timeout_s:g} s")
        except Exception as exc:  # the server or its transport failed: the call ends, the reply goes on
            return ToolOutcome.failed(f"the call failed: {_reason(exc)}")
        return outcome_of(result)

    def stop(self) -> None:
        """Ask the session to end, without waiting for it (the loop ends it when it next runs)."""
        self._closing.set()

    async def close(self) -> None:
        """End the session (a stdio server's program is stopped), or stop connecting."""
        self.stop()
        if self._task is not None and self._ready is not None and not self._ready.done():
            self._task.cancel()  # still connecting: it would not see the request to stop
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self._session = None

    async def _hold(self) -> None:
        """Open the transport and the session, list the tools, then wait for :meth:`close` in this task."""
        try:
            async with AsyncExitStack() as stack:
                read, write = await stack.enter_async_context(_transport(self.server, stack))
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                self.tools = await _all_tools(session)
                self._session = session
                self._ready.set_result(None)
                await self._closing.wait()
        except BaseException as exc:  # noqa: BLE001 - any failure to connect is the user's to read
            self._session = None
            if not self._ready.done():
                self._ready.set_exception(ConnectionError(_reason(exc)))
            if isinstance(exc, asyncio.CancelledError):
                raise


MAX_TOOL_PAGES = 100  # a server that keeps answering "there is more" is not listened to for ever


async def _all_tools(session: ClientSession) -> list:
    """Every tool the server lists, page after page."""
    page = await session.list_tools()
    tools = list(page.tools)
    for _ in range(MAX_TOOL_PAGES):
        if not page.next_cursor:
            break
        page = await session.list_tools(params=types.PaginatedRequestParams(cursor=page.next_cursor))
        tools += page.tools
    return tools


def _transport(server: McpServer, stack: AsyncExitStack):
    """The SDK's client transport for ``server``."""
    if server.transport == "stdio":
        errors = stack.enter_context(open(os.devnull, "w"))  # the server's log is not the app's to show
        return stdio_client(StdioServerParameters(command=server.command, args=list(server.args),
                                                  env=dict(server.env) or None), errlog=errors)
    client = httpx2.AsyncClient(headers=dict(server.headers)) if server.headers else None
    if client is not None:
        stack.push_async_callback(client.aclose)  # after the transport, which does not close a client it was given
    return streamable_http_client(server.url, http_client=client)


def _reason(exc: BaseException) -> str:
    """The first real reason inside an exception (task groups wrap theirs in groups)."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup's
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__
