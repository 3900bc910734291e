"""A scripted stand-in for the engine bridge, for testing the UI logic without a model."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QObject, Signal

from engine import EngineStats, RequestMetrics, RequestOutput

WORDS = "Paris is the capital of France and a **lovely** city .".split()


def fake_stats(**overrides) -> EngineStats:
    values = dict(
        block_size=16, kv_blocks_total=64, kv_blocks_used=10, kv_blocks_cached=6, kv_blocks_free=48,
        kv_blocks_shared=3, kv_usage=10 / 64, prefix_hit_rate=0.42, num_running=2, num_waiting=1,
        num_preempted_total=5, prompt_tokens_total=900, cached_prompt_tokens_total=378, generated_tokens_total=320,
        prefill_tokens_per_s=850.0, decode_tokens_per_s=23.5, device="cpu", device_reason="no CUDA GPU found",
        dtype="float32", quantization="none", attention_backend="torch", model_name="Fake-1M",
        model_memory_bytes=3 * 1024**2, kv_cache_memory_bytes=1024**2, max_model_len=2048,
    )
    values.update(overrides)
    return EngineStats(**values)


class FakeBridge(QObject):
    """Streams ``WORDS`` one per tick; ``gate`` (an asyncio.Event) can hold a stream mid-way."""

    load_progress = Signal(float, str)
    loaded = Signal(object)
    load_failed = Signal(str)
    stats_updated = Signal(object)

    def __init__(self, words=WORDS, finish_reason="stop") -> None:
        super().__init__()
        self.words, self.finish_reason = list(words), finish_reason
        self.ready, self.loading = True, False
        self.requests: list[list[dict]] = []
        self.gate: asyncio.Event | None = None
        self._stats = fake_stats()

    def stats(self) -> EngineStats:
        return self._stats

    def count_tokens(self, messages) -> int:
        return sum(len(m["content"].split()) + 4 for m in messages)

    def start(self, config) -> None:
        self.loaded.emit(self._stats)

    async def switch(self, config) -> None:
        self.loaded.emit(self._stats)

    def shutdown(self) -> None:
        pass

    async def stream(self, messages, sampling):
        self.requests.append(messages)
        text = ""
        for i, word in enumerate(self.words):
            if self.gate is not None and i == 2:
                await self.gate.wait()
            await asyncio.sleep(0)
            text += ("" if i == 0 else " ") + word
            last = i == len(self.words) - 1
            yield _output(text, i + 1, self.finish_reason if last else None)


def _output(text: str, n: int, reason: str | None) -> RequestOutput:
    metrics = RequestMetrics(queue_time_s=0.001, ttft_s=0.05, prompt_tokens=40, cached_prompt_tokens=32,
                             output_tokens=n, decode_tokens_per_s=25.0 if n > 1 else None)
    return RequestOutput("fake", text, list(range(n)), text.split(" ")[-1], [n], reason is not None, reason, None,
                         metrics)
