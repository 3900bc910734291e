"""Opening the user's files at start: the chat database, the model library and settings.json.

Each opener returns the object, or a :class:`DamagedFile` saying which file and what is wrong with it, so
start-up can offer to move the file aside (kept, renamed ``<name>.damaged-<timestamp>``) instead of crashing.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from engine import LibraryError, ModelLibrary

from ..data.settings import Settings, SettingsError
from ..data.store import Store, StoreError

DELETED_KEPT_S = 24 * 3600  # deleted chats can be restored for a day; after that they are purged at start
SQLITE_COMPANIONS = ("-wal", "-shm", "-journal")


@dataclass(frozen=True, slots=True)
class DamagedFile:
    """A file Kvasir can't use as it is, and why."""

    path: Path
    reason: str


def open_store(path: Path) -> Store | DamagedFile:
    """The chat database, checked and with long-deleted chats purged; or why it can't be used."""
    try:
        store = Store(path)
    except (sqlite3.DatabaseError, StoreError) as exc:
        return DamagedFile(path, _database_reason(exc))
    problem = store.check()
    if problem is not None:
        store.close()
        return DamagedFile(path, f"the chat database is damaged: {problem}")
    store.purge_deleted(older_than_s=DELETED_KEPT_S)
    return store


def _database_reason(exc: Exception) -> str:
    if isinstance(exc, StoreError):
        return str(exc)
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
    if not confirm(result):
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
    """Ask the user (a dialog): move the damaged file aside and start clean, or quit."""
    from PySide6.QtWidgets import QMessageBox

    box = QMessageBox(QMessageBox.Warning, "Kvasir can't read one of its files",
                      f"{damaged.path}\n\n{damaged.reason[:1].upper()}{damaged.reason[1:]}.")
    box.setInformativeText("Kvasir can move this file aside and start with a new one. Nothing is deleted: "
                           f"the file is kept next to it as {damaged.path.name}.damaged-<date>.")
    move = box.addButton("Move it aside and start clean", QMessageBox.AcceptRole)
    box.addButton("Quit", QMessageBox.RejectRole)
    box.setDefaultButton(move)
    box.exec()
    return box.clickedButton() is move


def refuse_in_self_test(damaged: DamagedFile) -> bool:
    """Self-test mode has no user to ask: say what is wrong on stderr and quit."""
    print(f"kvasir: {damaged.path}: {damaged.reason}", file=sys.stderr)
    return False
