"""A remote server's own view of its KV cache, from its Prometheus ``/metrics`` text.

The names are the servers' documented ones:

- vLLM: ``vllm:kv_cache_usage_perc`` (0..1; ``vllm:gpu_cache_usage_perc`` before v0.10), prefix-cache counters
  ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries`` (tokens; exported with ``_total``, and
  ``vllm:gpu_prefix_cache_*`` in older releases), ``vllm:num_requests_running`` / ``_waiting``;
- SGLang (``--enable-metrics``): ``sglang:token_usage`` (0..1), ``sglang:cache_hit_rate`` (0..1),
  ``sglang:num_running_reqs`` / ``sglang:num_queue_reqs``;
- llama.cpp's llama-server (``--metrics``): ``llamacpp:kv_cache_usage_ratio`` (older builds only; current ones
  report no KV usage), ``llamacpp:prompt_tokens_total`` (prompt tokens computed, cached ones excluded) and
  ``llamacpp:prompt_tokens_cached_total``, ``llamacpp:requests_processing`` / ``_deferred``;
- Kvasir's own endpoint (``engine/api/metrics.py``): vLLM's names with the prefix ``kvasir:`` (the names in
  ``engine/serving/prometheus_names.py``, read here from the same module).

Counters are totals since the server started; :class:`HitRateWindow` turns two readings into the hit rate of
the prompts in between, like the local engine's recent window.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from dataclasses import dataclass

from ..serving import prometheus_names as names

SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
WINDOW_S = 60.0  # the hit rate covers the prompts of about the last minute

KV_USAGE = {"vLLM": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            "SGLang": ("sglang:token_usage",),
            "llama.cpp": ("llamacpp:kv_cache_usage_ratio",),
            "Kvasir": (names.KV_CACHE_USAGE,)}
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing",
           names.REQUESTS_RUNNING)
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred",
           names.REQUESTS_WAITING)
PREFIX_COUNTERS = {  # kind: (cached-token counters, queried-token counters), first name found wins
    "vLLM": (("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
             ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")),
    "Kvasir": ((names.PREFIX_CACHE_HITS,), (names.PREFIX_CACHE_QUERIES,)),
}


Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_prometheus(text: str) -> Samples:
    """Every sample of a Prometheus text exposition: name -> [(labels, value)]. Comments, malformed lines and
    NaN values are skipped; ``+Inf`` is kept."""
    samples: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if match is None:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        labels = {k: _unescape(v) for k, v in LABEL.findall(match["labels"] or "")}
        samples.setdefault(match["name"], []).append((labels, value))
    return samples


@dataclass(frozen=True, slots=True)
class ServerMetrics:
    """What the server says of itself; ``None`` for each number it does not report.

    ``prefix_hit_rate`` is cached / prompt tokens, over the recent window when counters are read twice
    (``hit_rate_recent``), else since the server started. ``cache_counters`` carry the raw totals for that
    window: (cached tokens, prompt tokens)."""

    server_kind: str | None  # "vLLM" | "SGLang" | "llama.cpp" | "Kvasir" | None (nothing recognised)
    kv_usage: float | None = None
    prefix_hit_rate: float | None = None
    num_running: int | None = None
    num_waiting: int | None = None
    cache_counters: tuple[float, float] | None = None
    hit_rate_recent: bool = False
    note: str = ""  # why nothing is reported, when nothing is

    @classmethod
    def not_reported(cls, note: str) -> ServerMetrics:
        return cls(None, note=note)

    @property
    def reported(self) -> bool:
        """True when the server reports its KV usage or its prefix hit rate."""
        return self.kv_usage is not None or self.prefix_hit_rate is not None


def read_server_metrics(text: str) -> ServerMetrics:
    """KV usage, prefix hit rate and request counts from ``/metrics`` text of vLLM, SGLang, llama-server or
    Kvasir."""
    samples = parse_prometheus(text)
    kind = _kind(samples)
    if kind is None:
        return ServerMetrics.not_reported("no vLLM, SGLang, llama.cpp or Kvasir metrics in /metrics")
    usage = _first_gauge(samples, KV_USAGE[kind])
    counters = _cache_counters(samples, kind)
    hit_rate = _gauge(samples, "sglang:cache_hit_rate") if kind == "SGLang" else None
    if hit_rate is None and counters is not None and counters[1] > 0:
        hit_rate = counters[0] / counters[1]
    running, waiting = _first_counter(samples, RUNNING), _first_counter(samples, WAITING)  # summed over engines
    return ServerMetrics(kind, _fraction(usage), _fraction(hit_rate), _whole(running), _whole(waiting), counters)


class HitRateWindow:
    """Turns successive readings of cumulative cache counters into the hit rate of the last ``WINDOW_S``
    seconds; a server whose counters went down has restarted, and the window starts again."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._readings: deque[tuple[float, float, float]] = deque()  # (time, cached, prompt)

    def apply(self, metrics: ServerMetrics, now: float | None = None) -> ServerMetrics:
        """``metrics`` with the hit rate over the window, where there were prompts in it."""
        if metrics.cache_counters is None:
            return metrics
        now = time.monotonic() if now is None else now
        cached, prompt = metrics.cache_counters
        if self._readings and (prompt < self._readings[-1][2] or cached < self._readings[-1][1]):
            self._readings.clear()
        self._readings.append((now, cached, prompt))
        while len(self._readings) > 2 and self._readings[1][0] <= now - self.window_s:
            self._readings.popleft()
        _, old_cached, old_prompt = self._readings[0]
        if prompt - old_prompt <= 0:
            return metrics
        rate = _fraction((cached - old_cached) / (prompt - old_prompt))
        return ServerMetrics(metrics.server_kind, metrics.kv_usage, rate, metrics.num_running,
                             metrics.num_waiting, metrics.cache_counters, True, metrics.note)


