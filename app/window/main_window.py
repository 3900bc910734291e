"""The main window: layout and wiring over a :class:`ChatSession`, built before it.

Top bar (model, quantisation, device), sidebar, the chat pane (persona, banner, transcript, composer) and the
engine panels. Each part is wired to the session's objects it shows; the window itself keeps only the menus,
the dialogs it opens, the theme and text size, and where the window was left.
"""

from __future__ import annotations

import asyncio
import dataclasses

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from engine.routing.evaluation import load_saved

from ..chats.context_meter import ContextMeter
from ..chats.reply_flow import ReplyFlow
from ..chats.session import ChatSession
from ..data.settings import DEFAULTS, LOAD_SETTINGS, engine_cpu_options, idle_unload_s, next_text_scale
from ..dialogs.about import AboutDialog
from ..dialogs.model_manager import ModelDialog
from ..dialogs.preferences import PreferencesDialog
from ..dialogs.remote_servers import RemoteServersDialog
from ..dialogs.routing import RoutingDialog
from ..theme import apply_theme, follow_system_scheme, stop_following_system_scheme
from ..transcript.model import Transcript
from .chat_commands import ChatCommands
from .chat_pane import ChatPane
from .commands import ShortcutsDialog, add_menus
from .engine_notices import EngineNotices
from .engine_panels import EnginePanels
from .geometry import restore_window, save_window
from .model_bar import ModelBar
from .model_switch import ModelSwitch
from .reply_dialogs import ReplyDialogs
from .sidebar import ChatAction, ConversationSidebar
from .tool_approval import ToolApproval


