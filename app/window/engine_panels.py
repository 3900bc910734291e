"""The window's right-hand side: the local engine's live panel, or the remote server's for a chat that runs on one.

Each panel is fed straight from the session: the local one by the bridge's stats (with each request's chat) and
the first tokens of local replies, the remote one by the replies of the server it shows.
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QMessageBox, QScrollArea, QStackedWidget

from engine import EngineStats

from ..chats.session import ChatSession
from ..data.remote_store import RemoteChoice
from ..data.store import Message
from ..panel.engine_panel import EnginePanel
from ..panel.history import EngineHistory
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
        self.histories: dict[str, EngineHistory] = {}  # each resident model's charts, recorded whether shown or not
        self._history_owned = False  # whether the panel's first history has been given to a model
        session.bridge.loaded.connect(self._focus_changed)
        session.bridge.stats_updated.connect(self._focused_stats)
        session.bridge.models_updated.connect(self._models_updated)
        self.panel.models.model_chosen.connect(self.pick)
        self.panel.models.unload_requested.connect(self.unload)
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
        self.panel.update_models(every, self.shown_model(), self.session.bridge.focused)
        if model in every:
            self.show_stats(every[model], record=False)  # its latest snapshot is in its history already

    def unload(self, model: str) -> asyncio.Future | None:
        """Unload the resident ``model`` (asked first where it is writing replies); its chats keep their model
        and load it again when next used."""
        stats = self.session.bridge.all_stats().get(model)
        if stats is None:
            return None
        busy = stats.num_running + stats.num_waiting
        if busy and not self.confirm_unload(model, busy):
            return None
        return asyncio.ensure_future(self.session.bridge.unload(model))

    def confirm_unload(self, model: str, busy: int) -> bool:
        replies = "A reply is" if busy == 1 else f"{busy} replies are"
        answer = QMessageBox.question(
            self, "Unload the model?",
            f"{replies} being written by {model}. Unloading it stops {'it' if busy == 1 else 'them'}; what has "
            "arrived is kept.")
        return answer == QMessageBox.Yes

    def _focus_changed(self, stats: EngineStats) -> None:
        self.picked = None
        self.show_stats(stats)

    def _focused_stats(self, stats: EngineStats) -> None:
        if self.picked is None:
            self.show_stats(stats)

    def _models_updated(self, every: dict[str, EngineStats]) -> None:
        if self.picked is not None and self.picked not in every:
            self.picked = None  # unloaded since
        shown = self.shown_model()
        self.histories = {m: h for m, h in self.histories.items() if m in every or m == shown}
        for model, stats in every.items():
            if model != shown:  # the shown model's snapshot is recorded as it is shown
                self._history_of(model).add(stats)
        self.panel.update_models(every, shown, self.session.bridge.focused)
        if self.picked is not None:
            self.show_stats(every[self.picked])

    def _history_of(self, model: str) -> EngineHistory:
        """``model``'s chart history; the first model ever shown takes over what the panel recorded before."""
        if model not in self.histories:
            first = not self._history_owned
            self.histories[model] = self.panel.history if first else EngineHistory()
            self._history_owned = True
        return self.histories[model]

    def show_stats(self, stats: EngineStats, record: bool = True) -> None:
        """The shown model's numbers, each live request named by its chat; ``record``: a new snapshot, for the
        charts' history (which goes on while the panel is hidden)."""
        shown = self.shown_model()
        if shown is not None and self._history_of(shown) is not self.panel.history:
            self.panel.use_history(self.histories[shown])  # the charts follow the model whose numbers are shown
        if not self.panel.isVisible():
            if record:
                self.panel.record(stats)
            return
        owners = {}
        for request_id, conversation_id in self.session.controller.request_owners.items():
            try:
                owners[request_id] = (conversation_id, self.session.conversations.get(conversation_id).title)
            except KeyError:
                continue
        self.panel.update_stats(stats, owners, record)

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
