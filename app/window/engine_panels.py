"""The window's right-hand side: the local engine's live panel, or the remote server's for a chat that runs on one.

Each panel is fed straight from the session: the local one by the bridge's stats (with each request's chat) and
the first tokens of local replies, the remote one by the replies of the server it shows.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QStackedWidget

from engine import EngineStats

from ..chats.session import ChatSession
from ..data.remote_store import RemoteChoice
from ..data.store import Message
from ..panel.engine_panel import EnginePanel
from ..panel.remote_panel import RemotePanel


class EnginePanels(QScrollArea):
    """Taller than a laptop's screen, so it scrolls and the window fits."""

    def __init__(self, session: ChatSession, parent=None) -> None:
        super().__init__(parent)
        self.session = session
        self.panel = EnginePanel()
        self.remote_panel = RemotePanel(session.remote)
        self.panels = QStackedWidget()
        self.panels.addWidget(self.panel)
        self.panels.addWidget(self.remote_panel)
        self.setWidget(self.panels)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.setMinimumWidth(self.panels.minimumSize().expandedTo(self.panels.minimumSizeHint()).width()
                             + self.verticalScrollBar().sizeHint().width())
        self.setFocusPolicy(Qt.NoFocus)
        self.panel.setFocusPolicy(Qt.TabFocus)  # read-only, but a stop of its own for the keyboard and readers
        self.panel.setAccessibleName("Engine panel")
        self.picked: str | None = None  # a resident model the user picked in the panel's list, None: the focused
        session.bridge.loaded.connect(self._focus_changed)
        session.bridge.stats_updated.connect(self._focused_stats)
        session.bridge.models_updated.connect(self._models_updated)
        self.panel.models.model_chosen.connect(self.pick)
        session.controller.first_token.connect(self._first_token)
        session.controller.reply_finished.connect(self._reply_finished)

    def show_source(self, choice: RemoteChoice | None) -> None:
        """The remote server's panel for a chat that runs on ``choice``, the local engine's for None."""
        self.remote_panel.show_choice(choice)
        self.panels.setCurrentWidget(self.remote_panel if choice else self.panel)

    def shown_model(self) -> str | None:
        """The resident model whose numbers the local panel shows: the one picked in its list, else the one on
        screen."""
        return self.picked or self.session.bridge.focused

    def pick(self, model: str) -> None:
        """Show ``model``'s numbers and pool (the chats keep their models)."""
        self.picked = None if model == self.session.bridge.focused else model
        every = self.session.bridge.all_stats()
        self._models_updated(every)  # shows a picked model's numbers
        if self.picked is None and model in every:
            self.show_stats(every[model])

    def _focus_changed(self, stats: EngineStats) -> None:
        self.picked = None
        self.show_stats(stats)

    def _focused_stats(self, stats: EngineStats) -> None:
        if self.picked is None:
            self.show_stats(stats)

    def _models_updated(self, every: dict[str, EngineStats]) -> None:
        if self.picked is not None and self.picked not in every:
            self.picked = None  # unloaded since
        self.panel.update_models(every, self.shown_model())
        if self.picked is not None:
            self.show_stats(every[self.picked])

    def show_stats(self, stats: EngineStats) -> None:
        """The local engine's numbers, each live request named by its chat; while hidden, only the history."""
        if not self.panel.isVisible():
            self.panel.record(stats)  # the charts' history goes on while the panel is hidden
            return
        owners = {}
        for request_id, conversation_id in self.session.controller.request_owners.items():
            try:
                owners[request_id] = (conversation_id, self.session.conversations.get(conversation_id).title)
            except KeyError:
                continue
        self.panel.update_stats(stats, owners)

    def _first_token(self, conversation_id: int, seconds: float) -> None:
        """The local panel times local replies; the remote panel those of the server it shows."""
        remote = self.session.sources.of(conversation_id).remote
        if remote is None:
            self.panel.record_ttft(seconds)
        elif self.remote_panel.choice is not None and remote.server_id == self.remote_panel.choice.server_id:
            self.remote_panel.record_ttft(seconds)

    def _reply_finished(self, conversation_id: int, message: Message) -> None:
        if conversation_id == self.session.actions.current and self.session.sources.of(conversation_id).remote:
            self.remote_panel.record_reply(message.stats)
