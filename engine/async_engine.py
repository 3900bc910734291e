"""An engine that runs in its own thread and streams to asyncio code.

One background thread owns the model and every torch call. Other threads talk to it through a command
queue; outputs travel back to each caller's event loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .config import EngineConfig
from .engine import Engine, Prompt
from .metrics import EngineStats
from .outputs import RequestOutput
from .sampling import SamplingParams

log = logging.getLogger(__name__)
STATS_INTERVAL_S = 0.05


class RequestStream:
    """Async iterator over one request's outputs. Leaving it early, or cancelling, aborts the request."""

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self.request_id = request_id
        self._engine = engine
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        self._done = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:
            self.abort()
            raise
        if isinstance(item, BaseException):
            self._done = True
            raise item
        self._done = item.finished
        return item

    def abort(self) -> None:
        """Stop the request (no-op once it has finished)."""
        if not self._done:
            self._done = True
            self._engine.abort(self.request_id)

    async def aclose(self) -> None:
        self.abort()

    def __del__(self) -> None:
        if not self._done:
            self._engine.abort(self.request_id)

    def _deliver(self, item: RequestOutput | BaseException) -> None:
        self._queue.put_nowait(item)


class AsyncEngine:
    """The engine in a background thread; see DESIGN.md. Construction loads the model and may raise."""

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        progress=None,
        engine_factory: Callable[[], Engine] | None = None,
    ):
        self._commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, RequestStream]] = {}
        self._ids = itertools.count()
        self._stats: EngineStats | None = None
        self._stopping = False
        self._engine: Engine | None = None
        factory = engine_factory or (lambda: Engine(config, progress))
        loaded: Future[None] = Future()
        self._thread = threading.Thread(target=self._run, args=(factory, loaded), name="kvasir-engine", daemon=True)
        self._thread.start()
        loaded.result()

    # -- public API ---------------------------------------------------------------------------------

    def stream(self, prompt: Prompt, sampling: SamplingParams | None = None) -> RequestStream:
        """Start a request; iterate the result with ``async for`` to receive its outputs."""
        loop = asyncio.get_running_loop()
        request_id = f"areq-{next(self._ids)}"
        stream = RequestStream(self, request_id)
        self._streams[request_id] = (loop, stream)
        self._commands.put(("add", (request_id, prompt, sampling)))
        return stream

    def abort(self, request_id: str) -> None:
        """Abort a request from any thread."""
        self._commands.put(("abort", request_id))

    def call(self, fn: Callable[[Engine], Any]) -> Future:
        """Run ``fn(engine)`` on the engine thread between steps; returns a concurrent Future."""
        future: Future = Future()
        self._commands.put(("call", (fn, future)))
        return future

    async def run(self, fn: Callable[[Engine], Any]) -> Any:
        """Awaitable form of :meth:`call`."""
        return await asyncio.wrap_future(self.call(fn))

    async def switch_model(self, config: EngineConfig, progress=None) -> None:
        """Switch the model on the engine thread (see :meth:`Engine.switch_model`); raises if it fails."""

        def switch(engine: Engine) -> None:
            engine.switch_model(config, progress)
            self._dispatch(engine.step())  # deliver the aborts of interrupted requests
            self._stats = engine.stats()

        await self.run(switch)

    def stats(self) -> EngineStats:
        """The latest snapshot, refreshed by the engine thread; safe from any thread."""
        return self._stats

    @property
    def tokenizer(self):
        return self._engine.tokenizer

    def shutdown(self) -> None:
        """Abort everything and stop the thread."""
        if self._thread.is_alive():
            self._stopping = True
            self._commands.put(("stop", None))
            self._thread.join(timeout=30)

    # -- the engine thread --------------------------------------------------------------------------

    def _run(self, factory: Callable[[], Engine], loaded: Future) -> None:
        try:
            self._engine = factory()
        except BaseException as exc:  # reported to the constructor's caller
            loaded.set_exception(exc)
            return
        self._stats = self._engine.stats()
        loaded.set_result(None)
        last_stats = 0.0
        while not self._stopping:
            self._drain_commands(block=not self._engine.has_unfinished())
            if self._stopping:
                break
            outputs = self._safe_step()
            self._dispatch(outputs)
            now = time.monotonic()
            if now - last_stats >= STATS_INTERVAL_S or not self._engine.has_unfinished():
                self._stats, last_stats = self._engine.stats(), now
        self._engine.abort_all()
        self._dispatch(self._engine.step())

    def _drain_commands(self, block: bool) -> None:
        try:
            command = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(*command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _handle(self, kind: str, payload: Any) -> None:
        engine = self._engine
        if kind == "add":
            request_id, prompt, sampling = payload
            try:
                engine.add_request(prompt, sampling, request_id=request_id)
            except Exception as exc:
                self._deliver(request_id, exc)
        elif kind == "abort":
            engine.abort(payload)
        elif kind == "call":
            fn, future = payload
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(engine))
                except BaseException as exc:
                    future.set_exception(exc)
        elif kind == "stop":
            self._stopping = True

    def _safe_step(self) -> list[RequestOutput]:
        try:
            return self._engine.step()
        except Exception as exc:  # a failed forward pass ends the requests in it, not the engine
            log.exception("engine step failed")
            self._engine.abort_all(reason="error", error=f"the engine failed: {exc}")
            return self._engine.step()

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            self._deliver(out.request_id, out)
            if out.finished:
                self._streams.pop(out.request_id, None)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        entry = self._streams.get(request_id)
        if entry is None:
            return
        loop, stream = entry
        if isinstance(item, BaseException):
            self._streams.pop(request_id, None)
        try:
            loop.call_soon_threadsafe(stream._deliver, item)
        except RuntimeError:  # the caller's loop has closed
            self._streams.pop(request_id, None)
