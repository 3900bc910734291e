"""Per-request metrics and engine-wide statistics, kept with plain arithmetic on the host."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict, dataclass
from statistics import median

from .sequence import Sequence

RATE_WINDOW_S = 3.0  # tokens/s figures cover the last few seconds
HIT_RATE_WINDOW = 64  # prefix hit rate and the queue-time median cover the last admitted requests
FIRST_TOKENS_KEPT = 64  # a snapshot carries this many of the latest first tokens, for per-request plots
GAP_WINDOW_S = 10.0  # the inter-token gap p99 covers the gaps of the last few seconds


@dataclass(frozen=True, slots=True)
class RequestMetrics:
    """Timings and token counts of one request. TTFT includes the queue time, which is also given apart."""

    queue_time_s: float | None
    ttft_s: float | None
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int
    decode_tokens_per_s: float | None
    draft_tokens: int = 0  # speculative decoding: tokens drafted for this reply and computed
    accepted_draft_tokens: int = 0  # ... of which the reply kept (they are part of ``output_tokens``)
    reasoning_tokens: int = 0  # output tokens spent reasoning (the end marker's included)
    reasoning_s: float | None = None  # from the first token to the end of the reasoning (or the latest token)

    @classmethod
    def of(cls, seq: Sequence) -> RequestMetrics:
        queue = None if seq.first_scheduled_time is None else seq.first_scheduled_time - seq.arrival_time
        ttft = None if seq.first_token_time is None else seq.first_token_time - seq.arrival_time
        rate = None
        if seq.num_output_tokens > 1 and seq.last_token_time and seq.first_token_time:
            span = seq.last_token_time - seq.first_token_time
            rate = (seq.num_output_tokens - 1) / span if span > 0 else None
        thought = None
        if seq.reasoning_tokens and seq.first_token_time is not None:
            thought = (seq.reasoning_end_time or seq.last_token_time or seq.first_token_time) - seq.first_token_time
        return cls(queue, ttft, seq.num_prompt_tokens, seq.num_cached_prompt_tokens or 0, seq.num_output_tokens, rate,
                   seq.draft_tokens, seq.accepted_draft_tokens, seq.reasoning_tokens, thought)

    def to_dict(self) -> dict:
        """The metrics by name, as the command line's ``--json`` line and the endpoint report them."""
        return asdict(self)

    def summary(self) -> str:
        """'[TTFT 120 ms | 48 tokens | 21.3 tok/s | 32/40 prompt tokens from cache]' (unknown counts left out)."""
        rate = f"{self.decode_tokens_per_s:.1f} tok/s" if self.decode_tokens_per_s else "-"
        ttft = f"TTFT {self.ttft_s * 1000:.0f} ms" if self.ttft_s is not None else "TTFT -"
        parts = [ttft, f"{self.output_tokens} tokens", rate]
        if self.prompt_tokens is not None:
            cached = "?" if self.cached_prompt_tokens is None else self.cached_prompt_tokens
            parts.append(f"{cached}/{self.prompt_tokens} prompt tokens from cache")
        if self.draft_tokens:
            parts.append(f"{self.accepted_draft_tokens}/{self.draft_tokens} drafted tokens kept")
        if self.reasoning_tokens:
            parts.append(f"thought for {self.reasoning_s or 0.0:.1f} s, {self.reasoning_tokens} tokens")
        return "[" + " | ".join(parts) + "]"


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
class GpuUsage:
    """One GPU's memory and load. ``memory_used_bytes`` counts every process on the device; the reserved bytes
    are this process's torch allocator's."""

    memory_used_bytes: int
    memory_total_bytes: int
    memory_reserved_bytes: int
    utilization_percent: int | None  # kernels running, share of the last sample period; None if unknown
    utilization_note: str = ""  # why the utilisation is unknown


@dataclass(frozen=True, slots=True)
class FirstToken:
    """A request's first token: its TTFT and queue time. ``number`` counts first tokens since the engine
    started, so a reader of successive snapshots can tell the ones it has not seen yet."""

    number: int
    ttft_s: float
    queue_time_s: float


@dataclass(frozen=True, slots=True)
class CpuUsage:
    """The steps' CPU threads and what other processes took (see :mod:`.cpu_share`)."""

    threads: int  # the steps use this many threads now
    cores: int  # ... of this many (torch's choice for the machine)
    threads_fixed: bool  # the user chose the count; nothing adapts
    others_cores: float | None  # other processes' use lately, in cores
    contention_seen_s_ago: float | None  # when others last took a core; None: not since the engine started
    lower_priority: bool = False
    note: str = ""  # why the priority could not be set as asked, in words


@dataclass(frozen=True, slots=True)
class DiskCacheStats:
    """The prefix cache's disk tier (engine/serving/kv_disk.py) since the model loaded."""

    hit_tokens_total: int  # prompt tokens read back from disk instead of computed
    blocks_written_total: int
    blocks_dropped_total: int  # not written: the backlog was full, or writing failed
    bytes_on_disk: int  # this model's block files
    max_bytes: int
    failure: str = ""  # why writing stopped, if it did


