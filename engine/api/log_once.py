"""A burst of the same log line is written once: the endpoint's loggers say a repeated error, then how often.

A flood of hostile clients (or a process out of open files) makes asyncio and uvicorn log one error per
connection; written out in full, that filled 180 MB of log in 80 s.
"""

from __future__ import annotations

import logging
import threading
import time

WINDOW_S = 60.0
LOGGERS = ("asyncio", "uvicorn.error", "engine.api")


class RepeatFilter(logging.Filter):
    """Lets a line through once per ``window_s``; the next one through says how many were held back."""

    def __init__(self, window_s: float = WINDOW_S, clock=time.monotonic) -> None:
        super().__init__()
        self.window_s, self.clock = window_s, clock
        self._seen: dict[tuple, list] = {}  # key -> [when it was last written, how many held back since]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage().split("\n", 1)[0][:200])
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window_s:
                seen[1] += 1
                return False
            held = seen[1] if seen else 0
            self._seen[key] = [now, 0]
            if len(self._seen) > 1000:
                self._forget_old(now)
        if held:
            record.msg = f"{record.msg} (and {held:,} more like it in the last {self.window_s:g} s, not written)"
        return True

    def _forget_old(self, now: float) -> None:
        for key in [k for k, (when, held) in self._seen.items() if now - when >= self.window_s and not held]:
            del self._seen[key]


_filter = RepeatFilter()


def quieten_repeats(loggers: tuple[str, ...] = LOGGERS) -> RepeatFilter:
    """Put the one repeat filter on the endpoint's loggers (again is harmless)."""
    for name in loggers:
        logger = logging.getLogger(name)
        if _filter not in logger.filters:
            logger.addFilter(_filter)
    return _filter
