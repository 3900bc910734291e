"""Peak memory of a block of code: device memory on CUDA, resident memory of the process on the CPU.

Resident memory comes from psutil on every system. The peak over a block is the kernel's own high-water mark
on Linux (VmHWM, reset at the start of the block); elsewhere a sampling thread watches the resident size.
"""

from __future__ import annotations

import sys
import threading

import psutil
import torch

SAMPLE_INTERVAL_S = 0.01  # where the kernel keeps no resettable peak: fine enough for loads lasting seconds


def resident_bytes() -> int:
    """The process's resident memory now."""
    return psutil.Process().memory_info().rss


def return_freed_memory() -> None:
    """Ask the C allocator to hand freed heap pages back to the system (glibc's malloc_trim), so memory use
    really falls; other C libraries return large frees themselves, so elsewhere this does nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the process's own C library; absent in musl
    except OSError:
        return
    if trim is not None:
        trim(0)


def _linux_peak_kib() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_linux_peak() -> bool:
    """Reset VmHWM, the kernel's record of the peak resident size; False where that is not possible."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _SampledPeak:
    """The highest resident size seen by a thread polling every few milliseconds until stopped."""

    def __init__(self) -> None:
        self.peak = resident_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kvasir-peak-memory", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.peak = max(self.peak, process.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, resident_bytes())


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.bytes``: the highest use above the start."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes = 0
        self.start = 0
        self._sampled: _SampledPeak | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            if not _reset_linux_peak():
                self._sampled = _SampledPeak()
            self.start = resident_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.start
            return
        if self._sampled is not None:
            peak = self._sampled.stop()
        else:
            kib = _linux_peak_kib()
            peak = kib * 1024 if kib is not None else resident_bytes()
        self.bytes = max(0, peak - self.start)
