"""The last few minutes of the engine's numbers, for the panel's charts. No Qt: every stats snapshot feeds it,
whether or not a chart is on screen, and a chart reads it only when it draws."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from engine import EngineStats

HISTORY_S = 300.0  # what the charts can show: five minutes
MIN_SPAN_S = 60.0  # the time axis never spans less, so a fresh start does not stretch a few points


@dataclass(frozen=True, slots=True)
class Series:
    """What one chart line shows: its name, its unit and how to read one sample from a snapshot."""

    name: str
    unit: str
    value: Callable[[EngineStats], float]


RATE_SERIES = {
    "decode": Series("Decode", "tok/s", lambda s: s.decode_tokens_per_s),
    "token_gap": Series("Gap between tokens, p99", "ms", lambda s: 1000.0 * (s.inter_token_p99_s or 0.0)),
    "prefill": Series("Prefill", "tok/s", lambda s: s.prefill_tokens_per_s),
    "kv_usage": Series("KV cache in use", "%", lambda s: 100.0 * s.kv_usage),
}
REQUEST_SERIES = ("ttft", "queue")  # per request, in ms, at the time the panel learned of its first token


class EngineHistory:
    """Samples of each :data:`RATE_SERIES` per snapshot and each request's TTFT and queue time, as ``(t, value)``
    pairs on ``clock``'s seconds, kept for ``span_s``."""

    def __init__(self, span_s: float = HISTORY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.span_s, self._clock = span_s, clock
        self.points: dict[str, deque[tuple[float, float]]] = {k: deque() for k in (*RATE_SERIES, *REQUEST_SERIES)}
        self.appended = dict.fromkeys(self.points, 0)  # points ever added per series: a chart draws only the new
        self._last_first_token = 0
        self.latest: float | None = None  # when the newest snapshot came: the charts' "now"

    def add(self, stats: EngineStats, now: float | None = None) -> int:
        """Record one snapshot; returns how many requests' first tokens were new in it."""
        now = self._clock() if now is None else now
        self.latest = now
        for key, series in RATE_SERIES.items():
            self._append(key, now, float(series.value(stats)))
        new = self._add_first_tokens(stats, now)
        self._trim(now)
        return new

    def _add_first_tokens(self, stats: EngineStats, now: float) -> int:
        tokens = stats.first_tokens
        if tokens and tokens[-1].number < self._last_first_token:
            self._last_first_token = 0  # a new engine (a restart) counts from one again
        new = [t for t in tokens if t.number > self._last_first_token]
        for token in new:
            self._append("ttft", now, 1000.0 * token.ttft_s)
            self._append("queue", now, 1000.0 * token.queue_time_s)
        if new:
            self._last_first_token = new[-1].number
        return len(new)

    def _append(self, key: str, t: float, value: float) -> None:
        self.points[key].append((t, value))
        self.appended[key] += 1

    def _trim(self, now: float) -> None:
        for points in self.points.values():
            while points and points[0][0] < now - self.span_s:
                points.popleft()

    def values(self, key: str) -> list[float]:
        return [v for _, v in self.points[key]]

    def span(self) -> float:
        """Seconds the time axis covers: the recorded time in whole minutes, at least :data:`MIN_SPAN_S`, at most
        ``span_s``."""
        starts = [p[0][0] for p in self.points.values() if p]
        recorded = self.latest - min(starts) if starts else 0.0
        return min(self.span_s, max(MIN_SPAN_S, _round_up(recorded, MIN_SPAN_S)))

    def ceiling(self, keys: Iterable[str], floor: float, cap: float | None = None) -> float:
        """The top of a value axis that holds every recorded value of ``keys``: a round number, at least
        ``floor``, at most ``cap``."""
        top = max((v for k in keys for _, v in self.points[k]), default=0.0)
        ceiling = max(floor, nice_ceiling(top))
        return min(ceiling, cap) if cap is not None else ceiling


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten that is at least ``value`` (0 for nothing)."""
    if value <= 0 or not math.isfinite(value):
        return 0.0
    power = 10.0 ** math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * power >= value * (1 - 1e-12):
            return step * power
    return 10.0 * power


def _round_up(value: float, unit: float) -> float:
    return math.ceil(value / unit) * unit
