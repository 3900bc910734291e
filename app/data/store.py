"""Conversations and messages in SQLite (WAL, versioned schema, forward migrations). No Qt in here.

Messages form a tree: editing a message or regenerating a reply adds a sibling under the same parent, and the
conversation's ``head_id`` names the leaf of the branch on screen. Older branches stay, so the user can go
back to them.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

SCHEMA_VERSION = 4
MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        pinned INTEGER NOT NULL DEFAULT 0,
        deleted REAL,
        system_prompt TEXT NOT NULL DEFAULT '',
        preset TEXT,
        settings TEXT NOT NULL DEFAULT '{}',
        head_id INTEGER
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        text TEXT NOT NULL,
        created REAL NOT NULL,
        model TEXT,
        quantization TEXT,
        stats TEXT NOT NULL DEFAULT '{}',
        status TEXT NOT NULL DEFAULT 'complete' CHECK (status IN ('complete', 'partial', 'stopped', 'error')),
        error TEXT
    );
    CREATE INDEX messages_by_conversation ON messages(conversation_id, parent_id);
    """,
    2: """
    CREATE TABLE personas (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE COLLATE NOCASE,
        system_prompt TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    """,
    3: """
    ALTER TABLE messages ADD COLUMN reasoning TEXT NOT NULL DEFAULT '';
    """,
    4: """
    ALTER TABLE messages ADD COLUMN tool_calls TEXT NOT NULL DEFAULT '[]';
    """,
}


class Status(StrEnum):
    """How a stored message ended: whole, cut off by the app closing while it was written, stopped, or failed."""

    COMPLETE = "complete"
    PARTIAL = "partial"
    STOPPED = "stopped"
    ERROR = "error"


CONVERSATION_FIELDS = {"title", "pinned", "system_prompt", "preset", "settings", "head_id", "updated"}
MESSAGE_FIELDS = {"text", "reasoning", "stats", "status", "error", "model", "quantization", "tool_calls"}


@dataclass(slots=True)
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    text: str
    created: float
    model: str | None = None
    quantization: str | None = None
    stats: dict = field(default_factory=dict)
    status: str = Status.COMPLETE
    error: str | None = None
    reasoning: str = ""  # what a thinking model wrote before its answer (``text`` is the answer alone)
    tool_calls: list = field(default_factory=list)  # a reply's tool calls and how each ended (data.tool_calls)


