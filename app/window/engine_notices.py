"""What the window says about the local engine and the local API: the banner while no engine serves, the status
bar's notes on a load, and the API's address in the status bar."""

from __future__ import annotations

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QLabel, QStatusBar

from engine import EngineStats

from ..chats.session import ChatSession
from .engine_banner import EngineBanner
from .model_bar import ModelBar

API_TOOLTIP = "OpenAI-compatible: /v1/models, /v1/chat/completions, /v1/completions"


class EngineNotices(QObject):
    """The bridge's and the local API's news, shown in the banner, the status bar and the API label."""

    def __init__(self, session: ChatSession, banner: EngineBanner, model_bar: ModelBar, status_bar: QStatusBar,
                 api_label: QLabel, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session, self.banner, self.model_bar = session, banner, model_bar
        self.status_bar, self.api_label = status_bar, api_label
        bridge = session.bridge
        bridge.loaded.connect(self._loaded)
        bridge.load_failed.connect(self._load_failed)
        bridge.engine_failed.connect(banner.show_engine_stopped)
        banner.restart_requested.connect(self.restart_engine)
        session.local_api.changed.connect(self._api_changed)

    def restart_engine(self) -> None:
        """Load the last model again in a fresh engine (after it stopped, or after a failed load)."""
        self.banner.show_restarting()
        self.model_bar.progress.show()
        self.session.bridge.restart()

    def _loaded(self, stats: EngineStats) -> None:
        self.banner.hide()
        self.status_bar.showMessage(f"{stats.model_name} is ready", 4000)
        for warning in stats.warnings:
            self.status_bar.showMessage(f"Note: {warning}", 8000)

    def _load_failed(self, message: str) -> None:
        if self.session.bridge.serving:  # a failed switch: the previous model keeps serving
            self.status_bar.showMessage(f"Could not load the model: {message}", 15000)
            return
        self.banner.show_load_failed(message)

    def _api_changed(self, status: str) -> None:
        api = self.session.local_api
        self.api_label.setText(status)
        self.api_label.setToolTip(api.error or API_TOOLTIP)
        self.api_label.setVisible(bool(status))
        if api.error:
            self.status_bar.showMessage(api.error, 10000)
