"""Busy-CPU adaptation: how much of the CPU other processes take, and how many threads the steps should use.

A decode step is a run of parallel regions, each ending at a barrier that waits for its slowest thread. With every
core given a thread and one core also wanted by another process, the thread that shares it runs only in the
timeslices the scheduler gives it, and every region waits for it: beside one busy process, decode on a 2-core CPU
fell to 29% of its idle speed, while one thread on the free core keeps over half. So between steps the engine
compares the CPU time the whole machine used with its own (``/proc/stat`` against the process's times): what is
left is what others take, in cores. When others take at least :data:`TAKE_CORE_AT` of a core, the steps use one
thread fewer for each such core; when they let go (below :data:`GIVE_BACK_BELOW`), the threads come back. With
nothing else running nothing changes, so an idle machine loses nothing but one read of ``/proc/stat`` a second.

Pure Python; the clock and the sampler are passed in, so the rule is tested without a busy machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

WINDOW_S = 0.5  # how often the machine's use is sampled
WINDOWS = 2  # a decision looks at the mean of this many windows, so one burst of another process moves nothing
TAKE_CORE_AT = 0.6  # others' use, in cores beyond those given up already, at which the steps give up one more
GIVE_BACK_BELOW = 0.35  # others' use, in cores beyond those given up but the last, below which one comes back
PROC_STAT = "/proc/stat"


@dataclass(frozen=True, slots=True)
class CpuSample:
    """The machine's busy CPU seconds (all cores, since boot) and this process's own, at a moment."""

    at: float
    busy_s: float
    own_s: float


def read_sample(clock: Callable[[], float] = time.monotonic) -> CpuSample | None:
    """Now's sample from ``/proc/stat`` and the process's times; None where there is no ``/proc`` (not Linux)."""
    try:
        with open(PROC_STAT, "rb") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != b"cpu":
        return None
    ticks = [int(value) for value in fields[1:9]]  # user nice system idle iowait irq softirq steal
    busy = sum(ticks) - ticks[3] - ticks[4]
    own = os.times()
    return CpuSample(clock(), busy / os.sysconf("SC_CLK_TCK"), own.user + own.system)


@dataclass(frozen=True, slots=True)
class ThreadState:
    """What the governor decided: the threads the steps use, of how many, and why."""

    threads: int
    cores: int
    others_cores: float | None  # what other processes took lately, in cores; None before the first measure
    contention_seen_at: float | None  # when others last took a core from the steps (the governor's clock)
    fixed: bool  # the user chose the count: nothing adapts


class ThreadGovernor:
    """Decides, between steps, how many threads the steps use (see the module's docstring).

    ``fixed``: a thread count the user chose (nothing adapts); None adapts between 1 and ``cores``.
    Call :meth:`tick` between steps: it returns the new count when it changes, else None.
    """

    def __init__(self, cores: int, fixed: int | None = None, sample: Callable[[], CpuSample | None] = read_sample,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cores = max(1, cores)
        self.fixed = fixed
        self.threads = min(fixed, self.cores) if fixed else self.cores
        self._sample, self._clock = sample, clock
        self._last: CpuSample | None = None
        self._recent: list[float] = []  # others' cores in the last windows
        self.others_cores: float | None = None
        self.contention_seen_at: float | None = None
        self._next_at = clock()

    def state(self) -> ThreadState:
        return ThreadState(self.threads, self.cores, self.others_cores, self.contention_seen_at, self.fixed is not None)

    def tick(self) -> int | None:
        """Sample the machine when a window has passed; the new thread count if it changes, else None."""
        now = self._clock()
        if now < self._next_at:
            return None
        self._next_at = now + WINDOW_S
        sample = self._sample()
        if sample is None:
            return None
        last, self._last = self._last, sample
        if last is None or sample.at <= last.at:
            return None
        wall = sample.at - last.at
        others = max(0.0, (sample.busy_s - last.busy_s) - (sample.own_s - last.own_s)) / wall
        self._recent = (self._recent + [others])[-WINDOWS:]
        self.others_cores = sum(self._recent) / len(self._recent)
        if self.others_cores >= TAKE_CORE_AT:
            self.contention_seen_at = now
        if self.fixed is not None or len(self._recent) < WINDOWS:
            return None
        wanted = self._wanted(self.others_cores)
        if wanted == self.threads:
            return None
        self.threads = wanted
        self._recent = []  # the next decision measures the machine with the new count
        return wanted

    def _wanted(self, others: float) -> int:
        """Threads for ``others`` cores taken: one fewer per core others take, with a margin each way so the
        count does not swing on a reading near the line."""
        given_up = self.cores - self.threads
        if others >= given_up + TAKE_CORE_AT:
            return max(1, self.threads - 1)
        if given_up and others < given_up - 1 + GIVE_BACK_BELOW:
            return self.threads + 1
        return self.threads
