"""Per-request metrics and engine-wide statistics, kept with plain arithmetic on the host."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from .sequence import Sequence

RATE_WINDOW_S = 3.0  # tokens/s figures cover the last few seconds
HIT_RATE_WINDOW = 64  # prefix hit rate covers the last admitted requests


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """Timings and token counts of one request. TTFT includes the queue time, which is also given apart."""

    queue_time_s: float | None
    ttft_s: float | None
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    decode_tokens_per_s: float | None

    @classmethod
    def of(cls, seq: Sequence) -> RequestMetrics:
        queue = None if seq.first_scheduled_time is None else seq.first_scheduled_time - seq.arrival_time
        ttft = None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time
        rate = None
        if seq.num_output_tokens > 1 and seq.last_token_time and seq.first_token_time:
            span = seq.last_token_time - seq.first_token_time
            rate = (seq.num_output_tokens - 1) / span if span > 0 else None
        return cls(queue, ttft, seq.num_prompt_tokens, seq.num_cached_prompt_tokens or 0, seq.num_output_tokens, rate)


@dataclass(frozen=True, slots=True)
class RequestSnapshot:
    """One live request as the stats panel shows it."""

    request_id: str
    running: bool
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    queue_time_s: float | None
    decode_tokens_per_s: float | None
    blocks: int  # blocks in its table
    exclusive_blocks: int  # of those, the ones no other request shares
    ttft_s: float | None = None  # from arrival to its first token, once that has come
    source: str = ""  # who sent it, as given to ``add_request`` ("api": the local endpoint)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """A snapshot of the engine. Invariant: ``kv_blocks_used + kv_blocks_cached + kv_blocks_free ==
    kv_blocks_total``."""

    block_size: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_cached: int
    kv_blocks_free: int
    kv_blocks_shared: int
    kv_usage: float
    prefix_hit_rate: float
    num_running: int
    num_waiting: int
    num_preempted_total: int
    prompt_tokens_total: int
    cached_prompt_tokens_total: int
    generated_tokens_total: int
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    device: str
    device_reason: str
    dtype: str
    quantization: str
    attention_backend: str
    model_name: str
    model_memory_bytes: int
    kv_cache_memory_bytes: int
    max_model_len: int
    peak_load_bytes: int = 0
    attention_reason: str = ""  # why this attention backend (flash-attn's limits, say)
    warnings: tuple[str, ...] = ()
    requests: tuple[RequestSnapshot, ...] = ()


@dataclass(frozen=True, slots=True)
class _StepRecord:
    end: float
    prefill_tokens: int
    decode_tokens: int


class EngineCounters:
    """Running totals and recent rates, updated once per step and once per admitted request."""

    def __init__(self) -> None:
        self.prompt_tokens_total = 0
        self.cached_prompt_tokens_total = 0
        self.generated_tokens_total = 0
        self._steps: deque[_StepRecord] = deque()
        self._admissions: deque[tuple[int, int]] = deque(maxlen=HIT_RATE_WINDOW)
        self._first_step_start: float | None = None

    def record_admission(self, prompt_tokens: int, cached_tokens: int) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.cached_prompt_tokens_total += cached_tokens
        self._admissions.append((prompt_tokens, cached_tokens))

    def record_step(self, start: float, end: float, prefill_tokens: int, decode_tokens: int) -> None:
        self.generated_tokens_total += decode_tokens
        if self._first_step_start is None:
            self._first_step_start = start
        self._steps.append(_StepRecord(end, prefill_tokens, decode_tokens))
        self._trim(end)

    def prefix_hit_rate(self) -> float:
        prompt = sum(p for p, _ in self._admissions)
        return sum(c for _, c in self._admissions) / prompt if prompt else 0.0

    def rates(self, now: float | None = None) -> tuple[float, float]:
        """Prefill and decode tokens/s over the last ``RATE_WINDOW_S`` seconds of wall time."""
        now = time.perf_counter() if now is None else now
        self._trim(now)
        if not self._steps or self._first_step_start is None:
            return 0.0, 0.0
        span = now - max(now - RATE_WINDOW_S, self._first_step_start)
        if span <= 0:
            return 0.0, 0.0
        prefill = sum(s.prefill_tokens for s in self._steps)
        decode = sum(s.decode_tokens for s in self._steps)
        return prefill / span, decode / span

    def _trim(self, now: float) -> None:
        while self._steps and self._steps[0].end < now - RATE_WINDOW_S:
            self._steps.popleft()