def _kind(samples: Samples) -> str | None:
    servers = (("vllm:", "vLLM"), ("sglang:", "SGLang"), ("llamacpp:", "llama.cpp"), (names.PREFIX, "Kvasir"))
    for prefix, kind in servers:
        if any(name.startswith(prefix) for name in samples):
            return kind
    return None


def _cache_counters(samples: Samples, kind: str) -> tuple[float, float] | None:
    """(cached prompt tokens, prompt tokens) since the server started, where its counters say."""
    if kind in PREFIX_COUNTERS:
        hit_names, query_names = PREFIX_COUNTERS[kind]
        hits, queries = _first_counter(samples, hit_names), _first_counter(samples, query_names)
        return (hits, queries) if hits is not None and queries is not None else None
    if kind == "llama.cpp":
        computed = _counter(samples, "llamacpp:prompt_tokens")
        cached = _counter(samples, "llamacpp:prompt_tokens_cached")
        return (cached, computed + cached) if computed is not None and cached is not None else None
    return None


def _counter(samples: Samples, name: str) -> float | None:
    """A counter's (or a count's) total over all its label sets, exported with or without ``_total``."""
    for candidate in (name + "_total", name):
        series = samples.get(candidate)
        if series:
            return sum(value for _, value in series)
    return None


def _first_counter(samples: Samples, names: tuple[str, ...]) -> float | None:
    return next((v for v in (_counter(samples, n) for n in names) if v is not None), None)


def _gauge(samples: Samples, name: str) -> float | None:
    """A gauge's mean over its label sets (one per engine or rank of a server that runs several)."""
    series = samples.get(name)
    return sum(value for _, value in series) / len(series) if series else None


def _first_gauge(samples: Samples, names: tuple[str, ...]) -> float | None:
    return next((v for v in (_gauge(samples, n) for n in names) if v is not None), None)


def _fraction(value: float | None) -> float | None:
    """A 0..1 value (every name above is a fraction, vLLM's ``_perc`` included); nonsense is not shown."""
    if value is None or not math.isfinite(value) or value < 0:
        return None
    return min(value, 1.0)


def _whole(value: float | None) -> int | None:
    return None if value is None or not math.isfinite(value) else round(value)


def _unescape(value: str) -> str:
    return value.replace("\\\\", "\x00").replace('\\"', '"').replace("\\n", "\n").replace("\x00", "\\")
