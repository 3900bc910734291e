"""The app without its window: the chats and their store, personas, where each chat runs, the reply flow, what
users do to chats, the token counter and the local API.

Built before the window and handed to it (:class:`~app.window.main_window.MainWindow` lays it out and connects its
signals to the views); a test builds one with no window at all and drives it through its public objects.
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject

from engine import ModelLibrary
from engine.routing.evaluation import RouteEvaluation, TaskSet, evaluate, load_saved, save
from engine.routing.router import Router, Routes

from ..data.mcp_servers import servers_of, tool_timeout_s
from ..data.personas import Personas
from ..data.remote_store import RemoteServerStore
from ..data.settings import Settings, idle_unload_s, load_presets, routes_of
from ..data.store import Store
from ..engines.bridge import ChatEngine
from ..engines.local_api import LocalApi
from ..engines.remote_engines import RemoteEngines
from ..engines.token_counter import TokenCounter
from ..mcp.toolbox import McpToolbox
from .chat_controller import ChatController
from .conversation_actions import ConversationActions
from .conversations import Conversations
from .reply_sources import ReplySources


class ChatSession(QObject):
    """One user's chats on one engine: the non-visual layer, every part built here and nowhere else."""

    def __init__(self, store: Store, bridge: ChatEngine, library: ModelLibrary | None = None,
                 settings: Settings | None = None, remote: RemoteEngines | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store, self.bridge = store, bridge
        self.library = library or ModelLibrary()
        self.settings = settings or Settings()
        self.personas = Personas(store, load_presets(), self.settings, self)
        self.conversations = Conversations(store, self)
        self.remote = remote if remote is not None else RemoteEngines(RemoteServerStore(), self)
        bridge.set_idle_unload(idle_unload_s(self.settings))
        evaluated = load_saved()  # rules with min_score read the latest eval-route
        self.router = Router(routes_of(self.settings), evaluated.scores() if evaluated else None)
        self.sources = ReplySources(self.conversations, bridge, self.remote, self.router)
        self.tools = McpToolbox(tool_timeout_s(self.settings), self)
        self.controller = ChatController(self.conversations, self.sources, self.tools, self)
        self.actions = ConversationActions(self.conversations, self.controller, self.settings, self.personas, self)
        self.tokens = TokenCounter(bridge.count_tokens)
        self.local_api = LocalApi(lambda: getattr(bridge, "engine", None), self)  # the bridge's own engine

    def set_routes(self, routes: Routes | None) -> None:
        """Routed chats follow ``routes`` from now on (None: the default routes for the resident models); saved
        with the settings."""
        self.settings["routes"] = routes.to_dict() if routes is not None else None
        self.settings.save()
        self.router.follow(routes)

    def routes(self) -> Routes | None:
        """The routes routed chats follow (None: the default routes)."""
        return self.router.routes if self.router.given else None

    async def evaluate_routes(self, routes: Routes | None) -> RouteEvaluation:
        """Every resident local model answers the shipped evaluation tasks and ``routes`` route each (as
        ``eval-route`` does); the result is saved and the router's ``min_score`` rules read it from now on."""
        if not self.bridge.ready:
            raise RuntimeError("no local model is loaded")
        result = await evaluate(self.bridge.engine, TaskSet.shipped(), Router(routes))
        self.router.scores = result.scores()
        await asyncio.to_thread(save, result)
        return result

    def start(self) -> None:
        """Serve the local API if the settings ask for it, open the latest chat, ask the servers for models
        (after the views are connected, so they see each of these happen)."""
        self.local_api.apply(self.settings["api"])
        self.actions.open_first()
        self.remote.refresh_all()
        self.connect_tools()

    def connect_tools(self) -> asyncio.Task:
        """(Re)connect to the MCP servers in the settings; their tools are offered to chats once listed."""
        self.tools.timeout_s = tool_timeout_s(self.settings)
        self.tools_connecting = asyncio.ensure_future(self.tools.connect(servers_of(self.settings)))
        return self.tools_connecting

    def shutdown(self) -> None:
        """Stop every reply being written (their text so far kept), the local API and the remote clients."""
        for task in list(self.controller.tasks.values()):
            task.cancel()
        self.controller.keep_unfinished_now()
        self.local_api.shutdown()
        self.remote.shutdown()
        self.tools.shutdown()
