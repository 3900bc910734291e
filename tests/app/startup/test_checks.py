"""Damaged files at start: named, explained, moved aside (kept) on request, never a traceback."""

import json
import sqlite3
import time

import pytest
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QMessageBox

from app.__main__ import main
from app.data.settings import Settings
from app.data.store import SCHEMA_VERSION, Store
from app.startup.checks import (
    DamagedFile,
    ask_to_move_aside,
    move_aside,
    open_library,
    open_or_recover,
    open_settings,
    open_store,
    open_user_files,
)
from engine.models.library import ModelLibrary


def truncated_database(path):
    """A real database with chats, cut in half as a full disk or a crash in a copy would leave it."""
    store = Store(path)
    conv = store.create_conversation("kept")
    for i in range(300):
        store.add_message(conv.id, "user", f"message {i} " * 40)
    store._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def newer_database(path):
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()


DAMAGED_DATABASES = {
    "not a database": (lambda p: p.write_bytes(b"this is a text file, not SQLite" * 100), "not a database"),
    "truncated": (truncated_database, "malformed"),
    "newer version": (newer_database, "newer Kvasir"),
}


@pytest.mark.parametrize("name", DAMAGED_DATABASES)
def test_a_damaged_database_is_reported_not_raised(tmp_path, name):
    spoil, words = DAMAGED_DATABASES[name]
    path = tmp_path / "kvasir.db"
    spoil(path)
    result = open_store(path)
    assert isinstance(result, DamagedFile) and result.path == path and words in result.reason


def test_a_sound_database_opens_and_purges_chats_deleted_over_a_day_ago(tmp_path, monkeypatch):
    import app.data.store as store_module

    path = tmp_path / "kvasir.db"
    store = Store(path)
    old, recent = store.create_conversation("old"), store.create_conversation("recent")
    now = time.time()
    monkeypatch.setattr(store_module.time, "time", lambda: now - 3 * 86400)
    store.delete_conversation(old.id)
    monkeypatch.undo()
    store.delete_conversation(recent.id)
    store.close()
    opened = open_store(path)
    count = opened._db.execute("SELECT COUNT(*) FROM conversations").fetchone()[0]
    opened.close()
    assert count == 1  # the recent one can still be undeleted


def test_damaged_library_and_settings_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    library = ModelLibrary()
    library.root.mkdir(parents=True)
    entry = {"spec": "/x", "added": 1.0, "info": {"name": "x"}, "colour": "red"}
    library.index.write_text(json.dumps({"version": 1, "models": [entry]}))
    damaged = open_library(library)
    assert isinstance(damaged, DamagedFile) and damaged.path == library.index and "damaged" in damaged.reason
    (tmp_path / "settings.json").write_text("[1, 2, 3]")
    damaged = open_settings(tmp_path / "settings.json")
    assert isinstance(damaged, DamagedFile) and "not an object" in damaged.reason
    library.index.write_text("{not json")
    assert "not valid JSON" in open_library(library).reason


def test_move_aside_keeps_the_file_and_its_wal_and_never_overwrites(tmp_path):
    path = tmp_path / "kvasir.db"
    path.write_bytes(b"damaged")
    (tmp_path / "kvasir.db-wal").write_bytes(b"wal")
    first = move_aside(path)
    path.write_bytes(b"damaged again")
    second = move_aside(path)
    assert first != second and first.name.startswith("kvasir.db.damaged-")
    assert first.read_bytes() == b"damaged" and second.read_bytes() == b"damaged again"
    assert (tmp_path / (first.name + "-wal")).read_bytes() == b"wal" and not path.exists()


def test_recovery_moves_the_file_aside_only_when_the_user_agrees(tmp_path):
    path = tmp_path / "kvasir.db"
    path.write_bytes(b"garbage" * 100)
    asked = []
    assert open_or_recover(lambda: open_store(path), lambda d: asked.append(d) or False) is None
    assert path.read_bytes() == b"garbage" * 100 and len(asked) == 1
    store = open_or_recover(lambda: open_store(path), lambda d: True)
    assert isinstance(store, Store) and store.conversations() == []
    store.close()
    (kept,) = tmp_path.glob("kvasir.db.damaged-*")
    assert kept.read_bytes() == b"garbage" * 100


def answer_dialog(button_text, seen):
    """Click ``button_text`` in the message box once it is shown (it runs its own event loop)."""
    def click():
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(10, click)
            return
        seen.append(box.text())
        seen.append(box.defaultButton().text() if box.defaultButton() else None)
        next(b for b in box.buttons() if b.text() == button_text).click()
    QTimer.singleShot(0, click)


