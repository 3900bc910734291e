"""What the model bar's choices do to the chat on screen: run it on a local model (resident at once, loaded
beside the others, or after unloading the least recently used ones for room, asked first), route it, or move it
to a remote server's model; and opening a chat brings its own model on screen."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMessageBox, QWidget

from engine import EngineConfig
from engine.routing.router import AUTO

from ..chats.reply_sources import LocalModel, LocalSource
from ..chats.session import ChatSession
from ..data.remote_store import RemoteChoice
from ..data.settings import local_config
from .model_bar import ModelBar


class ModelSwitch(QObject):
    """The model bar's requests, carried out for the chat on screen."""

    def __init__(self, session: ChatSession, model_bar: ModelBar, parent: QWidget) -> None:
        super().__init__(parent)
        self.session, self.model_bar, self.parent_widget = session, model_bar, parent
        model_bar.switch_requested.connect(self.switch)
        model_bar.remote_requested.connect(self.use_remote)
        model_bar.auto_requested.connect(self.route)

    def switch(self, config: EngineConfig) -> asyncio.Future | None:
        """The chat on screen runs on ``config``'s model from now on (a chat that ran on a remote server, or was
        routed, too); the model comes on screen (see :meth:`show`)."""
        current = self.session.actions.current
        if current is not None:
            self.session.sources.run_locally_on(current, LocalModel(config.model, config.quantization))
            self.model_bar.show_local(config)
        return self.show(config)

    def show(self, config: EngineConfig) -> asyncio.Future | None:
        """Bring ``config``'s model on screen: at once where it is resident, else loaded beside the others; where
        it does not fit beside them, the least recently used models are unloaded first, and the user is asked.
        A model that would not fit even then replaces the model on screen (asked where replies are written)."""
        bridge = self.session.bridge
        resident = bridge.resident_id(config)
        if resident is not None and bridge.reloads(config):
            return self.reload(config)  # the same model with other load options: rebuilt in place
        if resident is not None:
            bridge.focus(resident)
            self.model_bar.progress.hide()
            return None
        room = bridge.room_for(config)
        if room is None:
            return self.reload(config)
        if room and not self.confirm_unload(room, config):
            self._cancelled()
            return None
        return asyncio.ensure_future(self._make_room_and_show(room, config))

    async def _make_room_and_show(self, room: list[str], config: EngineConfig) -> None:
        for model in room:
            await self.session.bridge.unload(model)
        await self.session.bridge.show(config)

    def reload(self, config: EngineConfig) -> asyncio.Future | None:
        """Load ``config`` in place of the model on screen (the same model in another KV format, say), asking
        first where local replies are being written; the chats keep where they run."""
        session = self.session
        writing = sum(1 for c in session.controller.tasks if session.sources.is_local(c))
        if writing and not self.confirm(writing):
            self._cancelled()
            return None
        return asyncio.ensure_future(session.bridge.switch(config))

    def route(self) -> None:
        """The chat on screen is routed from now on: each message goes where the routing rules say."""
        current = self.session.actions.current
        if current is not None:
            self.session.sources.run_locally_on(current, AUTO)
        self.model_bar.show_remote(None, routed=True)

    def follow(self, conversation_id: int | None) -> asyncio.Future | None:
        """A chat was opened: its own local model comes on screen (no load where it is resident)."""
        if conversation_id is None:
            return None
        source = self.session.sources.of(conversation_id)
        wanted = source.wanted if isinstance(source, LocalSource) else None
        if not isinstance(wanted, LocalModel) or not self.session.bridge.serving or self.session.bridge.loading:
            return None
        config = local_config(self.session.settings, wanted.model, wanted.quantization)
        resident = self.session.bridge.resident_id(config)
        if resident is not None:  # resident with whatever options it was loaded with: nothing reloads
            if resident != self.session.bridge.focused:
                self.session.bridge.focus(resident)
            return None
        return self.show(config)

    def confirm(self, writing: int) -> bool:
        """Ask whether to stop the ``writing`` local replies for the switch."""
        replies = "A reply is" if writing == 1 else f"{writing} replies are"
        answer = QMessageBox.question(
            self.parent_widget, "Switch the model?",
            f"{replies} still being written. Switching the model stops {'it' if writing == 1 else 'them'}; "
            "what has arrived is kept.")
        return answer == QMessageBox.Yes

    def confirm_unload(self, models: list[str], config: EngineConfig) -> bool:
        """Ask whether to unload ``models`` (least recently used first) to make room for ``config``'s model."""
        names = ", ".join(models)
        answer = QMessageBox.question(
            self.parent_widget, "Unload a model to make room?",
            f"{config.model} ({config.quantization}) does not fit in memory beside the models loaded now. Unload "
            f"{names}, used least recently, to make room? Replies being written by "
            f"{'it' if len(models) == 1 else 'them'} stop; what has arrived is kept.")
        return answer == QMessageBox.Yes

    def _cancelled(self) -> None:
        self.model_bar.show_serving()
        self.model_bar.progress.hide()

    def use_remote(self, choice: RemoteChoice) -> None:
        """The chat on screen runs on a remote server's model from now on."""
        if self.session.actions.current is not None:
            self.session.sources.run_on(self.session.actions.current, choice)
