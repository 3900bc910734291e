"""Opening the user's files at start: the chat database, the model library and settings.json.

Each opener returns the object, or a :class:`DamagedFile` saying which file and what is wrong with it, so
start-up can offer to move the file aside (kept, renamed ``<name>.damaged-<timestamp>``) instead of crashing.
A sound file on a full disk or in a read-only folder is not damaged: the user is told which, and the file is
never offered to be moved.
"""

from __future__ import annotations

import errno
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine import LibraryError, ModelLibrary

from ..data.settings import Settings, SettingsError
from ..data.store import Store, StoreError, StoreWriteError

DELETED_KEPT_S = 24 * 3600  # deleted chats can be restored for a day; after that they are purged at start
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")
# What a full disk or a folder Kvasir may not write looks like, from SQLite and from the OS
FULL = ({"SQLITE_FULL"}, {errno.ENOSPC, errno.EDQUOT})
READ_ONLY = ({"SQLITE_READONLY", "SQLITE_READONLY_DIRECTORY", "SQLITE_PERM", "SQLITE_AUTH"},
             {errno.EROFS, errno.EACCES, errno.EPERM})


@dataclass(frozen=True, slots=True)
class DamagedFile:
    """A file Kvasir can't use as it is, and why."""

    path: Path
    reason: str
    damaged: bool = True  # False: the file may be sound; the disk is full or the folder read-only


def open_store(path: Path) -> Store | DamagedFile:
    """The chat database, checked and with long-deleted chats purged; or why it can't be used."""
    try:
        if path.is_dir():
            return DamagedFile(path, "the chat database's path is a folder, not a file")
        store = Store(path)
    except (sqlite3.DatabaseError, StoreError, OSError) as exc:
        return cannot_write(path, exc) or DamagedFile(path, _database_reason(exc))
    problem = store.check()
    if problem is not None:
        store.close()
        return DamagedFile(path, f"the chat database is damaged: {problem}")
    try:
        store.purge_deleted(older_than_s=DELETED_KEPT_S)
    except (sqlite3.DatabaseError, StoreError) as exc:
        store.close()
        return cannot_write(path, exc) or DamagedFile(path, _database_reason(exc))
    return store


def cannot_write(path: Path, exc: BaseException) -> DamagedFile | None:
    """A :class:`DamagedFile` that is not damaged when ``exc`` says the disk is full or the folder is
    read-only (saying which); None when it says something else."""
    if isinstance(exc, StoreWriteError) and exc.__cause__ is not None:
        exc = exc.__cause__  # the store's words for SQLite's error: classify SQLite's
    name, number = getattr(exc, "sqlite_errorname", None), getattr(exc, "errno", None)
    if name in FULL[0] or number in FULL[1]:
        return DamagedFile(path, f"the disk holding it is full ({exc}); free some space and start Kvasir again",
                           damaged=False)
    if name in READ_ONLY[0] or number in READ_ONLY[1]:
        return DamagedFile(path, f"Kvasir may not write in its folder ({exc}); make {path.parent} writable, or "
                           "start Kvasir with another --data-dir", damaged=False)
    return None


def _database_reason(exc: Exception) -> str:
    if isinstance(exc, StoreError):
        return str(exc)
    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
        return f"its path is a symbolic link that loops ({exc})"
    return f"the chat database can't be read: {exc}"


def open_library(library: ModelLibrary) -> ModelLibrary | DamagedFile:
    """The model library, once its index has been read; or why the index can't be used."""
    try:
        library.entries()
    except LibraryError as exc:
        return DamagedFile(library.index, str(exc))
    return library


def open_settings(path: Path) -> Settings | DamagedFile:
    """The user's settings (a bad single value falls back to its default); or why the file can't be used."""
    try:
        return Settings(path)
    except SettingsError as exc:
        return DamagedFile(path, f"the settings file can't be used: {exc}")


def move_aside(path: Path) -> Path:
    """Rename ``path`` (and a database's WAL and SHM files) to ``<name>.damaged-<timestamp>``; never overwrite."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = path.with_name(f"{path.name}.damaged-{stamp}"), 2
    while any(_with_suffix(target, s).exists() for s in ("", *SQLITE_COMPANIONS)):
        target, n = path.with_name(f"{path.name}.damaged-{stamp}-{n}"), n + 1
    for suffix in SQLITE_COMPANIONS:  # they belong to the damaged file: a new database must not read them
        if _with_suffix(path, suffix).exists():
            _with_suffix(path, suffix).rename(_with_suffix(target, suffix))
    path.rename(target)
    return target


def _with_suffix(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def open_or_recover(opener: Callable[[], object], confirm: Callable[[DamagedFile], bool]):
    """``opener()``'s object; when it reports a damaged file, ask ``confirm``, move the file aside and try
    again once. None when the user chose to quit (or the file is still unusable)."""
    result = opener()
    if not isinstance(result, DamagedFile):
        return result
    if not confirm(result) or not result.damaged:  # a sound file on a full disk is never moved
        return None
    try:
        move_aside(result.path)
    except OSError as exc:  # a read-only folder, say: quit rather than touch the file in any other way
        print(f"kvasir: could not move {result.path} aside: {exc}", file=sys.stderr)
        return None
    result = opener()
    return None if isinstance(result, DamagedFile) else result


def open_user_files(database: Path, library: ModelLibrary, settings: Path,
                    confirm: Callable[[DamagedFile], bool]) -> tuple[Store, ModelLibrary, Settings] | None:
    """The store, the library and the settings, each recovered through ``confirm``; None to quit."""
    store = open_or_recover(lambda: open_store(database), confirm)
    if store is None:
        return None
    opened_library = open_or_recover(lambda: open_library(library), confirm)
    opened_settings = open_or_recover(lambda: open_settings(settings), confirm) if opened_library else None
    if opened_settings is None:
        store.close()
        return None
    return store, opened_library, opened_settings


def ask_to_move_aside(damaged: DamagedFile) -> bool:
    """Ask the user (a dialog): move the damaged file aside and start clean, or quit (the default). A file that
    is not damaged (a full disk, a read-only folder) is only explained: the one answer is Quit."""
    from PySide6.QtWidgets import QMessageBox

    reason = f"{damaged.path}\n\n{damaged.reason[:1].upper()}{damaged.reason[1:]}."
    if not damaged.damaged:
        box = QMessageBox(QMessageBox.Warning, "Kvasir can't write its files", reason)
        box.setInformativeText("Your chats are not touched.")
        box.addButton("Quit", QMessageBox.RejectRole)
        box.exec()
        return False
    box = QMessageBox(QMessageBox.Warning, "Kvasir can't read one of its files", reason)
    box.setInformativeText("Kvasir can move this file aside and start with a new one. Nothing is deleted: "
                           f"the file is kept next to it as {damaged.path.name}.damaged-<date>.")
    move = box.addButton("Move it aside and start clean", QMessageBox.AcceptRole)
    quit_button = box.addButton("Quit", QMessageBox.RejectRole)
    box.setDefaultButton(quit_button)  # moving the user's file is never what Enter does
    box.exec()
    return box.clickedButton() is move


def refuse_in_self_test(damaged: DamagedFile) -> bool:
    """Self-test mode has no user to ask: say what is wrong on stderr and quit."""
    print(f"kvasir: {damaged.path}: {damaged.reason}", file=sys.stderr)
    return False
