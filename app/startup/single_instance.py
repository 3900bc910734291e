"""One Kvasir per data folder: a second start would find the chat database locked."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QLockFile

LOCK_NAME = "kvasir.lock"


class DataFolderError(Exception):
    """The data folder can't be made or written (read-only, full, not a folder): the lock can't be taken."""


def acquire_instance_lock(folder: Path) -> QLockFile | None:
    """The lock that marks this data folder as in use (keep it for the app's lifetime), or None when another
    running Kvasir holds it. A lock left by a process that died is taken over. :class:`DataFolderError` when
    the folder can't hold a lock at all (it is read-only, say): that is not another Kvasir running."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise DataFolderError(f"Kvasir can't make its data folder {folder}: {exc.strerror or exc}") from None
    lock = QLockFile(str(folder / LOCK_NAME))
    lock.setStaleLockTime(0)  # only a dead owner makes the lock stale, never its age: the app runs for days
    if lock.tryLock(200):
        return lock
    if lock.error() == QLockFile.LockFailedError:
        return None
    reason = "it is read-only or not yours" if lock.error() == QLockFile.PermissionError else \
        "no lock file can be made there"
    raise DataFolderError(f"Kvasir can't write in its data folder {folder} ({reason}). Make it writable, or "
                          "start Kvasir with --data-dir and another folder.")


def already_running_message(folder: Path) -> str:
    """What the user reads when the data folder is in use."""
    return (f"Kvasir is already running with the chats in {folder}. Switch to its window; a second copy would "
            "find the chat database locked.")
