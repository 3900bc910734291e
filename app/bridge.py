"""The one place that holds the engine. Loads it in the background and turns its work into Qt signals.

The engine's own thread does every torch call; this object only forwards requests to it and relays what
comes back, so the GUI thread never runs torch.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

from PySide6.QtCore import QObject, QTimer, Signal

from engine import AsyncEngine, EngineConfig, EngineStats, RequestOutput, SamplingParams

STATS_INTERVAL_MS = 250


class EngineBridge(QObject):
    """Owns the :class:`AsyncEngine`; emits load progress, load results and stats snapshots."""

    load_progress = Signal(float, str)
    loaded = Signal(object)  # EngineStats
    load_failed = Signal(str)
    stats_updated = Signal(object)  # EngineStats

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.engine: AsyncEngine | None = None
        self.config: EngineConfig | None = None
        self.loading = False
        self.load_error: str | None = None  # why the last load failed
        self._timer = QTimer(self)
        self._timer.setInterval(STATS_INTERVAL_MS)
        self._timer.timeout.connect(self._poll_stats)
        self.loaded.connect(lambda _: self._timer.start())

    @property
    def ready(self) -> bool:
        return self.engine is not None and not self.loading

    def start(self, config: EngineConfig) -> None:
        """Load the first model in a background thread; the window stays responsive."""
        self.config, self.loading, self.load_error = config, True, None
        threading.Thread(target=self._load, args=(config,), name="kvasir-load", daemon=True).start()

    def _load(self, config: EngineConfig) -> None:
        try:
            engine = AsyncEngine(config, progress=self._report_progress)
        except Exception as exc:  # shown to the user in words
            self.loading, self.load_error = False, str(exc)
            self.load_failed.emit(str(exc))
            return
        self.engine, self.loading = engine, False
        self.loaded.emit(engine.stats())

    def _report_progress(self, fraction: float, phrase: str) -> None:
        self.load_progress.emit(fraction, phrase)

    async def switch(self, config: EngineConfig) -> None:
        """Switch model or quantisation; on failure the previous model keeps serving and load_failed says why."""
        if self.engine is None:
            self.start(config)
            return
        self.loading = True
        try:
            await self.engine.switch_model(config, progress=self._report_progress)
        except Exception as exc:
            self.load_error = str(exc)
            self.load_failed.emit(str(exc))
        else:
            self.config = config
            self.loaded.emit(self.engine.stats())
        finally:
            self.loading = False

    def stream(self, messages: list[dict], sampling: SamplingParams) -> AsyncIterator[RequestOutput]:
        """Stream a reply to chat ``messages``; leaving the loop stops it."""
        return self.engine.stream(messages, sampling)

    def count_tokens(self, messages: list[dict]) -> int:
        """Prompt tokens of ``messages`` with the chat template (tokenizers are safe to use off the engine thread)."""
        tokenizer = self.engine.tokenizer
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine else None

    def _poll_stats(self) -> None:
        if self.engine is not None:
            self.stats_updated.emit(self.engine.stats())

    def shutdown(self) -> None:
        self._timer.stop()
        if self.engine is not None:
            self.engine.shutdown()


async def wait_for(signal, timeout: float):
    """Await the next emission of a Qt ``signal`` (its arguments), inside the qasync loop."""
    future = asyncio.get_running_loop().create_future()

    def done(*args):
        if not future.done():
            future.set_result(args)

    signal.connect(done)
    try:
        return await asyncio.wait_for(future, timeout)
    finally:
        signal.disconnect(done)