@dataclass(slots=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    pinned: bool = False
    system_prompt: str = ""
    preset: str | None = None
    settings: dict = field(default_factory=dict)
    head_id: int | None = None


class StoreError(Exception):
    """The database can't be used (for example, it was written by a newer Kvasir)."""


class StoreWriteError(StoreError):
    """A write did not reach the database (the disk is full, the file became read-only, an I/O error): nothing
    of it was stored, and what was there before is intact."""


class Store:
    """All reads and writes of the chat database."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        _make_private(self.path)
        self._depth = 0  # nesting of transaction(): only the outermost one commits
        self._db = sqlite3.connect(self.path, isolation_level=None)
        try:
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except BaseException:
            self._db.close()  # a damaged or newer file must not stay open (it is about to be moved aside)
            raise

    def close(self) -> None:
        self._db.close()

    def check(self) -> str | None:
        """None when SQLite finds the file sound; otherwise what it found wrong."""
        try:
            rows = self._db.execute("PRAGMA quick_check").fetchall()  # reads every page; seconds for huge files
        except sqlite3.DatabaseError as exc:
            return str(exc)
        findings = [row[0] for row in rows]
        return None if findings == ["ok"] else "; ".join(findings[:3])

    @property
    def schema_version(self) -> int:
        return self._db.execute("PRAGMA user_version").fetchone()[0]

    # -- conversations ------------------------------------------------------------------------------

    def create_conversation(self, title: str = "New chat", system_prompt: str = "", preset: str | None = None,
                            settings: dict | None = None) -> Conversation:
        now = time.time()
        cursor = self._db.execute(
            "INSERT INTO conversations (title, created, updated, system_prompt, preset, settings) VALUES (?,?,?,?,?,?)",
            (title, now, now, system_prompt, preset, json.dumps(settings or {})),
        )
        return self.conversation(cursor.lastrowid)

    def conversation(self, conversation_id: int) -> Conversation:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return _conversation(row)

    def conversations(self) -> list[Conversation]:
        """Live conversations: pinned first, then the most recently updated."""
        rows = self._db.execute(
            "SELECT * FROM conversations WHERE deleted IS NULL ORDER BY pinned DESC, updated DESC, id DESC"
        )
        return [_conversation(r) for r in rows]

    def update_conversation(self, conversation_id: int, **fields) -> Conversation:
        fields["updated"] = time.time()
        self._update("conversations", CONVERSATION_FIELDS, conversation_id, fields)
        return self.conversation(conversation_id)

    def delete_conversation(self, conversation_id: int) -> None:
        """Hide a conversation; :meth:`undelete_conversation` brings it back until :meth:`purge_deleted`."""
        self._db.execute("UPDATE conversations SET deleted = ? WHERE id = ?", (time.time(), conversation_id))

    def undelete_conversation(self, conversation_id: int) -> None:
        self._db.execute("UPDATE conversations SET deleted = NULL WHERE id = ?", (conversation_id,))

    def purge_deleted(self, older_than_s: float = 0.0) -> int:
        """Delete for good the chats deleted more than ``older_than_s`` seconds ago; returns how many."""
        cutoff = time.time() - older_than_s
        return self._db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL AND deleted <= ?",
                                (cutoff,)).rowcount

    # -- messages -----------------------------------------------------------------------------------

    def add_message(self, conversation_id: int, role: str, text: str, parent_id: int | None = None,
                    **extra) -> Message:
        """Append a message under ``parent_id`` and make it the conversation's head."""
        now = time.time()
        with self.transaction():
            cursor = self._db.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, text, created, model, quantization, stats,"
                " status, error, reasoning, tool_calls) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (conversation_id, parent_id, role, text, now, extra.get("model"), extra.get("quantization"),
                 json.dumps(extra.get("stats", {})), extra.get("status", Status.COMPLETE), extra.get("error"),
                 extra.get("reasoning", ""), json.dumps(extra.get("tool_calls", []))),
            )
            self._db.execute("UPDATE conversations SET head_id = ?, updated = ? WHERE id = ?",
                             (cursor.lastrowid, now, conversation_id))
        return self.message(cursor.lastrowid)

    def update_message(self, message_id: int, **fields) -> Message:
        self._update("messages", MESSAGE_FIELDS, message_id, fields)
        return self.message(message_id)

    def message(self, message_id: int) -> Message:
        row = self._db.execute("SELECT * FROM messages WHERE id = ?", (message_id,)).fetchone()
        if row is None:
            raise KeyError(message_id)
        return _message(row)

    def thread(self, conversation_id: int) -> list[Message]:
        """The messages on screen: from the first one down to the conversation's head."""
        head = self.conversation(conversation_id).head_id
        rows = self._db.execute(
            """WITH RECURSIVE chain(id) AS (SELECT ? UNION ALL
                   SELECT m.parent_id FROM messages m JOIN chain c ON m.id = c.id WHERE m.parent_id IS NOT NULL)
               SELECT messages.* FROM messages JOIN chain ON messages.id = chain.id""",
            (head,),
        ).fetchall()
        return sorted((_message(r) for r in rows), key=lambda m: (m.created, m.id))

    def all_messages(self, conversation_id: int) -> list[Message]:
        """Every message of a conversation, every branch, oldest first."""
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? ORDER BY created, id", (conversation_id,)
        )
        return [_message(r) for r in rows]

    def siblings(self, message_id: int) -> list[Message]:
        """Versions of a message: the messages with the same parent and role, oldest first."""
        msg = self.message(message_id)
        rows = self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ? AND parent_id IS ? AND role = ? ORDER BY created, id",
            (msg.conversation_id, msg.parent_id, msg.role),
        )
        return [_message(r) for r in rows]

    def select_branch(self, message_id: int) -> None:
        """Show the branch through ``message_id``: its newest descendant along the latest children."""
        leaf = message_id
        while True:
            row = self._db.execute(
                "SELECT id FROM messages WHERE parent_id = ? ORDER BY created DESC, id DESC LIMIT 1", (leaf,)
            ).fetchone()
            if row is None:
                break
            leaf = row["id"]
        msg = self.message(message_id)
        self.update_conversation(msg.conversation_id, head_id=leaf)

    def search(self, query: str, limit: int = 50) -> list[tuple[Conversation, Message]]:
        """Messages containing ``query`` (case-insensitive), newest first."""
        pattern = "%" + query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._db.execute(
            """SELECT m.id AS mid, c.id AS cid FROM messages m JOIN conversations c ON c.id = m.conversation_id
               WHERE c.deleted IS NULL AND (m.text LIKE ? ESCAPE '\\' OR c.title LIKE ? ESCAPE '\\')
               ORDER BY m.created DESC LIMIT ?""",
            (pattern, pattern, limit),
        ).fetchall()
        return [(self.conversation(r["cid"]), self.message(r["mid"])) for r in rows]

    # -- the user's personas (named system prompts) -----------------------------------------------------

    def personas(self) -> list[tuple[str, str]]:
        """(name, system prompt) of every persona the user saved, by name."""
        rows = self._db.execute("SELECT name, system_prompt FROM personas ORDER BY name COLLATE NOCASE")
        return [(r["name"], r["system_prompt"]) for r in rows]

    def save_persona(self, name: str, system_prompt: str) -> None:
        """Add a persona, or replace the prompt of the one with this name (names ignore case)."""
        now = time.time()
        self._db.execute(
            "INSERT INTO personas (name, system_prompt, created, updated) VALUES (?,?,?,?) "
            "ON CONFLICT(name) DO UPDATE SET system_prompt = excluded.system_prompt, updated = excluded.updated",
            (name, system_prompt, now, now))

    def rename_persona(self, old: str, new: str) -> None:
        """Rename a persona; the chats that use it follow."""
        with self.transaction():
            if self._db.execute("UPDATE personas SET name = ?, updated = ? WHERE name = ?",
                                (new, time.time(), old)).rowcount == 0:
                raise KeyError(old)
            self._db.execute("UPDATE conversations SET preset = ? WHERE preset = ?", (new, old))

    def delete_persona(self, name: str) -> None:
        """Delete a persona; the chats that used it keep its system prompt, as a custom one."""
        with self.transaction():
            if self._db.execute("DELETE FROM personas WHERE name = ?", (name,)).rowcount == 0:
                raise KeyError(name)
            self._db.execute("UPDATE conversations SET preset = NULL WHERE preset = ?", (name,))

    # -- internals ----------------------------------------------------------------------------------

    def _update(self, table: str, allowed: set[str], row_id: int, fields: dict) -> None:
        """Set ``fields`` (names checked against ``allowed``; dicts and lists as JSON) on one row of ``table``."""
        if not fields.keys() <= allowed:
            raise ValueError(f"unknown fields: {sorted(fields.keys() - allowed)}")
        values = [json.dumps(v) if isinstance(v, dict | list) else v for v in fields.values()]
        assignments = ", ".join(f"{key} = ?" for key in fields)
        with self.transaction():
            self._db.execute(f"UPDATE {table} SET {assignments} WHERE id = ?", (*values, row_id))

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything written inside happens together or not at all; nested uses join the outer one."""
        if self._depth:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        try:
            self._db.execute("BEGIN IMMEDIATE")  # take the write lock now, so a commit can't fail half-way
        except sqlite3.OperationalError as exc:
            _raise_as_write_failure(exc)
            raise
        self._depth = 1
        try:
            yield
            self._db.execute("COMMIT")
        except BaseException as exc:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError):
                _raise_as_write_failure(exc)
            raise
        finally:
            self._depth = 0

    def _migrate(self) -> None:
        current = self.schema_version
        if current > SCHEMA_VERSION:
            raise StoreError(f"{self.path} was written by a newer Kvasir (schema {current} > {SCHEMA_VERSION})")
        for version in range(current + 1, SCHEMA_VERSION + 1):
            with self.transaction():
                for statement in split_statements(MIGRATIONS[version]):
                    self._db.execute(statement)
                self._db.execute(f"PRAGMA user_version = {version}")


def split_statements(script: str) -> list[str]:
    """The SQL statements of ``script``; a ``;`` inside a string literal or a trigger body does not end one."""
    statements, pending = [], ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                statements.append(pending.strip())
            pending = ""
    if pending.strip(" \t\r\n;"):
        raise StoreError(f"incomplete SQL statement in a migration: {pending.strip()[:80]!r}")
    return statements


def _raise_as_write_failure(exc: sqlite3.OperationalError) -> None:
    """Raise a :class:`StoreWriteError` in the user's words when ``exc`` says the write could not reach the
    disk (full, read-only, an I/O error); return otherwise (a fault in Kvasir's own SQL stays what it is)."""
    name = getattr(exc, "sqlite_errorname", "") or ""
    if name == "SQLITE_FULL":
        raise StoreWriteError("the disk is full") from exc
    if name.startswith(("SQLITE_READONLY", "SQLITE_PERM")):
        raise StoreWriteError("the chat database has become read-only") from exc
    if name.startswith(("SQLITE_IOERR", "SQLITE_CANTOPEN")):
        raise StoreWriteError(f"the chat database could not be written ({exc})") from exc


def _make_private(path: Path) -> None:
    """Create the database file (and its folder) readable by the user only: chats are private.

    SQLite gives the WAL and SHM files the permissions of the database file, so they follow."""
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    if os.name != "posix":
        return
    os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists():
            os.chmod(file, 0o600)


def _conversation(row: sqlite3.Row) -> Conversation:
    return Conversation(row["id"], row["title"], row["created"], row["updated"], bool(row["pinned"]),
                        row["system_prompt"], row["preset"], json.loads(row["settings"]), row["head_id"])


def _message(row: sqlite3.Row) -> Message:
    return Message(row["id"], row["conversation_id"], row["parent_id"], row["role"], row["text"], row["created"],
                   row["model"], row["quantization"], json.loads(row["stats"]), row["status"], row["error"],
                   row["reasoning"], json.loads(row["tool_calls"]))
