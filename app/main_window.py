"""The main window: top bar (model, quantisation, device), sidebar, chat, composer and the live panel."""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path

from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from engine import AUTO_QUANTIZATION_RULE, QUANTIZATIONS, EngineConfig, EngineStats, ModelLibrary

from .bridge import EngineBridge
from .chat_controller import ChatController
from .chat_settings import ChatSettingsDialog, PreferencesDialog
from .chat_view import ChatView
from .composer import Composer
from .conversation_list import ConversationSidebar
from .engine_banner import EngineBanner, not_ready_message
from .export import from_json, to_json, to_markdown
from .metrics_panel import MetricsPanel
from .model_dialog import ModelDialog
from .settings import Settings, load_presets
from .store import Message, Store
from .theme import apply_theme


class MainWindow(QMainWindow):
    """Wires the parts together; the logic lives in the controller, the bridge and the store."""

    def __init__(self, store: Store, bridge: EngineBridge, library: ModelLibrary | None = None,
                 settings: Settings | None = None) -> None:
        super().__init__()
        self.setWindowTitle("Kvasir")
        self.store, self.bridge = store, bridge
        self.library = library or ModelLibrary()
        self.settings = settings or Settings()
        self.presets = load_presets()
        self.controller = ChatController(store, bridge, self)
        self.current: int | None = None
        self._build()
        self._connect()
        self._shortcuts()
        self._restore_geometry()
        self.apply_theme(self.settings["theme"])
        conversations = store.conversations()
        self.open_conversation(conversations[0].id if conversations else self._create_conversation().id)

    # -- layout -------------------------------------------------------------------------------------

    def _build(self) -> None:
        self.model_box = QComboBox()
        self.model_box.setToolTip("Model (Ctrl+K)")
        self.model_box.setMinimumWidth(220)
        self._fill_model_box()
        self.quant_box = QComboBox()
        self.quant_box.addItems(QUANTIZATIONS)
        self.quant_box.setToolTip("Quantisation. " + AUTO_QUANTIZATION_RULE)
        self.progress = QProgressBar(maximumWidth=220, textVisible=True)
        self.progress.hide()
        self.device_label = QLabel("loading…")
        self.device_label.setObjectName("deviceLabel")
        self.panel_button = QPushButton("Engine panel", checkable=True, checked=True)
        top = QHBoxLayout()
        top.setContentsMargins(8, 6, 8, 0)
        for widget in (QLabel("Model"), self.model_box, self.quant_box, self.progress):
            top.addWidget(widget)
        top.addStretch(1)
        top.addWidget(self.device_label)
        top.addWidget(self.panel_button)

        self.sidebar = ConversationSidebar(self.store)
        self.chat = ChatView()
        self.composer = Composer()
        center = QWidget()
        center_layout = QVBoxLayout(center)
        center_layout.setContentsMargins(0, 0, 0, 0)
        self.persona_button = QPushButton("Persona")
        self.persona_button.setFlat(True)
        self.persona_button.setToolTip("Chat settings: persona and sampling")
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
        self.panel = MetricsPanel()
        self.splitter = QSplitter(Qt.Horizontal)
        for widget, stretch in ((self.sidebar, 0), (center, 1), (self.panel, 0)):
            self.splitter.addWidget(widget)
            self.splitter.setStretchFactor(self.splitter.indexOf(widget), stretch)
        self.splitter.setSizes([230, 650, 300])
        self.undo_button = QPushButton("Undo delete")
        self.undo_button.hide()
        self.statusBar().addPermanentWidget(self.undo_button)
        self._deleted: list[int] = []
        self._build_menus()
        root = QWidget()
        layout = QVBoxLayout(root)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(top)
        layout.addWidget(self.splitter, 1)
        self.setCentralWidget(root)
        self.resize(1280, 800)

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file_menu = bar.addMenu("&File")
        file_menu.addAction("New chat", self.new_conversation)
        file_menu.addAction("Import chat…", self._ask_import)
        file_menu.addAction("Preferences…", self.edit_preferences)
        file_menu.addSeparator()
        file_menu.addAction("Quit", self.close)
        models_menu = bar.addMenu("&Models")
        models_menu.addAction("Model manager…", self.open_model_manager)
        chat_menu = bar.addMenu("&Chat")
        chat_menu.addAction("Regenerate last reply", self.regenerate)
        chat_menu.addAction("Stop", self.stop)
        chat_menu.addAction("Chat settings…", self.edit_chat_settings)

    def _connect(self) -> None:
        self.sidebar.selected.connect(self.open_conversation)
        self.sidebar.new_requested.connect(self.new_conversation)
        self.composer.send.connect(self.send)
        self.chat.action.connect(self._chat_action)
        self.sidebar.action_requested.connect(self._sidebar_action)
        self.undo_button.clicked.connect(self.undo_delete)
        self.composer.stop.connect(self.stop)
        self.controller.reply_started.connect(self._reply_started)
        self.controller.reply_delta.connect(self._reply_delta)
        self.controller.reply_finished.connect(self._reply_finished)
        self.bridge.load_progress.connect(self._load_progress)
        self.bridge.loaded.connect(self._loaded)
        self.bridge.load_failed.connect(self._load_failed)
        self.bridge.stats_updated.connect(self._stats)
        self.bridge.engine_failed.connect(self._engine_failed)
        self.banner.restart_requested.connect(self.restart_engine)
        self.banner.choose_model_requested.connect(self.open_model_manager)
        self.panel_button.toggled.connect(self.panel.setVisible)
        self.model_box.activated.connect(lambda _: self._switch())
        self.quant_box.activated.connect(lambda _: self._switch())

    def _shortcuts(self) -> None:
        bindings = {
            "Ctrl+N": self.new_conversation,
            "Escape": self.stop,
            "Ctrl+F": lambda: self.sidebar.search.setFocus(),
            "Ctrl+K": lambda: (self.model_box.setFocus(), self.model_box.showPopup()),
            "Ctrl+L": lambda: self.composer.edit.setFocus(),
            "Ctrl+Z": self.undo_delete,
            "Ctrl+R": self.regenerate,
        }
        for keys, action in bindings.items():
            QShortcut(QKeySequence(keys), self, activated=action)

    # -- actions ------------------------------------------------------------------------------------

    def open_conversation(self, conversation_id: int) -> None:
        self.current = conversation_id
        self.sidebar.select(conversation_id)
        self._refresh_chat()
        self.composer.set_generating(self.controller.is_generating(conversation_id))
        self.composer.edit.setFocus()

    def new_conversation(self) -> None:
        conv = self._create_conversation()
        self.sidebar.model.refresh()
        self.open_conversation(conv.id)

    def _create_conversation(self, like: int | None = None):
        """A new chat with the default persona and sampling (or those of conversation ``like``)."""
        if like is not None:
            source = self.store.conversation(like)
            settings = {k: v for k, v in source.settings.items() if k != "skip_messages"}
            return self.store.create_conversation("New chat", source.system_prompt, source.preset, settings)
        preset = next((p for p in self.presets if p.name == self.settings["preset"]), None)
        return self.store.create_conversation("New chat", preset.system_prompt if preset else "",
                                              preset.name if preset else None, dict(self.settings["sampling"]))

    def edit_chat_settings(self) -> None:
        conv = self.store.conversation(self.current)
        sampling = {**self.settings["sampling"], **conv.settings}
        dialog = ChatSettingsDialog(self.presets, conv.preset, conv.system_prompt, sampling, self)
        if dialog.exec():
            values = dialog.result_values()
            settings = {**conv.settings, **values["settings"]}
            self.store.update_conversation(self.current, preset=values["preset"],
                                           system_prompt=values["system_prompt"], settings=settings)
            self._update_header()

    def edit_preferences(self) -> None:
        dialog = PreferencesDialog(self.presets, self.settings.values, self)
        if dialog.exec():
            for key, value in dialog.result_values().items():
                self.settings[key] = value
            self.settings.save()
            self.apply_theme(self.settings["theme"])

    def apply_theme(self, choice: str) -> None:
        app = QApplication.instance()
        dark = apply_theme(app, choice) if app is not None else False
        self.chat.set_dark(dark)

    def send(self, text: str) -> asyncio.Task | None:
        if not self.bridge.ready:
            self.statusBar().showMessage(not_ready_message(self.bridge), 6000)
            return None
        editing = self.composer.editing_id
        if editing is None and not self._make_room(text):
            return None
        self.composer.clear()
        if editing is not None:
            task = self.controller.edit(self.current, editing, text)
        else:
            task = self.controller.send(self.current, text)
        self.sidebar.model.refresh()
        self.sidebar.select(self.current)
        return task

    def _make_room(self, text: str) -> bool:
        """When the next message would not fit the context, ask: drop the oldest turns or start a new chat."""
        stats = self.bridge.stats()
        if stats is None:
            return True
        limit = stats.max_model_len
        needed = self.controller.context_needed(self.current, text, self.bridge.count_tokens)
        if needed <= limit:
            return True
        choice = self.ask_overflow(needed, limit)
        if choice == "drop":
            if self.controller.drop_oldest_turns(self.current, text, self.bridge.count_tokens, limit):
                self._refresh_chat()
                return True
            QMessageBox.warning(self, "Message too long",
                                "This message does not fit the model's context even on its own. Shorten it, or "
                                "lower 'Max tokens per reply' in the chat settings.")
            return False
        if choice == "new":
            conv = self._create_conversation(like=self.current)
            self.sidebar.model.refresh()
            self.open_conversation(conv.id)
            return self._make_room(text)
        return False  # cancelled: the text stays in the box

    def ask_overflow(self, needed: int, limit: int) -> str | None:
        """'drop', 'new' or None (cancel)."""
        box = QMessageBox(QMessageBox.Question, "The conversation is full",
                          f"This message and its reply need {needed:,} tokens, but the model reads at most "
                          f"{limit:,}. Nothing you wrote is deleted either way.", parent=self)
        drop = box.addButton("Stop sending the oldest turns", QMessageBox.AcceptRole)
        new = box.addButton("Start a new chat", QMessageBox.ActionRole)
        box.addButton(QMessageBox.Cancel)
        box.exec()
        return {drop: "drop", new: "new"}.get(box.clickedButton())

    def stop(self) -> None:
        if self.current is not None and self.controller.is_generating(self.current):
            self.controller.stop(self.current)
        else:
            self.composer.cancel_editing()

    def regenerate(self) -> asyncio.Task | None:
        if self.current is None or not self.bridge.ready:
            return None
        task = self.controller.regenerate(self.current)
        self._refresh_chat()
        return task

    def _chat_action(self, kind: str, message_id: int) -> None:
        if kind == "edit":
            self.composer.start_editing(message_id, self.store.message(message_id).text)
        elif kind == "regenerate":
            self.regenerate()
        elif kind in ("previous", "next"):
            self.show_version(message_id, -1 if kind == "previous" else 1)

    def show_version(self, message_id: int, step: int) -> None:
        """Go to the previous or next version of a message (and the turns that followed it)."""
        versions = self.store.siblings(message_id)
        index = [m.id for m in versions].index(message_id) + step
        if 0 <= index < len(versions) and not self.controller.is_generating(self.current):
            self.store.select_branch(versions[index].id)
            self._refresh_chat()

    # -- conversation actions -----------------------------------------------------------------------

    def _sidebar_action(self, kind: str, conversation_id: int) -> None:
        if kind == "rename":
            title, ok = QInputDialog.getText(self, "Rename chat", "Title:",
                                             text=self.store.conversation(conversation_id).title)
            if ok and title.strip():
                self.rename_conversation(conversation_id, title.strip())
        elif kind == "pin":
            self.toggle_pin(conversation_id)
        elif kind == "delete":
            self.delete_conversation(conversation_id)
        elif kind in ("export-md", "export-json"):
            suffix = ".md" if kind == "export-md" else ".json"
            title = self.store.conversation(conversation_id).title
            path, _ = QFileDialog.getSaveFileName(self, "Export chat", _safe_file_name(title) + suffix)
            if path:
                self.export_conversation(conversation_id, Path(path))

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.update_conversation(conversation_id, title=title)
        self.sidebar.model.refresh()
        self.sidebar.select(self.current)

    def toggle_pin(self, conversation_id: int) -> None:
        pinned = self.store.conversation(conversation_id).pinned
        self.store.update_conversation(conversation_id, pinned=not pinned)
        self.sidebar.model.refresh()
        self.sidebar.select(self.current)

    def delete_conversation(self, conversation_id: int) -> None:
        """Hide the chat; Undo in the status bar (or Ctrl+Z) brings it back."""
        self.controller.stop(conversation_id)
        title = self.store.conversation(conversation_id).title
        self.store.delete_conversation(conversation_id)
        self._deleted.append(conversation_id)
        self.sidebar.model.refresh()
        if conversation_id == self.current:
            remaining = self.store.conversations()
            self.open_conversation(remaining[0].id if remaining else self.store.create_conversation().id)
            self.sidebar.model.refresh()
        self.statusBar().showMessage(f"Deleted “{title}”. Undo with Ctrl+Z.", 10000)
        self.undo_button.show()

    def undo_delete(self) -> None:
        if not self._deleted:
            return
        conversation_id = self._deleted.pop()
        self.store.undelete_conversation(conversation_id)
        self.sidebar.model.refresh()
        self.open_conversation(conversation_id)
        self.undo_button.setVisible(bool(self._deleted))
        self.statusBar().showMessage("Restored.", 3000)

    def export_conversation(self, conversation_id: int, path: Path) -> None:
        text = to_json(self.store, conversation_id) if path.suffix == ".json" else to_markdown(
            self.store, conversation_id)
        path.write_text(text, encoding="utf-8")
        self.statusBar().showMessage(f"Exported to {path}", 5000)

    def import_conversation(self, path: Path) -> int | None:
        try:
            conversation_id = from_json(self.store, path.read_text(encoding="utf-8"))
        except (OSError, ValueError, sqlite3.Error) as exc:  # the file is refused as a whole; nothing was added
            QMessageBox.warning(self, "Import failed", f"{path.name} could not be imported: {exc}")
            return None
        self.sidebar.model.refresh()
        self.open_conversation(conversation_id)
        return conversation_id

    def _ask_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import chat", "", "Kvasir chats (*.json)")
        if path:
            self.import_conversation(Path(path))

    def _switch(self) -> None:
        config = EngineConfig(model=self.model_box.currentData(), quantization=self.quant_box.currentText())
        self.progress.show()
        asyncio.ensure_future(self.bridge.switch(config))

    def open_model_manager(self) -> ModelDialog:
        dialog = ModelDialog(self.library, self.quant_box.currentText(), self)
        dialog.load_requested.connect(self.load_model)
        dialog.finished.connect(lambda _: self._fill_model_box())
        dialog.open()
        return dialog

    def load_model(self, spec: str, quantization: str) -> None:
        self._fill_model_box()
        self.model_box.setCurrentIndex(max(0, self.model_box.findData(spec)))
        self.quant_box.setCurrentText(quantization)
        self._switch()

    def _fill_model_box(self) -> None:
        current = self.model_box.currentData()
        self.model_box.clear()
        for entry in self.library.entries():
            self.model_box.addItem(entry.name, entry.spec)
        self.model_box.setCurrentIndex(max(0, self.model_box.findData(current)))

    # -- updates ------------------------------------------------------------------------------------

    def _refresh_chat(self) -> None:
        thread = self.store.thread(self.current)
        versions = {}
        for message in thread:
            siblings = [m.id for m in self.store.siblings(message.id)]
            if len(siblings) > 1:
                versions[message.id] = (siblings.index(message.id) + 1, len(siblings))
        skipped = self.store.conversation(self.current).settings.get("skip_messages", 0)
        self.chat.show_thread(thread, self.controller.streaming.get(self.current, {}), versions, skipped)
        self._update_header()

    def _update_header(self) -> None:
        conv = self.store.conversation(self.current)
        persona = conv.preset or ("Custom persona" if conv.system_prompt else "No system prompt")
        self.persona_button.setText(f"Persona: {persona}")
        self.persona_button.setToolTip(conv.system_prompt or "No system prompt")

    def _reply_started(self, conversation_id: int, reply_id: int) -> None:
        if conversation_id == self.current:
            self.composer.set_generating(True)
            self._refresh_chat()

    def _reply_delta(self, conversation_id: int, reply_id: int, text: str) -> None:
        if conversation_id == self.current:
            self.chat.update_streaming(reply_id, text)

    def _reply_finished(self, conversation_id: int, message: Message) -> None:
        if message.stats.get("ttft_s") is not None:
            self.panel.record_ttft(message.stats["ttft_s"])
        if conversation_id == self.current:
            self.composer.set_generating(False)
            self._refresh_chat()
        self.sidebar.model.refresh()
        if self.current is not None:
            self.sidebar.select(self.current)

    def _load_progress(self, fraction: float, phrase: str) -> None:
        self.progress.show()
        self.progress.setValue(int(fraction * 100))
        self.progress.setFormat(f"{phrase} %p%")

    def _loaded(self, stats: EngineStats) -> None:
        self.progress.hide()
        self.banner.hide()
        self._stats(stats)
        self.statusBar().showMessage(f"{stats.model_name} is ready", 4000)
        for warning in stats.warnings:
            self.statusBar().showMessage(f"Note: {warning}", 8000)

    def _load_failed(self, message: str) -> None:
        self.progress.hide()
        if self.bridge.serving:  # a failed switch: the previous model keeps serving
            self.statusBar().showMessage(f"Could not load the model: {message}", 15000)
            return
        self.device_label.setText("no model loaded")
        self.banner.show_load_failed(message)

    def _engine_failed(self, reason: str) -> None:
        self.progress.hide()
        self.device_label.setText("engine stopped")
        self.banner.show_engine_stopped(reason)

    def restart_engine(self) -> None:
        """Load the last model again in a fresh engine (after it stopped, or after a failed load)."""
        self.banner.show_restarting()
        self.progress.show()
        self.bridge.restart()

    def _stats(self, stats: EngineStats) -> None:
        self.device_label.setText(f"{stats.device.upper()} · {stats.device_reason}")
        if self.panel.isVisible():
            owners = {}
            for request_id, conversation_id in self.controller.request_owners.items():
                try:
                    owners[request_id] = (conversation_id, self.store.conversation(conversation_id).title)
                except KeyError:
                    continue
            self.panel.update_stats(stats, owners)
        if self.current is not None and self.bridge.ready:
            self._update_context_meter(stats)

    def _update_context_meter(self, stats: EngineStats) -> None:
        try:
            used = self.bridge.count_tokens(self.controller.messages_for_model(self.current))
        except Exception:
            return
        self.composer.set_context(used, stats.max_model_len)

    # -- window state -------------------------------------------------------------------------------

    def _restore_geometry(self) -> None:
        settings = QSettings("Kvasir", "Kvasir")
        if settings.value("geometry"):
            self.restoreGeometry(settings.value("geometry"))
        if settings.value("splitter"):
            self.splitter.restoreState(settings.value("splitter"))

    def closeEvent(self, event) -> None:
        settings = QSettings("Kvasir", "Kvasir")
        settings.setValue("geometry", self.saveGeometry())
        settings.setValue("splitter", self.splitter.saveState())
        for task in list(self.controller.tasks.values()):
            task.cancel()
        super().closeEvent(event)


def _safe_file_name(title: str) -> str:
    return re.sub(r"[^\w\- ]+", "", title).strip() or "chat"
