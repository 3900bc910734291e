"""Memory through psutil on every system: resident size, peaks over a block, free system memory."""

import mmap
import sys
import time
from collections import namedtuple

import psutil
import pytest
import torch

from engine.devices import available_memory
from engine.models import memory
from engine.models.memory import PeakMemory, resident_bytes, return_freed_memory

MB = 2**20
SAMPLE_WAIT_S = memory.SAMPLE_INTERVAL_S


def touched(nbytes: int) -> mmap.mmap:
    """``nbytes`` of new memory with every page written, so all of it is resident. In a mapping of its own: the C
    allocator may serve even a large block from heap pages the process already holds, which would not grow."""
    block = mmap.mmap(-1, nbytes)
    torch.frombuffer(block, dtype=torch.uint8).fill_(1)
    return block


def test_resident_bytes_is_psutils_and_grows_with_touched_memory():
    before = resident_bytes()
    assert abs(before - psutil.Process().memory_info().rss) < 16 * MB
    block = touched(128 * MB)
    assert resident_bytes() - before > 100 * MB
    del block


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's resettable peak is Linux's")
def test_the_peak_over_a_block_counts_memory_freed_before_its_end():
    with PeakMemory(torch.device("cpu")) as peak:
        block = touched(96 * MB)
        del block
    assert 80 * MB < peak.bytes < 200 * MB


def test_without_a_kernel_peak_a_sampling_thread_sees_the_peak(monkeypatch):
    monkeypatch.setattr(memory, "_reset_linux_peak", lambda: False)  # as on Windows and macOS
    with PeakMemory(torch.device("cpu")) as peak:
        block = touched(96 * MB)
        deadline = time.monotonic() + 5
        while peak._sampled.peak - peak.start < 80 * MB and time.monotonic() < deadline:
            time.sleep(SAMPLE_WAIT_S)  # wait until the sampler has seen the block (bounded)
        del block
    assert 80 * MB < peak.bytes < 200 * MB
    assert not peak._sampled._thread.is_alive()


def test_free_system_memory_comes_from_psutil(monkeypatch):
    fake = namedtuple("svmem", "total available")(64 * 2**30, 12_345_678)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: fake)
    assert available_memory(torch.device("cpu")) == 12_345_678


def test_returning_freed_memory_touches_no_c_library_off_linux(monkeypatch):
    import ctypes

    def no_library(*args):
        raise AssertionError("a C library was loaded off Linux")

    monkeypatch.setattr(memory.sys, "platform", "win32")
    monkeypatch.setattr(ctypes, "CDLL", no_library)
    return_freed_memory()


def test_returning_freed_memory_on_linux_calls_malloc_trim(monkeypatch):
    import ctypes

    calls = []

    class Libc:
        def malloc_trim(self, pad):
            calls.append(pad)

    monkeypatch.setattr(memory.sys, "platform", "linux")
    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    return_freed_memory()
    assert calls == [0]
