"""The context meter: how much of the model's context the chat on screen takes, counted again only when the
chat, its persona or the model changed (on a worker thread, cached; never on a timer)."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject, Signal

from .session import ChatSession


class ContextMeter(QObject):
    """Follows the chat on screen and the engine's loads; says the count, or that the server counts."""

    counted = Signal(int, int)  # tokens the chat takes, the model's context
    counted_by_server = Signal()  # the chat runs on a remote server, which checks its own context

    def __init__(self, session: ChatSession, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.task: asyncio.Task | None = None  # the count under way, if any
        self.stopped = False
        session.actions.opened.connect(lambda _: self.recount())
        session.conversations.thread_changed.connect(self._if_on_screen)
        session.conversations.conversation_changed.connect(self._if_on_screen)
        session.bridge.loaded.connect(self._model_loaded)

    def recount(self) -> None:
        current = self.session.actions.current
        if current is None or self.stopped:
            return
        if self.session.sources.of(current).checks_own_context:
            self.counted_by_server.emit()
        elif self.session.bridge.ready:
            if self.task is not None:
                self.task.cancel()  # an older count is no longer wanted
            self.task = asyncio.ensure_future(self._count(current))

    def cancel(self) -> None:
        """Stop counting for good (the window is closing): the count under way is cancelled, none starts."""
        self.stopped = True
        if self.task is not None:
            self.task.cancel()

    def _if_on_screen(self, conversation_id: int) -> None:
        if conversation_id == self.session.actions.current:
            self.recount()

    def _model_loaded(self, _stats) -> None:
        self.session.tokens.forget()  # another model reads another number of tokens
        self.recount()

    async def _count(self, conversation_id: int) -> None:
        stats = self.session.bridge.stats()
        prompt = self.session.controller.prompt_for_model(conversation_id)  # what the next reply sends
        try:
            used = await self.session.tokens.count_later(prompt)
        except Exception:  # no tokenizer (the engine went away meanwhile): the meter keeps its last value
            return
        if conversation_id == self.session.actions.current and stats is not None:
            self.counted.emit(used, stats.max_model_len)
