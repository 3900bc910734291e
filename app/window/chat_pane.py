"""The middle of the window: the chat's persona, the engine banner, the transcript and the composer.

The composer's Send and Stop and the transcript's message actions go to the :class:`ReplyFlow`; the pane follows
the chat on screen (its persona, whether a reply is being written) and the context meter's count.
"""

from __future__ import annotations

import asyncio

from PySide6.QtWidgets import QHBoxLayout, QPushButton, QVBoxLayout, QWidget

from ..chats.context_meter import ContextMeter
from ..chats.reply_flow import ReplyFlow
from ..chats.session import ChatSession
from ..data.store import Message
from ..dialogs.chat_settings import ChatSettingsDialog
from ..rich_text import plain_tooltip
from ..transcript.model import Transcript
from ..transcript.view import ChatView, MessageAction, finished_announcement
from .composer import Composer
from .engine_banner import EngineBanner
from .thinking_switch import ThinkingSwitch
from .tool_choice import ToolChoiceBox
from .tools_switch import ToolsSwitch


class ChatPane(QWidget):
    """Persona header, banner, transcript (bound to ``transcript``) and composer, for the chat on screen."""

    def __init__(self, session: ChatSession, flow: ReplyFlow, meter: ContextMeter, transcript: Transcript,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session, self.flow = session, flow
        self.persona_button = QPushButton("Persona")
        self.persona_button.setFlat(True)
        self.persona_button.setToolTip("Chat settings: persona and sampling")
        self.persona_button.setAccessibleName("Chat settings: persona and sampling")
        self.thinking = ThinkingSwitch(session)
        self.tools = ToolsSwitch(session)
        self.tool_choice = ToolChoiceBox(session, self.tools)
        self.banner = EngineBanner()
        self.chat = ChatView()
        self.chat.set_model(transcript)
        self.composer = Composer()
        self._lay_out()
        self._connect(meter)

    def _lay_out(self) -> None:
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        header = QHBoxLayout()
        header.setContentsMargins(6, 4, 6, 0)
        header.addWidget(self.persona_button)
        header.addStretch(1)
        header.addWidget(self.tools)
        header.addWidget(self.tool_choice)
        header.addWidget(self.thinking)
        layout.addLayout(header)
        layout.addWidget(self.banner)
        layout.addWidget(self.chat, 1)
        layout.addWidget(self.composer)

    def _connect(self, meter: ContextMeter) -> None:
        session = self.session
        self.persona_button.clicked.connect(lambda: self.edit_chat_settings())
        self.composer.send.connect(self.send)
        self.composer.stop.connect(self.stop)
        self.chat.action.connect(self.message_action)
        self.chat.run_on.connect(lambda _message_id, model: self.flow.regenerate(model))
        meter.counted.connect(self.composer.set_context)
        meter.counted_by_server.connect(lambda: self.composer.context.setText("context: counted by the server"))
        session.actions.opened.connect(self._opened)
        session.conversations.conversation_changed.connect(self._conversation_changed)
        session.personas.changed.connect(self.show_persona)
        session.controller.reply_started.connect(self._reply_started)
        session.controller.reply_finished.connect(self._reply_finished)

    @property
    def current(self) -> int | None:
        return self.session.actions.current

    def send(self, text: str) -> asyncio.Task | None:
        """Send the composer's text (see :class:`ReplyFlow`); the box empties only once it has gone."""
        task = self.flow.send(text, self.composer.editing_id)
        if task is not None:
            self.composer.clear()
        return task

    def stop(self) -> None:
        """Stop the reply being written, or else leave editing an earlier message."""
        if not self.flow.stop():
            self.composer.cancel_editing()

    def message_action(self, action: MessageAction, message_id: int) -> None:
        if action is MessageAction.EDIT:
            self.composer.start_editing(message_id, self.session.conversations.message(message_id).text)
        elif action is MessageAction.REGENERATE:
            self.flow.regenerate()
        elif action is MessageAction.CONTINUE:
            self.flow.continue_reply(message_id)
        else:
            self.session.actions.show_version(message_id, -1 if action is MessageAction.PREVIOUS else 1)

    def edit_chat_settings(self) -> None:
        """The chat's persona and sampling, in a dialog over the saved defaults."""
        conversations = self.session.conversations
        conv = conversations.get(self.current)
        sampling = {**self.session.settings["sampling"], **conv.settings}
        dialog = ChatSettingsDialog(self.session.personas, conv.preset, conv.system_prompt, sampling, self.window())
        if dialog.exec():
            values = dialog.result_values()
            conversations.configure(self.current, values["preset"], values["system_prompt"],
                                    {**conv.settings, **values["settings"]})

    def set_text_scale(self, percent: int) -> None:
        self.chat.set_text_scale(percent)
        self.composer.set_text_scale(percent)

    def show_persona(self) -> None:
        conv = self.session.conversations.get(self.current)
        persona = conv.preset or ("Custom persona" if conv.system_prompt else "No system prompt")
        self.persona_button.setText(f"Persona: {persona}")
        self.persona_button.setToolTip(plain_tooltip(conv.system_prompt or "No system prompt"))

    def _opened(self, conversation_id: int) -> None:
        self.show_persona()
        self.composer.set_generating(self.session.controller.is_generating(conversation_id))
        self.composer.edit.setFocus()

    def _conversation_changed(self, conversation_id: int) -> None:
        if conversation_id == self.current:
            self.show_persona()

    def _reply_started(self, conversation_id: int, reply_id: int) -> None:
        if conversation_id == self.current:
            self.composer.set_generating(True)

    def _reply_finished(self, conversation_id: int, message: Message) -> None:
        if conversation_id == self.current:
            self.composer.set_generating(False)
            self.chat.announce(finished_announcement(message))
