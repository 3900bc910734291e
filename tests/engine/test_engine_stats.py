"""What the live panel reads from the engine: errors since start, the recent queue-time median, each request's
first token (TTFT and queue time), and the GPU's memory and load, read with the CUDA probes stood in."""

import statistics

import pytest
import torch

from engine import Engine, EngineConfig, GpuUsage, SamplingParams
from engine.serving import gpu_usage
from engine.serving.gpu_usage import NO_NVML, GpuMonitor
from engine.serving.metrics import FIRST_TOKENS_KEPT, EngineCounters
from engine.step.runner import ModelRunner

SHORT = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


@pytest.fixture
def engine(tiny_llama):
    return Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, max_model_len=256))


def test_errors_are_counted_from_every_way_a_request_fails_and_aborts_are_not(engine, monkeypatch):
    assert engine.stats().num_errors_total == 0
    engine.add_request("hello " * 300, SHORT)  # refused at once: more than the context
    aborted = engine.add_request("one that the user stops", SamplingParams(max_tokens=50, ignore_eos=True))
    engine.step()
    engine.abort(aborted)
    engine.generate(["fine"], SHORT)
    assert engine.stats().num_errors_total == 1

    original = ModelRunner.run

    def fails_on_the_victim(self, chunks):
        if any(c.seq.request_id == "victim" for c in chunks):
            raise RuntimeError("injected")
        return original(self, chunks)

    monkeypatch.setattr(ModelRunner, "run", fails_on_the_victim)
    engine.add_request("this one breaks", SHORT, request_id="victim")
    engine.add_request("this one is fine", SHORT)
    while engine.has_unfinished():
        engine.step()
    assert engine.stats().num_errors_total == 2
    engine.add_request("a", SHORT)
    engine.add_request("b", SHORT)
    engine.fail_all("the engine failed")
    assert engine.stats().num_errors_total == 4


def test_queue_time_median_and_first_tokens_match_the_requests(engine):
    assert engine.stats().queue_time_p50_s is None and engine.stats().first_tokens == ()
    finals = engine.generate(["first prompt", "a second prompt", "third"], SHORT)
    stats = engine.stats()
    queues = [out.metrics.queue_time_s for out in finals]
    assert stats.queue_time_p50_s == pytest.approx(statistics.median(queues))
    assert [t.number for t in stats.first_tokens] == [1, 2, 3]
    assert sorted(t.ttft_s for t in stats.first_tokens) == pytest.approx(sorted(o.metrics.ttft_s for o in finals))
    assert sorted(t.queue_time_s for t in stats.first_tokens) == pytest.approx(sorted(queues))
    assert all(t.ttft_s >= t.queue_time_s >= 0 for t in stats.first_tokens)


def test_first_tokens_keep_the_latest_and_number_on():
    counters = EngineCounters()
    for i in range(FIRST_TOKENS_KEPT + 5):
        counters.record_first_token(0.1 + i, 0.01)
    kept = counters.first_tokens()
    assert len(kept) == FIRST_TOKENS_KEPT
    assert kept[0].number == 6 and kept[-1].number == FIRST_TOKENS_KEPT + 5 and kept[-1].ttft_s == 0.1 + 68


def test_queue_time_median_covers_the_last_admissions_only():
    counters = EngineCounters()
    for _ in range(100):
        counters.record_admission(10, 0, 5.0)  # an old burst of long waits...
    for _ in range(64):
        counters.record_admission(10, 0, 0.002)  # ...has left the window
    assert counters.queue_time_p50() == 0.002


def test_on_the_cpu_there_are_no_gpu_numbers(engine):
    assert engine.stats().gpu is None
    assert GpuMonitor(torch.device("cpu")).read() is None


@pytest.fixture
def cuda_probes(monkeypatch):
    """torch.cuda's memory and NVML probes stood in: 30 of 80 GiB in use, 12 GiB reserved by this process."""
    calls = []

    def mem_get_info(device=None):
        calls.append("mem")
        return 50 << 30, 80 << 30

    monkeypatch.setattr(gpu_usage.torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(gpu_usage.torch.cuda, "memory_reserved", lambda device=None: 12 << 30)
    monkeypatch.setattr(gpu_usage.torch.cuda, "utilization", lambda device=None: 87)
    return calls


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_gpu_usage_with_nvml(cuda_probes, monkeypatch):
    monkeypatch.setattr(gpu_usage.importlib.util, "find_spec", lambda name: object())
    monitor = GpuMonitor(torch.device("cuda:0"))
    assert monitor.read() == GpuUsage(30 << 30, 80 << 30, 12 << 30, 87, "")


def test_without_nvml_utilisation_says_why_and_memory_still_shows(cuda_probes, monkeypatch):
    monkeypatch.setattr(gpu_usage.importlib.util, "find_spec", lambda name: None)
    usage = GpuMonitor(torch.device("cuda:0")).read()
    assert usage.utilization_percent is None and usage.utilization_note == NO_NVML
    assert usage.memory_used_bytes == 30 << 30 and usage.memory_total_bytes == 80 << 30


def test_a_failing_nvml_is_reported_once_in_its_own_words(cuda_probes, monkeypatch):
    asked = []

    def broken(device=None):
        asked.append(1)
        raise RuntimeError("cuda driver can't be loaded, is cuda enabled?")

    monkeypatch.setattr(gpu_usage.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(gpu_usage.torch.cuda, "utilization", broken)
    clock = Clock()
    monitor = GpuMonitor(torch.device("cuda:0"), clock=clock)
    first = monitor.read()
    clock.now += 1
    second = monitor.read()
    assert first.utilization_note == second.utilization_note == (
        "not available: NVML failed (RuntimeError: cuda driver can't be loaded, is cuda enabled?)")
    assert len(asked) == 1 and second.memory_used_bytes == 30 << 30


def test_gpu_usage_is_sampled_at_most_every_interval_and_a_failed_read_keeps_the_last(cuda_probes, monkeypatch):
    clock = Clock()
    monitor = GpuMonitor(torch.device("cuda:0"), interval_s=0.5, clock=clock)
    first = monitor.read()
    clock.now += 0.2
    assert monitor.read() is first and cuda_probes == ["mem"]  # rebuilt stats between samples cost nothing
    clock.now += 0.4
    monitor.read()
    assert cuda_probes == ["mem", "mem"]

    def lost(device=None):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu_usage.torch.cuda, "mem_get_info", lost)
    clock.now += 1
    assert monitor.read() == first


def test_the_gpu_is_read_on_the_engine_thread_only(tiny_llama, monkeypatch):
    """Reading stats from another thread (the GUI's) returns the engine thread's snapshot: no CUDA call there."""
    import asyncio
    import threading

    from engine import AsyncEngine

    readers = []
    usage = GpuUsage(1 << 30, 8 << 30, 1 << 29, 40, "")

    def read(self):
        readers.append(threading.current_thread().name)
        return usage

    monkeypatch.setattr(GpuMonitor, "read", read)
    engine = AsyncEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=32))
    try:
        async def one_reply():
            async for _ in engine.stream("hello", SHORT):
                pass

        asyncio.run(one_reply())
        before = len(readers)
        stats = [engine.stats() for _ in range(20)]  # from this thread, as the GUI polls
        assert all(s.gpu == usage for s in stats)
        assert readers and set(readers) == {"kvasir-engine"}
        assert len(readers) - before <= 1  # the engine thread's own idle refresh, at most
    finally:
        engine.shutdown()
