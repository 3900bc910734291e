"""The setting "Lower priority while others need the CPU": the engine's threads at a higher nice value.

A nice value only matters when threads compete for a core: on an idle machine a niced engine runs at full speed,
and beside a busy program the scheduler gives that program the larger share. So "while others need the CPU"
needs no watching: it is what nice does. Every thread of the process but the main one (the window's, or the
caller's) is reniced, and threads they start inherit it, the engine's compute pool included. Going back up needs a
privilege most users lack (``RLIMIT_NICE``); where it is refused, the note says the lower priority stays until
Kvasir restarts. Linux and other systems where a thread id names a thread for ``setpriority``; elsewhere the
setting reports that it does nothing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

LOWER_NICE = 10
TASKS = Path("/proc/self/task")


def apply(lower: bool) -> str:
    """Lower (or raise back) the priority of every thread but the main one; a note for the user when it could
    not be done, else an empty string."""
    if not TASKS.is_dir() or not hasattr(os, "setpriority"):
        return "lowering the engine's priority is not supported on this system" if lower else ""
    main = threading.main_thread().native_id
    base = os.getpriority(os.PRIO_PROCESS, main)
    wanted = max(base, min(19, base + LOWER_NICE)) if lower else base
    refused = False
    for tid in _threads():
        if tid == main:
            continue
        try:
            if os.getpriority(os.PRIO_PROCESS, tid) != wanted:
                os.setpriority(os.PRIO_PROCESS, tid, wanted)
        except PermissionError:
            refused = True
        except (ProcessLookupError, OSError):
            continue  # the thread ended meanwhile
    if refused:
        return "the engine keeps its lower priority until Kvasir restarts (raising it back needs a privilege)"
    return ""


def current_nice() -> int | None:
    """The calling thread's nice value (None where it cannot be read)."""
    try:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (AttributeError, OSError):
        return None


def _threads() -> list[int]:
    try:
        return [int(name) for name in os.listdir(TASKS)]
    except OSError:
        return []
