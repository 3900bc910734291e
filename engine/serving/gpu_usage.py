"""How much of the GPU the engine uses: memory from torch, utilisation from NVML where it can be asked.

Sampled on the engine thread (the GPU is the engine's), at most once per :data:`SAMPLE_INTERVAL_S`: the stats
snapshot is rebuilt many times a second, and NVML's utilisation is itself an average over up to a second.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable

import torch

from .metrics import GpuUsage

log = logging.getLogger(__name__)
SAMPLE_INTERVAL_S = 0.5
NO_NVML = "not available: needs nvidia-ml-py (NVML)"


class GpuMonitor:
    """Reads :class:`GpuUsage` for ``device`` (None for a CPU), sampled at most every ``interval_s``."""

    def __init__(self, device: torch.device, interval_s: float = SAMPLE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.device, self.interval_s, self._clock = device, interval_s, clock
        self._last: GpuUsage | None = None
        self._sampled_at: float | None = None
        self._nvml_problem: str | None = None if importlib.util.find_spec("pynvml") else NO_NVML

    def read(self) -> GpuUsage | None:
        """The latest sample; a new one once the last is ``interval_s`` old. A failed read keeps the last."""
        if self.device.type != "cuda":
            return None
        now = self._clock()
        if self._sampled_at is None or now - self._sampled_at >= self.interval_s:
            self._sampled_at = now
            try:
                self._last = self._sample()
            except Exception as exc:  # the panel must never take the engine down
                log.warning("reading GPU memory failed: %r", exc)
        return self._last

    def _sample(self) -> GpuUsage:
        free, total = torch.cuda.mem_get_info(self.device)
        percent, note = self._utilization()
        return GpuUsage(int(total - free), int(total), int(torch.cuda.memory_reserved(self.device)), percent, note)

    def _utilization(self) -> tuple[int | None, str]:
        if self._nvml_problem is not None:
            return None, self._nvml_problem
        try:
            return int(torch.cuda.utilization(self.device)), ""
        except Exception as exc:  # no driver library, a GPU NVML can't see: the same answer from now on
            self._nvml_problem = f"not available: NVML failed ({type(exc).__name__}: {exc})"[:200]
            return None, self._nvml_problem