@pytest.mark.real_dialogs
def test_the_dialog_names_the_file_and_moves_it_aside(qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    (tmp_path / "settings.json").write_text('"dark"')
    seen = []
    answer_dialog("Move it aside and start clean", seen)
    opened = open_user_files(tmp_path / "kvasir.db", ModelLibrary(), tmp_path / "settings.json", ask_to_move_aside)
    assert opened is not None and isinstance(opened[2], Settings)
    opened[0].close()
    assert str(tmp_path / "settings.json") in seen[0] and "not an object" in seen[0]
    assert [p.read_text() for p in tmp_path.glob("settings.json.damaged-*")] == ['"dark"']


@pytest.mark.real_dialogs
def test_quit_in_the_dialog_leaves_the_file_alone(qtbot, tmp_path):
    path = tmp_path / "kvasir.db"
    path.write_bytes(b"garbage" * 100)
    seen = []
    answer_dialog("Quit", seen)
    assert open_or_recover(lambda: open_store(path), ask_to_move_aside) is None
    assert "not a database" in seen[0] and path.read_bytes() == b"garbage" * 100
    assert seen[1] == "Quit"  # Enter never moves the user's file
    assert list(tmp_path.glob("*.damaged-*")) == []


def test_self_test_mode_prints_the_reason_and_exits_1(qapp, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))
    (tmp_path / "kvasir.db").write_bytes(b"garbage" * 100)
    assert main(["--self-test", "--data-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert str(tmp_path / "kvasir.db") in err and "not a database" in err
    assert (tmp_path / "kvasir.db").read_bytes() == b"garbage" * 100


def real_sqlite_error(kind: str) -> sqlite3.OperationalError:
    """The error SQLite itself raises for a full disk ("full") or a read-only database ("read-only")."""
    import tempfile
    from pathlib import Path

    folder = Path(tempfile.mkdtemp())
    sqlite3.connect(folder / "x.db").execute("CREATE TABLE t (x)").connection.close()
    if kind == "full":
        db = sqlite3.connect(folder / "x.db")
        db.execute("PRAGMA max_page_count = 2")
        statement = "INSERT INTO t VALUES (randomblob(100000))"
    else:
        db = sqlite3.connect(f"file:{folder / 'x.db'}?mode=ro", uri=True)
        statement = "INSERT INTO t VALUES (1)"
    with pytest.raises(sqlite3.OperationalError) as caught:
        db.execute(statement)
    db.close()
    return caught.value


@pytest.mark.parametrize("kind, words", [("full", "the disk holding it is full"),
                                         ("read-only", "may not write in its folder")])
def test_a_full_disk_or_a_read_only_folder_is_not_called_damage_and_the_file_stays(tmp_path, monkeypatch, kind,
                                                                                     words):
    path = tmp_path / "kvasir.db"
    Store(path).close()
    sound = path.read_bytes()
    error = real_sqlite_error(kind)

    def failing_store(_path):
        raise error

    monkeypatch.setattr("app.startup.checks.Store", failing_store)
    result = open_store(path)
    assert isinstance(result, DamagedFile) and not result.damaged and words in result.reason
    asked = []
    assert open_or_recover(lambda: open_store(path), lambda d: asked.append(d) or True) is None
    assert len(asked) == 1 and path.read_bytes() == sound and list(tmp_path.glob("*.damaged-*")) == []


@pytest.mark.real_dialogs
def test_the_full_disk_dialog_offers_only_quit(qtbot, tmp_path):
    seen = []
    answer_dialog("Quit", seen)
    assert ask_to_move_aside(DamagedFile(tmp_path / "kvasir.db", "the disk holding it is full", damaged=False)) is False
    assert "the disk holding it is full" in seen[0].lower()


def test_a_folder_or_a_looping_link_where_the_database_goes_is_reported_not_raised(tmp_path):
    folder = tmp_path / "kvasir.db"
    folder.mkdir()
    result = open_store(folder)
    assert isinstance(result, DamagedFile) and result.damaged and "a folder, not a file" in result.reason
    loop = tmp_path / "loop.db"
    loop.symlink_to(tmp_path / "loop.db")
    result = open_store(loop)
    assert isinstance(result, DamagedFile) and result.damaged and "loops" in result.reason


def test_settings_nested_too_deep_are_reported_not_raised(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    result = open_settings(path)
    assert isinstance(result, DamagedFile) and "too deep" in result.reason


def test_a_remote_servers_file_nested_too_deep_is_refused_in_words(tmp_path):
    from app.data.remote_store import RemoteServerStore

    path = tmp_path / "remote_servers.json"
    path.write_text('{"servers": ' + "[" * 100_000 + "]" * 100_000 + "}")
    store = RemoteServerStore(path)
    assert store.servers() == [] and "RecursionError" in store.load_error


def test_the_stores_own_full_disk_error_is_not_called_damage(tmp_path, monkeypatch):
    from app.data.store import StoreWriteError

    path = tmp_path / "kvasir.db"
    Store(path).close()

    def failing_store(_path):
        try:
            raise real_sqlite_error("full")
        except sqlite3.OperationalError as exc:
            raise StoreWriteError("the disk is full") from exc

    monkeypatch.setattr("app.startup.checks.Store", failing_store)
    result = open_store(path)
    assert isinstance(result, DamagedFile) and not result.damaged and "full" in result.reason