@dataclass(frozen=True, slots=True)
class SpeculationStats:
    """Speculative decoding since the model loaded (engine/serving/speculation.py)."""

    mode: str  # as configured: "auto", "off", "ngram" or "draft"
    active: bool  # drafts in the latest decode step
    reason: str  # what the mode is doing and why, in words
    num_drafts_total: int  # drafts computed
    draft_tokens_total: int
    accepted_draft_tokens_total: int
    speedup: float | None  # measured tokens/s of drafting decode steps over plain ones at the same batch
    draft_model: str = ""  # the draft model loaded beside the serving one ("name (quantisation)"), if any
    draft_memory_bytes: int = 0  # its weights and KV tensors (within the engine's weights and KV figures)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_draft_tokens_total / self.draft_tokens_total if self.draft_tokens_total else None

    @property
    def mean_accepted_run(self) -> float | None:
        """Draft tokens kept per draft."""
        return self.accepted_draft_tokens_total / self.num_drafts_total if self.num_drafts_total else None


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
    num_errors_total: int = 0  # requests that ended with finish_reason "error" since the engine started
    queue_time_p50_s: float | None = None  # median queue time of the last admitted requests (None before any)
    first_tokens: tuple[FirstToken, ...] = ()  # the latest first tokens, oldest first
    gpu: GpuUsage | None = None  # memory and load of the GPU it runs on; None on the CPU
    cuda_graphs: int = 0  # decode-step CUDA graphs captured so far (they are captured on first use)
    cuda_graphs_reason: str = ""  # why decode steps run eagerly; empty while they replay from graphs
    cuda_graph_memory_bytes: int = 0  # what the graphs' shared memory pool added on the device
    inter_token_p99_s: float | None = None  # the gap between a reply's tokens, p99 over the last seconds
    inter_token_max_s: float | None = None
    cpu: CpuUsage | None = None  # the CPU threads and the contention seen; None on a GPU and for remote engines
    kv_cache_dtype: str = ""  # how the KV cache stores keys and values (engine/serving/kv_format.py)
    kv_cache_dtype_reason: str = ""  # why that format (auto's measurement, or the settings)
    disk_cache: DiskCacheStats | None = None  # the prefix cache's disk tier; None where it is off
    # memory that adds up: the process's resident set, and the KV pool's part of it (on the CPU the pool's pages
    # are mapped as blocks are first written; on a GPU the whole pool is allocated at load)
    process_resident_bytes: int = 0
    kv_touched_bytes: int = 0
    speculation: SpeculationStats | None = None  # speculative decoding; None for remote engines
    reasoning_markers: str = ""  # what the model writes its reasoning between ("<think>…</think>"), "" for none
    thinking_switch: bool = False  # its chat template can be asked not to think (Chat options enable_thinking)
    reasoning_note: str = ""  # what about its reasoning is not handled, in words


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
        self.errors_total = 0
        self._steps: deque[_StepRecord] = deque()
        self._admissions: deque[tuple[int, int, float]] = deque(maxlen=HIT_RATE_WINDOW)
        self._first_tokens: deque[FirstToken] = deque(maxlen=FIRST_TOKENS_KEPT)
        self._num_first_tokens = 0
        self._first_step_start: float | None = None
        self._gaps: deque[tuple[float, float]] = deque()  # (when, gap since the reply's previous token)

    def record_admission(self, prompt_tokens: int, cached_tokens: int, queue_time_s: float) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.cached_prompt_tokens_total += cached_tokens
        self._admissions.append((prompt_tokens, cached_tokens, queue_time_s))

    def record_first_token(self, ttft_s: float, queue_time_s: float) -> None:
        self._num_first_tokens += 1
        self._first_tokens.append(FirstToken(self._num_first_tokens, ttft_s, queue_time_s))

    def record_token_gap(self, now: float, gap_s: float) -> None:
        self._gaps.append((now, gap_s))
        while self._gaps and self._gaps[0][0] < now - GAP_WINDOW_S:
            self._gaps.popleft()

    def token_gaps(self, now: float | None = None) -> tuple[float | None, float | None]:
        """The p99 and the longest gap between two tokens of one reply in the last :data:`GAP_WINDOW_S`."""
        now = time.perf_counter() if now is None else now
        gaps = sorted(gap for when, gap in self._gaps if when >= now - GAP_WINDOW_S)
        if not gaps:
            return None, None
        return gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))], gaps[-1]

    def record_error(self) -> None:
        self.errors_total += 1

    def first_tokens(self) -> tuple[FirstToken, ...]:
        return tuple(self._first_tokens)

    def queue_time_p50(self) -> float | None:
        """The median queue time of the last admitted requests, or None before the first."""
        return median(q for _, _, q in self._admissions) if self._admissions else None

    def record_step(self, start: float, end: float, prefill_tokens: int, decode_tokens: int) -> None:
        self.generated_tokens_total += decode_tokens
        if self._first_step_start is None:
            self._first_step_start = start
        self._steps.append(_StepRecord(end, prefill_tokens, decode_tokens))
        self._trim(end)

    def prefix_hit_rate(self) -> float:
        prompt = sum(p for p, _, _ in self._admissions)
        return sum(c for _, c, _ in self._admissions) / prompt if prompt else 0.0

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
