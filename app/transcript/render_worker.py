"""Markdown for long messages, laid out into segments on a thread of its own, so the window never waits for it.

Parsing Markdown is pure Python: a 30 kB table took 160 ms, a 100 kB reply 270 ms. The view asks here for any text
longer than :data:`SYNC_RENDER_CHARS`; the newest text of each message replaces any older one still waiting, and
the segments come back to the GUI thread through :attr:`RenderWorker.rendered`.

While it parses, the thread shares the interpreter with the GUI thread, which needs it for every Python slot,
event filter and size hint: each time it waits for the parser's turn to end. At Python's usual 5 ms turns that
stalled the window for 350 ms on a 120 kB table; while a layout runs, turns are :data:`SWITCH_INTERVAL_S`.
After each layout the thread rests as long as the layout took (at most :data:`MAX_REST_S`): a long reply
streaming in would otherwise keep a core busy laying out again and again, a core the engine decodes on.
"""

from __future__ import annotations

import sys
import threading
import time

from PySide6.QtCore import QObject, Signal

from .markdown import MarkdownRenderer

SYNC_RENDER_CHARS = 8_000  # shorter texts render at once, in a few milliseconds
SWITCH_INTERVAL_S = 0.001
MAX_REST_S = 0.5


class RenderWorker(QObject):
    """``ask(key, text, dark)`` from the GUI thread; ``rendered(key, text, dark, segments)`` arrives on it."""

    rendered = Signal(int, str, bool, object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._jobs = _Jobs()
        self._thread: threading.Thread | None = None
        self.destroyed.connect(self._jobs.close)

    def ask(self, key: int, text: str, dark: bool) -> None:
        """Lay out ``text`` for ``key``, replacing a text for the same key that has not started yet."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, args=(self._jobs,), name="kvasir-markdown",
                                            daemon=True)
            self._thread.start()
        self._jobs.put(key, text, dark)

    @property
    def busy(self) -> bool:
        """Whether a text is waiting or being laid out."""
        return self._jobs.busy

    def close(self) -> None:
        self._jobs.close()

    def _serve(self, jobs: _Jobs) -> None:
        renderer = MarkdownRenderer()  # this thread's own: a renderer keeps state while it renders
        while (job := jobs.take()) is not None:
            key, text, dark = job
            renderer.dark = dark
            started = time.perf_counter()
            usual = sys.getswitchinterval()
            sys.setswitchinterval(min(usual, SWITCH_INTERVAL_S))
            try:
                segments = renderer.segments(text)
            finally:
                sys.setswitchinterval(usual)
            try:
                self.rendered.emit(key, text, dark, segments)
            except RuntimeError:  # the view has gone
                return
            finally:
                jobs.done()
            time.sleep(min(MAX_REST_S, time.perf_counter() - started))


class _Jobs:
    """The texts waiting, the newest per key."""

    def __init__(self) -> None:
        self._waiting: dict[int, tuple[str, bool]] = {}
        self._ready = threading.Condition()
        self._closed = False
        self._working = False

    def put(self, key: int, text: str, dark: bool) -> None:
        with self._ready:
            self._waiting[key] = (text, dark)
            self._ready.notify()

    def take(self) -> tuple[int, str, bool] | None:
        with self._ready:
            while not self._waiting and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            key = next(iter(self._waiting))
            self._working = True
            return (key, *self._waiting.pop(key))

    def done(self) -> None:
        with self._ready:
            self._working = False

    @property
    def busy(self) -> bool:
        with self._ready:
            return self._working or bool(self._waiting)

    def close(self, *_args) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify_all()
