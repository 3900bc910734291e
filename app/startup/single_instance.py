"""One Kvasir per data folder: a second start would find the chat database locked."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QLockFile

LOCK_NAME = "kvasir.lock"


def acquire_instance_lock(folder: Path) -> QLockFile | None:
    """The lock that marks this data folder as in use (keep it for the app's lifetime), or None when another
    running Kvasir holds it. A lock left by a process that died is taken over."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    lock = QLockFile(str(folder / LOCK_NAME))
    lock.setStaleLockTime(0)  # only a dead owner makes the lock stale, never its age: the app runs for days
    return lock if lock.tryLock(200) else None


def already_running_message(folder: Path) -> str:
    """What the user reads when the data folder is in use."""
    return (f"Kvasir is already running with the chats in {folder}. Switch to its window; a second copy would "
            "find the chat database locked.")
