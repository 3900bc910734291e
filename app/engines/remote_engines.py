"""Remote servers as the window uses them: their models, their replies and their live metrics.

A conversation that runs on a remote server says so in its settings (``settings["remote"] =
{"server": id, "model": name}``, read by :func:`app.data.remote_store.choice_of`; absent: the local engine), so
switching chats switches engines, and a new chat made like another runs where that one runs. Everything
network-bound runs on the qasync loop with httpx's async client; nothing here waits on the GUI thread, so a
dead server never hangs the window. Keyring reads run on a worker thread (a keyring may ask to be unlocked).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from PySide6.QtCore import QObject, QTimer, Signal

from engine import Chat, RequestOutput, SamplingParams
from engine.remote import RemoteClient, RemoteError, RemoteModel, ServerMetrics
from engine.remote.client import ToolChoice, new_request_id
from engine.remote.metrics import HitRateWindow

from ..data.remote_store import RemoteChoice, RemoteServer, RemoteServerStore

METRICS_INTERVAL_MS = 1000


class RemoteEngines(QObject):
    """The servers of a :class:`RemoteServerStore` with a client each (made when first used).

    Signals: ``servers_changed()`` (added, edited, removed), ``models_changed(server id)`` (its model list was
    fetched, or fetching it failed: :attr:`model_errors` says why), ``metrics_updated(server id, ServerMetrics)``
    for the server being watched."""

    servers_changed = Signal()
    models_changed = Signal(str)
    metrics_updated = Signal(str, object)

    def __init__(self, store: RemoteServerStore, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.models: dict[str, list[RemoteModel]] = {}
        self.model_errors: dict[str, str] = {}
        self.metrics: dict[str, ServerMetrics] = {}
        self.watched: str | None = None
        self._clients: dict[str, RemoteClient] = {}
        self._windows: dict[str, HitRateWindow] = {}
        self._tasks: set[asyncio.Task] = set()
        self._scraping = False
        self._timer = QTimer(self)
        self._timer.setInterval(METRICS_INTERVAL_MS)
        self._timer.timeout.connect(self._scrape_watched)

    # -- servers --------------------------------------------------------------------------------------

    def servers(self) -> list[RemoteServer]:
        return self.store.servers()

    def server(self, server_id: str) -> RemoteServer | None:
        try:
            return self.store.get(server_id)
        except KeyError:
            return None

    def save_server(self, name: str, base_url: str, api_key: str | None, server_id: str | None = None,
                    keep_key: bool = False) -> RemoteServer:
        """Add or change a server (RemoteStoreError says why not), then fetch its models."""
        server = self.store.save(name, base_url, api_key, server_id, keep_key)
        self._drop_client(server.id)
        self.servers_changed.emit()
        self.refresh_models(server.id)
        return server

    def remove_server(self, server_id: str) -> None:
        """Forget a server; chats that ran on it say so when next used."""
        self.store.remove(server_id)
        self._drop_client(server_id)
        self.models.pop(server_id, None)
        self.model_errors.pop(server_id, None)
        self.servers_changed.emit()

    def label(self, choice: RemoteChoice) -> str:
        """'server name · model', the way the model bar and the replies name a remote model."""
        server = self.server(choice.server_id)
        return f"{server.name if server else 'removed server'} · {choice.model}"

    # -- models ---------------------------------------------------------------------------------------

    def refresh_all(self) -> None:
        """Fetch every server's model list in the background."""
        for server in self.servers():
            self.refresh_models(server.id)

    def refresh_models(self, server_id: str) -> asyncio.Task:
        """Fetch one server's model list in the background; ``models_changed`` says when it is known."""
        return self._spawn(self._refresh(server_id))

    async def _refresh(self, server_id: str) -> None:
        try:
            client = await self.client(server_id)
            models = await client.models()
        except RemoteError as exc:
            self.model_errors[server_id] = str(exc)
            self.models.pop(server_id, None)
        else:
            self.models[server_id] = models
            self.model_errors.pop(server_id, None)
        self.models_changed.emit(server_id)

    async def client(self, server_id: str) -> RemoteClient:
        """The server's client, made the first time (its key read from the keyring on a worker thread)."""
        if server_id not in self._clients:
            if self.server(server_id) is None:
                raise RemoteError("the server was removed")
            config = await asyncio.to_thread(self.store.config, server_id)
            if server_id not in self._clients:  # another caller may have made it meanwhile
                self._clients[server_id] = RemoteClient(config)
        return self._clients[server_id]

    # -- replies --------------------------------------------------------------------------------------

    def stream(self, choice: RemoteChoice, chat: Chat, sampling: SamplingParams,
               tool_choice: ToolChoice = None) -> RemoteReply:
        """A reply to ``chat`` (its messages and tools, which ``tool_choice`` may hold the reply to) from
        ``choice``'s server; raises RemoteError when that server is no longer set up."""
        server = self.server(choice.server_id)
        if server is None:
            raise RemoteError("this chat ran on a remote server that has been removed; pick a model in the "
                              "model bar to go on")
        return RemoteReply(self, choice, chat, sampling, tool_choice)

    # -- live metrics ---------------------------------------------------------------------------------

    def watch(self, server_id: str | None) -> None:
        """Poll this server's ``/metrics`` about once a second (None: stop polling)."""
        self.watched = server_id
        if server_id is None or self.server(server_id) is None:
            self._timer.stop()
            return
        if not self._timer.isActive():
            self._timer.start()
        self._scrape_watched()

    def _scrape_watched(self) -> None:
        if self.watched is not None and not self._scraping:
            self._scraping = True  # one scrape at a time: a slow server is not asked again before it answers
            self._spawn(self._scrape(self.watched))

    async def _scrape(self, server_id: str) -> None:
        try:
            client = await self.client(server_id)
            metrics = await client.server_metrics()
            metrics = self._windows.setdefault(server_id, HitRateWindow()).apply(metrics)
        except RemoteError as exc:
            metrics = ServerMetrics.not_reported(f"unreachable: {exc}")
        finally:
            self._scraping = False
        self.metrics[server_id] = metrics
        if server_id == self.watched:
            self.metrics_updated.emit(server_id, metrics)

    # -- lifetime -------------------------------------------------------------------------------------

    def _spawn(self, coroutine) -> asyncio.Task:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _drop_client(self, server_id: str) -> None:
        client = self._clients.pop(server_id, None)
        self._windows.pop(server_id, None)
        if client is not None:
            self._spawn(client.aclose())

    def shutdown(self) -> None:
        """Stop polling and background requests (the window is closing)."""
        self._timer.stop()
        for task in list(self._tasks):
            task.cancel()


class RemoteReply:
    """A reply being written by a remote server, shaped like the local engine's (a ``ReplyStream``): its
    ``request_id`` at once, its outputs with ``async for``; leaving the loop closes the connection."""

    def __init__(self, engines: RemoteEngines, choice: RemoteChoice, chat: Chat, sampling: SamplingParams,
                 tool_choice: ToolChoice = None) -> None:
        self.engines, self.choice, self.chat, self.sampling, self.tool_choice = (
            engines, choice, chat, sampling, tool_choice)
        self.request_id = new_request_id()

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._run()

    async def _run(self) -> AsyncIterator[RequestOutput]:
        client = await self.engines.client(self.choice.server_id)
        async for out in client.stream_chat(self.chat, self.sampling, self.choice.model, self.request_id,
                                            self.tool_choice):
            yield out
