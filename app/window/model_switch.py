"""Loading another model from the model bar: replies being written are stopped, so the user is asked first; and
moving the chat on screen between the local engine and a remote server's model."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QMessageBox, QWidget

from engine import EngineConfig

from ..chats.session import ChatSession
from ..data.remote_store import RemoteChoice
from .model_bar import ModelBar


class ModelSwitch(QObject):
    """The model bar's requests, carried out for the chat on screen."""

    def __init__(self, session: ChatSession, model_bar: ModelBar, parent: QWidget) -> None:
        super().__init__(parent)
        self.session, self.model_bar, self.parent_widget = session, model_bar, parent
        model_bar.switch_requested.connect(self.switch)
        model_bar.remote_requested.connect(self.use_remote)

    def switch(self, config: EngineConfig) -> asyncio.Future | None:
        """Load ``config`` in place of the serving model; replies being written are stopped, so ask first.
        A chat that ran on a remote server runs on the local engine from now on."""
        session, current = self.session, self.session.actions.current
        if session.sources.of(current).remote is not None:
            session.sources.run_on(current, None)
            served = session.bridge.config
            if session.bridge.serving and served is not None and (served.model, served.quantization) == (
                    config.model, config.quantization):
                self.model_bar.progress.hide()
                return None  # that model serves already
        return self.reload(config)

    def reload(self, config: EngineConfig) -> asyncio.Future | None:
        """Load ``config`` on the local engine (the same model in another KV format, say), asking first where
        local replies are being written; the chats keep where they run."""
        session = self.session
        writing = sum(1 for c in session.controller.tasks if session.sources.is_local(c))
        if writing and not self.confirm(writing):
            self.model_bar.show_serving()
            self.model_bar.progress.hide()
            return None
        return asyncio.ensure_future(session.bridge.switch(config))

    def confirm(self, writing: int) -> bool:
        """Ask whether to stop the ``writing`` local replies for the switch."""
        replies = "A reply is" if writing == 1 else f"{writing} replies are"
        answer = QMessageBox.question(
            self.parent_widget, "Switch the model?",
            f"{replies} still being written. Switching the model stops {'it' if writing == 1 else 'them'}; "
            "what has arrived is kept.")
        return answer == QMessageBox.Yes

    def use_remote(self, choice: RemoteChoice) -> None:
        """The chat on screen runs on a remote server's model from now on."""
        if self.session.actions.current is not None:
            self.session.sources.run_on(self.session.actions.current, choice)
