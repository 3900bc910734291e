"""The local OpenAI-compatible endpoint inside the app: off by default, on from Preferences.

When on, it serves from its own thread and asyncio loop over the same :class:`AsyncEngine` the bridge holds,
asked for at every request, so it always serves the model the window serves (across switches and restarts).
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from engine import ApiConfig, ApiConfigError, ApiServer, AsyncEngine, ServerStartError

STOP_GRACE_S = 0.5  # open streams get this long when the user turns the endpoint off, then are cut


class LocalApi(QObject):
    """Starts and stops the endpoint from the ``api`` settings; ``changed`` fires with :meth:`status` text."""

    changed = Signal(str)

    def __init__(self, engine: Callable[[], AsyncEngine | None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._engine = engine
        self._server: ApiServer | None = None
        self.error: str | None = None  # why the endpoint the user turned on does not run

    @property
    def url(self) -> str | None:
        """The base URL while the endpoint runs, else None."""
        return self._server.url if self._server is not None and self._server.running else None

    def apply(self, values: dict) -> str | None:
        """Run the endpoint as ``values`` say (``enabled``, ``host``, ``port``, ``api_key``); the reason it could
        not start, or None."""
        self._stop()
        self.error = None
        if values.get("enabled"):
            self.error = self._start(values)
        self.changed.emit(self.status())
        return self.error

    def _start(self, values: dict) -> str | None:
        try:
            config = ApiConfig(values["host"], values["port"], values.get("api_key") or None)
            server = ApiServer(self._engine, config, graceful_stop_s=STOP_GRACE_S)
            server.start()
        except (ApiConfigError, ServerStartError) as exc:
            return f"The local API could not start: {exc}."
        self._server = server
        return None

    def status(self) -> str:
        """One line for the status bar and Preferences ("" while off)."""
        if self.error:
            return "Local API off: " + self.error.removeprefix("The local API could not start: ")
        if self.url:
            return f"Local API on at {self.url}"
        return ""

    def shutdown(self) -> None:
        """Stop the endpoint (the app is closing)."""
        self._stop()

    def _stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None
