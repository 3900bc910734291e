"""Peak memory of a block of code: device memory on CUDA, resident memory of the process on the CPU."""

from __future__ import annotations

import torch


def resident_bytes() -> int:
    """The process's resident memory now."""
    return _status_kib("VmRSS:") * 1024


def return_freed_memory() -> None:
    """Ask the C allocator to hand freed heap pages back to the system (glibc), so memory use really falls."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _status_kib(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident size (Linux)
        return True
    except OSError:
        return False


class PeakMemory:
    """``with PeakMemory(device) as peak: ...`` then ``peak.bytes``: the highest use above the start."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes = 0
        self.start = 0

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            _reset_peak_rss()
            self.start = resident_bytes()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.start
        else:
            self.bytes = max(0, _status_kib("VmHWM:") * 1024 - self.start)
