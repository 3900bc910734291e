"""The main window: top bar (model, quantisation, device), sidebar, chat, composer and the live panel."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSplitter,
    QStackedWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine import EngineConfig, EngineStats

from .about_dialog import AboutDialog
from .chat_settings import ChatSettingsDialog, PreferencesDialog
from .chat_view import ChatView, MessageAction, finished_announcement
from .composer import Composer
from .context_meter import ContextMeter
from .conversation_actions import Overflow
from .conversation_list import ChatAction, ConversationSidebar
from .engine_banner import EngineBanner
from .engine_panel import EnginePanel
from .model_bar import ModelBar
from .model_dialog import ModelDialog
from .remote_panel import RemotePanel
from .remote_servers import RemoteServersDialog
from .remote_store import RemoteChoice
from .reply_flow import ReplyFlow
from .reply_sources import LocalSource, RemoteSource
from .session import ChatSession
from .settings import DEFAULTS, next_text_scale
from .shortcuts import COMMANDS, MENUS, ShortcutsDialog
from .store import Message
from .theme import apply_theme, follow_system_scheme, stop_following_system_scheme
from .transcript import Transcript
from .window_geometry import first_start_geometry, fit_to_screen


class MainWindow(QMainWindow):
    """Layout and wiring over a :class:`ChatSession`, built before the window: the chats live in its
    :class:`Conversations` (which says what changed), what users do to them in its :class:`ConversationActions`,
    replies in its :class:`ChatController`, where each chat runs in its :class:`ReplySources`."""

    def __init__(self, session: ChatSession) -> None:
        super().__init__()
        self.setWindowTitle("Kvasir")
        self.session = session
        self.store, self.bridge, self.library, self.settings = session.store, session.bridge, session.library, \
            session.settings
        self.personas, self.conversations, self.remote = session.personas, session.conversations, session.remote
        self.sources, self.controller, self.actions = session.sources, session.controller, session.actions
        self.tokens, self.local_api = session.tokens, session.local_api
        self.flow = ReplyFlow(session, dialogs=self, parent=self)
        self.meter = ContextMeter(session, self)
        self.transcript = Transcript(session, self)
        self._build()
        self._connect()
        self._restore_geometry()
        self.apply_theme(self.settings["theme"])
        follow_system_scheme(self._system_scheme_changed)
        self.set_text_scale(self.settings["text_scale"], save=False)
        session.start()

    @property
    def current(self) -> int | None:
        """The chat on screen."""
        return self.actions.current

    # -- layout -------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.model_bar = ModelBar(self.library, self.bridge, self.settings, remote=self.remote)
        self.sidebar = ConversationSidebar(self.conversations)
        self.chat = ChatView()
        self.chat.set_model(self.transcript)
        self.composer = Composer()
        center = QWidget()
        center_layout = QVBoxLayout(center)
        center_layout.setContentsMargins(0, 0, 0, 0)
        self.persona_button = QPushButton("Persona")
        self.persona_button.setFlat(True)
        self.persona_button.setToolTip("Chat settings: persona and sampling")
        self.persona_button.setAccessibleName("Chat settings: persona and sampling")
        self.persona_button.clicked.connect(lambda: self.edit_chat_settings())
        header = QHBoxLayout()
        header.setContentsMargins(6, 4, 6, 0)
        header.addWidget(self.persona_button)
        header.addStretch(1)
        center_layout.addLayout(header)
        self.banner = EngineBanner()
        center_layout.addWidget(self.banner)
        center_layout.addWidget(self.chat, 1)
        center_layout.addWidget(self.composer)
        self.panel = EnginePanel()
        self.remote_panel = RemotePanel(self.remote)
        self.panels = QStackedWidget()  # the local engine's panel, or the remote server's for a remote chat
        self.panels.addWidget(self.panel)
        self.panels.addWidget(self.remote_panel)
        self.panel_area = QScrollArea()  # the panel is taller than a laptop's screen: it scrolls, the window fits
        self.panel_area.setWidget(self.panels)
        self.panel_area.setWidgetResizable(True)
        self.panel_area.setFrameShape(QFrame.NoFrame)
        self.panel_area.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.panel_area.setMinimumWidth(self.panels.minimumSize().expandedTo(self.panels.minimumSizeHint()).width()
                                        + self.panel_area.verticalScrollBar().sizeHint().width())
        self.panel_area.setFocusPolicy(Qt.NoFocus)
        self.splitter = QSplitter(Qt.Horizontal)
        for widget, stretch in ((self.sidebar, 0), (center, 1), (self.panel_area, 0)):
            self.splitter.addWidget(widget)
            self.splitter.setStretchFactor(self.splitter.indexOf(widget), stretch)
        self.splitter.setSizes([230, 650, 300])
        self.undo_button = QPushButton("Undo delete")
        self.undo_button.hide()
        self.statusBar().addPermanentWidget(self.undo_button)
        self.api_label = QLabel()
        self.api_label.setObjectName("apiStatus")
        self.api_label.hide()
        self.statusBar().addPermanentWidget(self.api_label)
        self._build_menus()
        root = QWidget()
        layout = QVBoxLayout(root)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.model_bar)
        layout.addWidget(self.splitter, 1)
        self.setCentralWidget(root)
        self._tab_order()

    def _tab_order(self) -> None:
        """Top bar, sidebar, persona, transcript (its messages chain themselves in after it), composer, panel."""
        chain = [self.model_bar.model_box, self.model_bar.quant_box, self.model_bar.panel_button,
                 self.sidebar.new_button, self.sidebar.search, self.sidebar.view, self.persona_button,
                 self.banner.choose, self.banner.restart, self.chat, self.composer.edit, self.composer.button,
                 self.panel, self.undo_button]
        self.panel.setFocusPolicy(Qt.TabFocus)  # read-only, but a stop of its own for the keyboard and readers
        self.panel.setAccessibleName("Engine panel")
        for first, second in zip(chain, chain[1:]):
            QWidget.setTabOrder(first, second)

    def _build_menus(self) -> None:
        """The menus from :data:`app.shortcuts.COMMANDS`: each command an action with its keys, added to the
        window too so the keys work while the menu bar is hidden."""
        handlers = {
            "new_chat": self.actions.new, "import_chat": self._ask_import, "preferences": self.edit_preferences,
            "quit": self.close, "regenerate": self.regenerate, "stop": self.stop,
            "chat_settings": self.edit_chat_settings,
            "rename_chat": lambda: self._on_current_chat(ChatAction.RENAME),
            "pin_chat": lambda: self._on_current_chat(ChatAction.PIN),
            "export_markdown": lambda: self._on_current_chat(ChatAction.EXPORT_MARKDOWN),
            "export_json": lambda: self._on_current_chat(ChatAction.EXPORT_JSON),
            "delete_chat": lambda: self._on_current_chat(ChatAction.DELETE),
            "undo_delete": self.actions.undo_delete,
            "search": self.focus_search, "focus_composer": lambda: self.composer.edit.setFocus(),
            "toggle_panel": self.model_bar.panel_button.setChecked,
            "text_larger": lambda: self.set_text_scale(next_text_scale(self.settings["text_scale"], 1)),
            "text_smaller": lambda: self.set_text_scale(next_text_scale(self.settings["text_scale"], -1)),
            "text_reset": lambda: self.set_text_scale(DEFAULTS["text_scale"]),
            "choose_model": self.choose_model, "model_manager": self.open_model_manager,
            "remote_servers": self.open_remote_servers,
            "shortcuts": self.show_shortcuts, "about": self.show_about,
        }
        menus = {title: self.menuBar().addMenu(title) for title in MENUS}
        self.commands: dict[str, QAction] = {}
        for command in COMMANDS:
            action = QAction(command.label, self)
            action.setShortcuts([QKeySequence(k) for k in command.keys])
            action.setCheckable(command.checkable)
            if command.checkable:
                action.toggled.connect(handlers[command.name])
            else:
                action.triggered.connect(lambda _=False, handler=handlers[command.name]: handler())
            menus[command.menu].addAction(action)
            self.addAction(action)
            self.commands[command.name] = action
        more = self.menuBar().findChild(QToolButton, "qt_menubar_ext_button")  # shown when the menus don't fit
        if more is not None:
            more.setAccessibleName("More menus")
        panel = self.commands["toggle_panel"]
        panel.setChecked(self.model_bar.panel_button.isChecked())
        self.model_bar.panel_button.toggled.connect(panel.setChecked)

    def _connect(self) -> None:
        self.sidebar.selected.connect(self.actions.open)
        self.sidebar.new_requested.connect(self.actions.new)
        self.sidebar.action_requested.connect(self._chat_action_requested)
        self.actions.opened.connect(self._opened)
        self.actions.notice.connect(lambda text, ms: self.statusBar().showMessage(text, ms))
        self.actions.undo_available.connect(self.undo_button.setVisible)
        self.undo_button.clicked.connect(self.actions.undo_delete)
        self.conversations.conversation_changed.connect(self._conversation_changed)
        self.composer.send.connect(self.send)
        self.composer.stop.connect(self.stop)
        self.flow.notice.connect(lambda text, ms: self.statusBar().showMessage(text, ms))
        self.meter.counted.connect(self.composer.set_context)
        self.meter.counted_by_server.connect(lambda: self.composer.context.setText("context: counted by the server"))
        self.chat.action.connect(self._message_action)
        self.controller.reply_started.connect(self._reply_started)
        self.controller.first_token.connect(self._first_token)
        self.controller.reply_finished.connect(self._reply_finished)
        self.bridge.loaded.connect(self._loaded)
        self.bridge.load_failed.connect(self._load_failed)
        self.bridge.stats_updated.connect(self._stats)
        self.bridge.engine_failed.connect(self._engine_failed)
        self.banner.restart_requested.connect(self.restart_engine)
        self.banner.choose_model_requested.connect(self.open_model_manager)
        self.model_bar.panel_button.toggled.connect(self.panel_area.setVisible)
        self.personas.changed.connect(self._update_header)
        self.model_bar.switch_requested.connect(self.switch_model)
        self.local_api.changed.connect(self._api_changed)
        self.model_bar.remote_requested.connect(self.use_remote)

    # -- actions ------------------------------------------------------------------------------------

    def _opened(self, conversation_id: int) -> None:
        self.sidebar.select(conversation_id)
        self._update_header()
        self._show_engine()
        self.composer.set_generating(self.controller.is_generating(conversation_id))
        self.composer.edit.setFocus()

    def _conversation_changed(self, conversation_id: int) -> None:
        if conversation_id == self.current:
            self._update_header()
            self._show_engine()

    def edit_chat_settings(self) -> None:
        conv = self.conversations.get(self.current)
        sampling = {**self.settings["sampling"], **conv.settings}
        dialog = ChatSettingsDialog(self.personas, conv.preset, conv.system_prompt, sampling, self)
        if dialog.exec():
            values = dialog.result_values()
            self.conversations.configure(self.current, values["preset"], values["system_prompt"],
                                         {**conv.settings, **values["settings"]})

    def edit_preferences(self) -> None:
        dialog = PreferencesDialog(self.personas.all(), self.settings.values, self,
                                   api_status=self.local_api.status())
        if dialog.exec():
            api_before = dict(self.settings["api"])
            for key, value in dialog.result_values().items():
                self.settings[key] = value
            self.settings.save()
            self.apply_theme(self.settings["theme"])
            self.set_text_scale(self.settings["text_scale"], save=False)
            if self.settings["api"] != api_before or self.local_api.error:
                problem = self.local_api.apply(self.settings["api"])
                if problem:
                    QMessageBox.warning(self, "Local API", problem)

    def apply_theme(self, choice: str) -> None:
        app = QApplication.instance()
        dark = apply_theme(app, choice) if app is not None else False
        self.chat.set_dark(dark)

    def _system_scheme_changed(self, *_scheme) -> None:
        """The desktop went light or dark: follow it, unless the user chose a theme of their own."""
        if self.settings["theme"] == "system":
            self.apply_theme("system")

    def set_text_scale(self, percent: int, save: bool = True) -> None:
        """The transcript's and the message box's text at ``percent`` of the normal size; remembered."""
        self.settings["text_scale"] = percent
        if save:
            self.settings.save()
            self.statusBar().showMessage(f"Text size {percent} %", 2000)
        self.chat.set_text_scale(percent)
        self.composer.set_text_scale(percent)

    def focus_search(self) -> None:
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def choose_model(self) -> None:
        self.model_bar.model_box.setFocus()
        self.model_bar.model_box.showPopup()

    def show_shortcuts(self) -> ShortcutsDialog:
        dialog = getattr(self, "shortcuts_dialog", None) or ShortcutsDialog(self)
        self.shortcuts_dialog = dialog
        dialog.show()
        dialog.raise_()

    def source(self) -> LocalSource | RemoteSource:
        """Where the replies of the chat on screen come from."""
        return self.flow.source()

    def use_remote(self, choice: RemoteChoice) -> None:
        """The chat on screen runs on a remote server's model from now on."""
        if self.current is not None:
            self.sources.run_on(self.current, choice)

    def _show_engine(self) -> None:
        """The model bar, the panel and the metrics polling follow where the chat on screen runs."""
        choice = self.source().remote
        self.model_bar.show_remote(choice)
        self.remote_panel.show_choice(choice)
        self.panels.setCurrentWidget(self.remote_panel if choice else self.panel)
        self.remote.watch(choice.server_id if choice else None)

    def open_remote_servers(self) -> RemoteServersDialog:
        dialog = RemoteServersDialog(self.remote, self)
        dialog.open()
        return dialog

    def send(self, text: str) -> asyncio.Task | None:
        """Send the composer's text (see :class:`ReplyFlow`); the box empties only once it has gone."""
        task = self.flow.send(text, self.composer.editing_id)
        if task is not None:
            self.composer.clear()
        return task

    def warn_too_long(self) -> None:
        QMessageBox.warning(self, "Message too long",
                            "This message does not fit the model's context even on its own. Shorten it, or "
                            "lower 'Max tokens per reply' in the chat settings.")

    def ask_overflow(self, overflow: Overflow) -> str | None:
        """'drop', 'new' or None (cancel)."""
        box, choices = self.overflow_box(overflow)
        box.exec()
        return choices.get(box.clickedButton())

    def overflow_box(self, overflow: Overflow) -> tuple[QMessageBox, dict]:
        """The context-full question, and its buttons' answers."""
        box = QMessageBox(QMessageBox.Question, "The conversation is full",
                          f"This message and its reply need {overflow.needed:,} tokens, but the model reads at "
                          f"most {overflow.limit:,}. Nothing you wrote is deleted either way.", parent=self)
        drop = box.addButton("Stop sending the oldest turns", QMessageBox.AcceptRole)
        new = box.addButton("Start a new chat", QMessageBox.ActionRole)
        box.addButton(QMessageBox.Cancel)
        return box, {drop: "drop", new: "new"}

    def stop(self) -> None:
        if not self.flow.stop():
            self.composer.cancel_editing()

    def regenerate(self) -> asyncio.Task | None:
        return self.flow.regenerate()

    def continue_reply(self, message_id: int) -> asyncio.Task | None:
        return self.flow.continue_reply(message_id)

    def _message_action(self, action: MessageAction, message_id: int) -> None:
        if action is MessageAction.EDIT:
            self.composer.start_editing(message_id, self.conversations.message(message_id).text)
        elif action is MessageAction.REGENERATE:
            self.regenerate()
        elif action is MessageAction.CONTINUE:
            self.continue_reply(message_id)
        else:
            self.actions.show_version(message_id, -1 if action is MessageAction.PREVIOUS else 1)

    def _on_current_chat(self, action: ChatAction) -> None:
        """The Chat menu: the chat highlighted in the list while it has focus, else the chat on screen."""
        if self.sidebar.view.hasFocus():
            self.sidebar.act_on_highlighted(action)
        elif self.current is not None:
            self._chat_action_requested(action, self.current)

    def _chat_action_requested(self, action: ChatAction, conversation_id: int) -> None:
        """The sidebar's menu: the dialogs here, the rest in :class:`ConversationActions`."""
        title = self.conversations.get(conversation_id).title
        if action is ChatAction.RENAME:
            new_title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=title)
            if ok:
                self.actions.rename(conversation_id, new_title)
        elif action is ChatAction.PIN:
            self.actions.toggle_pin(conversation_id)
        elif action is ChatAction.DELETE:
            self.actions.delete(conversation_id)
        else:
            suffix = ".md" if action is ChatAction.EXPORT_MARKDOWN else ".json"
            path, _ = QFileDialog.getSaveFileName(self, "Export chat", _safe_file_name(title) + suffix)
            if path:
                self.actions.export(conversation_id, Path(path))

    def import_conversation(self, path: Path) -> int | None:
        try:
            return self.actions.import_file(path)
        except (OSError, ValueError) as exc:  # the file is refused as a whole; nothing was added
            QMessageBox.warning(self, "Import failed", f"{path.name} could not be imported: {exc}")
            return None

    def _ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import chat", "", "Kvasir chats (*.json)")
        if path:
            self.import_conversation(Path(path))

    def switch_model(self, config: EngineConfig) -> asyncio.Future | None:
        """Load ``config`` in place of the serving model; replies being written are stopped, so ask first.
        A chat that ran on a remote server runs on the local engine from now on."""
        if self.source().remote is not None:
            self.sources.run_on(self.current, None)
            served = self.bridge.config
            if self.bridge.serving and served is not None and (served.model, served.quantization) == (
                    config.model, config.quantization):
                self.model_bar.progress.hide()
                return None  # that model serves already
        writing = sum(1 for c in self.controller.tasks if self.sources.is_local(c))
        if writing and not self.confirm_switch(writing):
            self.model_bar.show_serving()
            self.model_bar.progress.hide()
            return None
        return asyncio.ensure_future(self.bridge.switch(config))

    def confirm_switch(self, writing: int) -> bool:
        replies = "A reply is" if writing == 1 else f"{writing} replies are"
        answer = QMessageBox.question(
            self, "Switch the model?",
            f"{replies} still being written. Switching the model stops {'it' if writing == 1 else 'them'}; "
            "what has arrived is kept.")
        return answer == QMessageBox.Yes

    def show_about(self) -> AboutDialog:
        dialog = AboutDialog(self)
        dialog.open()
        return dialog

    def open_model_manager(self) -> ModelDialog:
        dialog = ModelDialog(self.library, self.model_bar.quant_box.currentText(), self)
        dialog.load_requested.connect(self.model_bar.choose)
        dialog.finished.connect(lambda _: self.model_bar.refill())
        dialog.open()
        return dialog

    # -- updates ------------------------------------------------------------------------------------

    def _update_header(self) -> None:
        conv = self.conversations.get(self.current)
        persona = conv.preset or ("Custom persona" if conv.system_prompt else "No system prompt")
        self.persona_button.setText(f"Persona: {persona}")
        self.persona_button.setToolTip(conv.system_prompt or "No system prompt")

    def _reply_started(self, conversation_id: int, reply_id: int) -> None:
        if conversation_id == self.current:
            self.composer.set_generating(True)

    def _reply_finished(self, conversation_id: int, message: Message) -> None:
        if conversation_id == self.current:
            self.composer.set_generating(False)
            self.chat.announce(finished_announcement(message))
            if self.source().remote is not None:
                self.remote_panel.record_reply(message.stats)

    def _first_token(self, conversation_id: int, seconds: float) -> None:
        """The local panel times local replies; the remote panel those of the server it shows."""
        remote = self.sources.of(conversation_id).remote
        if remote is None:
            self.panel.record_ttft(seconds)
        elif self.remote_panel.choice is not None and remote.server_id == self.remote_panel.choice.server_id:
            self.remote_panel.record_ttft(seconds)

    def _loaded(self, stats: EngineStats) -> None:
        self.banner.hide()
        self._stats(stats)
        self.statusBar().showMessage(f"{stats.model_name} is ready", 4000)
        for warning in stats.warnings:
            self.statusBar().showMessage(f"Note: {warning}", 8000)

    def _load_failed(self, message: str) -> None:
        if self.bridge.serving:  # a failed switch: the previous model keeps serving
            self.statusBar().showMessage(f"Could not load the model: {message}", 15000)
            return
        self.banner.show_load_failed(message)

    def _engine_failed(self, reason: str) -> None:
        self.banner.show_engine_stopped(reason)

    def restart_engine(self) -> None:
        """Load the last model again in a fresh engine (after it stopped, or after a failed load)."""
        self.banner.show_restarting()
        self.model_bar.progress.show()
        self.bridge.restart()

    def _api_changed(self, status: str) -> None:
        self.api_label.setText(status)
        self.api_label.setToolTip(self.local_api.error or "OpenAI-compatible: /v1/models, /v1/chat/completions, "
                                                          "/v1/completions")
        self.api_label.setVisible(bool(status))
        if self.local_api.error:
            self.statusBar().showMessage(self.local_api.error, 10000)

    def _stats(self, stats: EngineStats) -> None:
        if self.panel.isVisible():
            owners = {}
            for request_id, conversation_id in self.controller.request_owners.items():
                try:
                    owners[request_id] = (conversation_id, self.conversations.get(conversation_id).title)
                except KeyError:
                    continue
            self.panel.update_stats(stats, owners)
        else:
            self.panel.record(stats)  # the charts' history goes on while the panel is hidden

    # -- window state -------------------------------------------------------------------------------

    def _restore_geometry(self) -> None:
        """Where the user left the window, inside the screen it opens on; the first time, a share of it."""
        settings = QSettings("Kvasir", "Kvasir")
        available = self.screen().availableGeometry()
        saved = settings.value("geometry")
        if saved and self.restoreGeometry(saved):
            frame, inner = self.frameGeometry(), self.geometry()
            fitted = fit_to_screen(frame, available)
            if fitted != frame and not self.isMaximized() and not self.isFullScreen():
                self.setGeometry(fitted.adjusted(inner.left() - frame.left(), inner.top() - frame.top(),
                                                 inner.right() - frame.right(), inner.bottom() - frame.bottom()))
        else:
            self.setGeometry(first_start_geometry(available))
        if settings.value("splitter"):
            self.splitter.restoreState(settings.value("splitter"))

    def closeEvent(self, event) -> None:
        stop_following_system_scheme(self._system_scheme_changed)
        settings = QSettings("Kvasir", "Kvasir")
        settings.setValue("geometry", self.saveGeometry())
        settings.setValue("splitter", self.splitter.saveState())
        self.meter.cancel()
        self.session.shutdown()
        super().closeEvent(event)


def _safe_file_name(title: str) -> str:
    return re.sub(r"[^\w\- ]+", "", title).strip() or "chat"