class MainWindow(QMainWindow):
    """The chats of ``session`` in a window; ``session.start()`` runs once every part is connected."""

    def __init__(self, session: ChatSession) -> None:
        super().__init__()
        self.setWindowTitle("Kvasir")
        self.session = session
        self.store, self.bridge, self.library, self.settings = session.store, session.bridge, session.library, \
            session.settings
        self.personas, self.conversations, self.remote = session.personas, session.conversations, session.remote
        self.sources, self.controller, self.actions = session.sources, session.controller, session.actions
        self.local_api = session.local_api
        self.flow = ReplyFlow(session, dialogs=ReplyDialogs(self), parent=self)
        session.controller.tool_round.approve = ToolApproval(self)
        self.meter = ContextMeter(session, self)
        self.transcript = Transcript(session, self)
        self._build()
        self._connect()
        restore_window(self, self.splitter)
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
        self.pane = ChatPane(self.session, self.flow, self.meter, self.transcript)
        self.chat, self.composer, self.banner = self.pane.chat, self.pane.composer, self.pane.banner
        self.side = EnginePanels(self.session)
        self.panel, self.remote_panel = self.side.panel, self.side.remote_panel
        self.splitter = QSplitter(Qt.Horizontal)
        for widget, stretch in ((self.sidebar, 0), (self.pane, 1), (self.side, 0)):
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
        self.chat_commands = ChatCommands(self.session, self.sidebar, self)
        self.switcher = ModelSwitch(self.session, self.model_bar, self)
        self.notices = EngineNotices(self.session, self.banner, self.model_bar, self.statusBar(), self.api_label,
                                     self)
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
        bar = self.model_bar
        chain = [bar.model_box, bar.quant_box, bar.draft_box, bar.panel_button, self.sidebar.new_button,
                 self.sidebar.search, self.sidebar.view, self.pane.persona_button, self.banner.choose,
                 self.banner.restart, self.chat, self.composer.edit, self.composer.button, self.panel,
                 self.undo_button]
        for first, second in zip(chain, chain[1:]):
            QWidget.setTabOrder(first, second)

    def _build_menus(self) -> None:
        on_chat = self.chat_commands.on_current
        self.commands = add_menus(self, {
            "new_chat": self.actions.new, "import_chat": self.chat_commands.ask_import,
            "preferences": self.edit_preferences, "quit": self.close, "regenerate": self.flow.regenerate,
            "stop": self.pane.stop, "chat_settings": self.pane.edit_chat_settings,
            "rename_chat": lambda: on_chat(ChatAction.RENAME), "pin_chat": lambda: on_chat(ChatAction.PIN),
            "export_markdown": lambda: on_chat(ChatAction.EXPORT_MARKDOWN),
            "export_json": lambda: on_chat(ChatAction.EXPORT_JSON), "delete_chat": lambda: on_chat(ChatAction.DELETE),
            "undo_delete": self.actions.undo_delete,
            "search": self.focus_search, "focus_composer": lambda: self.composer.edit.setFocus(),
            "toggle_panel": self.model_bar.panel_button.setChecked,
            "text_larger": lambda: self.set_text_scale(next_text_scale(self.settings["text_scale"], 1)),
            "text_smaller": lambda: self.set_text_scale(next_text_scale(self.settings["text_scale"], -1)),
            "text_reset": lambda: self.set_text_scale(DEFAULTS["text_scale"]),
            "highlight_drafts": self.set_highlight_drafts,
            "choose_model": self.choose_model, "model_manager": self.open_model_manager,
            "remote_servers": self.open_remote_servers, "routing": self.open_routing,
            "shortcuts": self.show_shortcuts, "about": self.show_about,
        })
        self.commands["toggle_panel"].setChecked(self.model_bar.panel_button.isChecked())
        self.commands["highlight_drafts"].setChecked(self.settings["highlight_drafts"])
        self.model_bar.panel_button.toggled.connect(self.commands["toggle_panel"].setChecked)

    def _connect(self) -> None:
        self.sidebar.selected.connect(self.actions.open)
        self.sidebar.new_requested.connect(self.actions.new)
        self.actions.opened.connect(self.sidebar.select)
        self.actions.opened.connect(self._show_source)
        self.actions.opened.connect(self.switcher.follow)
        self.actions.notice.connect(lambda text, ms: self.statusBar().showMessage(text, ms))
        self.actions.undo_available.connect(self.undo_button.setVisible)
        self.undo_button.clicked.connect(self.actions.undo_delete)
        self.conversations.conversation_changed.connect(self._chat_changed)
        self.flow.notice.connect(lambda text, ms: self.statusBar().showMessage(text, ms))
        self.session.tools.status_changed.connect(
            lambda name, status: self.statusBar().showMessage(f"MCP server {name}: {status}", 8000))
        self.banner.choose_model_requested.connect(self.open_model_manager)
        self.model_bar.panel_button.toggled.connect(self.side.setVisible)

    def _chat_changed(self, conversation_id: int) -> None:
        if conversation_id == self.current:
            self._show_source()

    def _show_source(self, *_opened) -> None:
        """The model bar, the panel and the metrics polling follow where the chat on screen runs."""
        source = self.flow.source()
        choice = source.remote
        self.model_bar.show_remote(choice, routed=source.routed)
        self.side.show_source(choice)
        self.remote.watch(choice.server_id if choice else None)

    # -- what the menus do --------------------------------------------------------------------------

    def send(self, text: str) -> asyncio.Task | None:
        """Send ``text`` as if typed in the message box (see :meth:`ChatPane.send`)."""
        return self.pane.send(text)

    def edit_preferences(self) -> None:
        dialog = PreferencesDialog(self.personas.all(), self.settings.values, self,
                                   api_status=self.local_api.status(), check_kv=self.bridge.check_kv_formats,
                                   clear_disk=self.bridge.clear_disk_cache, tools=self.session.tools)
        if not dialog.exec():
            return
        tools_before = (self.settings["mcp_servers"], self.settings["tool_timeout_s"])
        api_before, cpu_before = dict(self.settings["api"]), engine_cpu_options(self.settings)
        speculation_before = self.settings["speculation"]
        load_before = {key: self.settings[key] for key in LOAD_SETTINGS}
        for key, value in dialog.result_values().items():
            self.settings[key] = value
        self.settings.save()
        if engine_cpu_options(self.settings) != cpu_before:
            self.bridge.set_cpu_options(**engine_cpu_options(self.settings))
        if self.settings["speculation"] != speculation_before:
            self.bridge.set_speculation(self.settings["speculation"])
        self.bridge.set_idle_unload(idle_unload_s(self.settings))
        load_after = {key: self.settings[key] for key in LOAD_SETTINGS}
        if load_after != load_before and self.bridge.config is not None:
            # the pool is rebuilt (another format, or with or without its disk tier): a reload, asked first where
            # replies are being written
            config = self.bridge.config
            self.switcher.reload(dataclasses.replace(config, **load_after))
        self.apply_theme(self.settings["theme"])
        self.set_text_scale(self.settings["text_scale"], save=False)
        if (self.settings["mcp_servers"], self.settings["tool_timeout_s"]) != tools_before:
            self.session.connect_tools()
        if self.settings["api"] != api_before or self.local_api.error:
            problem = self.local_api.apply(self.settings["api"])
            if problem:
                QMessageBox.warning(self, "Local API", problem)

    def apply_theme(self, choice: str) -> None:
        app = QApplication.instance()
        self.chat.set_dark(apply_theme(app, choice) if app is not None else False)

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
        self.pane.set_text_scale(percent)

    def set_highlight_drafts(self, on: bool) -> None:
        """Highlight, or not, the words of replies that came from kept draft tokens; remembered."""
        self.chat.set_highlight_drafts(on)
        if on != self.settings["highlight_drafts"]:
            self.settings["highlight_drafts"] = on
            self.settings.save()

    def focus_search(self) -> None:
        self.sidebar.search.setFocus()
        self.sidebar.search.selectAll()

    def choose_model(self) -> None:
        self.model_bar.model_box.setFocus()
        self.model_bar.model_box.showPopup()

    def show_shortcuts(self) -> ShortcutsDialog:
        self.shortcuts_dialog = getattr(self, "shortcuts_dialog", None) or ShortcutsDialog(self)
        self.shortcuts_dialog.show()
        self.shortcuts_dialog.raise_()
        return self.shortcuts_dialog

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

    def open_remote_servers(self) -> RemoteServersDialog:
        dialog = RemoteServersDialog(self.remote, self)
        dialog.open()
        return dialog

    def open_routing(self) -> RoutingDialog:
        """The routing rules and the latest evaluation; OK keeps the rules for every routed chat."""
        session = self.session
        dialog = RoutingDialog(session.routes(), list(self.bridge.all_stats()), load_saved(),
                               session.evaluate_routes, self)
        dialog.accepted.connect(lambda: session.set_routes(dialog.chosen()))
        dialog.open()
        return dialog

    def closeEvent(self, event) -> None:
        stop_following_system_scheme(self._system_scheme_changed)
        save_window(self, self.splitter)
        self.meter.cancel()
        self.session.shutdown()
        super().closeEvent(event)
