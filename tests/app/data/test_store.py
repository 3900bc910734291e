"""The SQLite store: conversations, the message tree, search, soft delete, schema versions."""

import os
import sqlite3

import pytest

from app.data.store import SCHEMA_VERSION, Store, StoreError


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "kvasir.db")
    yield s
    s.close()


def test_new_database_is_wal_and_versioned(store):
    assert store.schema_version == SCHEMA_VERSION
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_newer_schema_is_refused(tmp_path):
    path = tmp_path / "future.db"
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StoreError, match="newer Kvasir"):
        Store(path)


def test_thread_follows_the_head_and_edits_keep_old_branches(store):
    conv = store.create_conversation("Trip")
    q1 = store.add_message(conv.id, "user", "Where to go?")
    a1 = store.add_message(conv.id, "assistant", "Norway.", parent_id=q1.id, model="m", stats={"ttft_s": 0.2})
    q2 = store.add_message(conv.id, "user", "When?", parent_id=a1.id)
    store.add_message(conv.id, "assistant", "Winter.", parent_id=q2.id)
    assert [m.text for m in store.thread(conv.id)] == ["Where to go?", "Norway.", "When?", "Winter."]
    # Edit the second question: a sibling under the same parent, and the thread follows it.
    q2b = store.add_message(conv.id, "user", "How cold is it?", parent_id=a1.id)
    store.add_message(conv.id, "assistant", "Very.", parent_id=q2b.id, status="stopped")
    assert [m.text for m in store.thread(conv.id)] == ["Where to go?", "Norway.", "How cold is it?", "Very."]
    assert [m.text for m in store.siblings(q2b.id)] == ["When?", "How cold is it?"]
    store.select_branch(q2.id)  # go back to the first version
    assert [m.text for m in store.thread(conv.id)][-2:] == ["When?", "Winter."]
    assert store.message(a1.id).stats == {"ttft_s": 0.2}


def test_list_is_pinned_first_then_newest(store):
    a = store.create_conversation("a")
    b = store.create_conversation("b")
    c = store.create_conversation("c")
    store.add_message(a.id, "user", "latest activity")
    assert [x.title for x in store.conversations()] == ["a", "c", "b"]
    store.update_conversation(b.id, pinned=True)
    assert [x.title for x in store.conversations()][0] == "b"
    assert c.id in [x.id for x in store.conversations()]


def test_delete_can_be_undone_until_purged(store):
    conv = store.create_conversation("gone")
    store.add_message(conv.id, "user", "hello")
    store.delete_conversation(conv.id)
    assert store.conversations() == [] and store.search("hello") == []
    store.undelete_conversation(conv.id)
    assert [c.title for c in store.conversations()] == ["gone"]
    store.delete_conversation(conv.id)
    assert store.purge_deleted() == 1
    with pytest.raises(KeyError):
        store.conversation(conv.id)


def test_search_matches_text_and_titles_literally(store):
    conv = store.create_conversation("Recipes")
    store.add_message(conv.id, "user", "How long to bake 100% rye bread?")
    other = store.create_conversation("Other")
    store.add_message(other.id, "user", "nothing relevant")
    assert [m.text for _, m in store.search("100%")] == ["How long to bake 100% rye bread?"]
    assert [c.title for c, _ in store.search("recipes")] == ["Recipes"]
    assert store.search("_") == []


def test_reopening_the_file_keeps_everything(tmp_path):
    path = tmp_path / "kvasir.db"
    first = Store(path)
    conv = first.create_conversation("kept", system_prompt="Be brief.", settings={"temperature": 0.3})
    first.add_message(conv.id, "user", "hi")
    first.close()
    second = Store(path)
    (again,) = second.conversations()
    assert (again.title, again.system_prompt, again.settings) == ("kept", "Be brief.", {"temperature": 0.3})
    assert [m.text for m in second.thread(again.id)] == ["hi"]
    second.close()


def test_older_databases_are_migrated_forward(tmp_path, monkeypatch):
    import app.data.store as store_module

    path = tmp_path / "old.db"
    old = Store(path)
    conv = old.create_conversation("kept across the upgrade")
    old.close()
    following = SCHEMA_VERSION + 1
    monkeypatch.setitem(store_module.MIGRATIONS, following, "ALTER TABLE conversations ADD COLUMN colour TEXT")
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", following)
    upgraded = Store(path)
    assert upgraded.schema_version == following
    assert upgraded.conversation(conv.id).title == "kept across the upgrade"
    columns = [row[1] for row in upgraded._db.execute("PRAGMA table_info(conversations)")]
    assert "colour" in columns
    upgraded.close()


def test_purge_keeps_chats_deleted_within_the_undo_window(store, monkeypatch):
    import app.data.store as store_module

    old = store.create_conversation("deleted long ago")
    recent = store.create_conversation("deleted just now")
    now = store_module.time.time()
    monkeypatch.setattr(store_module.time, "time", lambda: now - 2 * 86400)
    store.delete_conversation(old.id)
    monkeypatch.setattr(store_module.time, "time", lambda: now)
    store.delete_conversation(recent.id)
    assert store.purge_deleted(older_than_s=86400) == 1
    with pytest.raises(KeyError):
        store.conversation(old.id)
    store.undelete_conversation(recent.id)
    assert [c.title for c in store.conversations()] == ["deleted just now"]


def test_migrations_keep_semicolons_inside_strings_and_triggers(tmp_path, monkeypatch):
    import app.data.store as store_module

    migration = """
    CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL DEFAULT 'a; b');
    CREATE TABLE log (what TEXT);
    CREATE TRIGGER note_added AFTER INSERT ON notes BEGIN
        INSERT INTO log VALUES ('added; one');
        INSERT INTO log VALUES ('added; two');
    END;
    INSERT INTO notes (id) VALUES (1);
    """
    following = SCHEMA_VERSION + 1
    monkeypatch.setitem(store_module.MIGRATIONS, following, migration)
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", following)
    upgraded = Store(tmp_path / "kvasir.db")
    assert upgraded.schema_version == following
    assert upgraded._db.execute("SELECT body FROM notes").fetchone()[0] == "a; b"
    assert [r[0] for r in upgraded._db.execute("SELECT what FROM log")] == ["added; one", "added; two"]
    upgraded.close()


def test_split_statements_refuses_an_unfinished_statement():
    from app.data.store import split_statements

    assert split_statements("SELECT 1; SELECT ';'") == ["SELECT 1;", "SELECT ';';"]
    with pytest.raises(StoreError, match="incomplete"):
        split_statements("CREATE TRIGGER t AFTER INSERT ON x BEGIN SELECT 1;")


def test_a_failed_migration_leaves_the_old_version(tmp_path, monkeypatch):
    import app.data.store as store_module

    path = tmp_path / "kvasir.db"
    Store(path).close()
    following = SCHEMA_VERSION + 1
    monkeypatch.setitem(store_module.MIGRATIONS, following, "CREATE TABLE ok (x); CREATE TABLE broken (;")
    monkeypatch.setattr(store_module, "SCHEMA_VERSION", following)
    with pytest.raises(sqlite3.Error):
        Store(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("SELECT COUNT(*) FROM sqlite_master WHERE name = 'ok'").fetchone()[0] == 0
    db.close()


def test_transaction_commits_together_or_not_at_all(store):
    conv = store.create_conversation("kept")
    with pytest.raises(RuntimeError):
        with store.transaction():
            store.add_message(conv.id, "user", "one")  # add_message's own transaction joins this one
            store.add_message(conv.id, "user", "two")
            raise RuntimeError("stop")
    assert store.all_messages(conv.id) == []
    with store.transaction():
        store.add_message(conv.id, "user", "one")
    assert [m.text for m in store.all_messages(conv.id)] == ["one"]


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_database_files_are_readable_by_the_user_only(tmp_path):
    folder = tmp_path / "data"
    s = Store(folder / "kvasir.db")
    s.create_conversation("private")
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    s.close()
    assert {"kvasir.db", "kvasir.db-wal", "kvasir.db-shm"} <= modes.keys()
    assert set(modes.values()) == {0o600}
    assert folder.stat().st_mode & 0o777 == 0o700


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_an_existing_world_readable_database_is_made_private(tmp_path):
    path = tmp_path / "kvasir.db"
    Store(path).close()
    os.chmod(path, 0o644)
    Store(path).close()
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_version_1_database_gains_the_personas_table_and_keeps_its_chats(tmp_path):
    path = tmp_path / "v1.db"
    db = sqlite3.connect(path)
    from app.data.store import MIGRATIONS, split_statements

    for statement in split_statements(MIGRATIONS[1]):
        db.execute(statement)
    db.execute("INSERT INTO conversations (title, created, updated, preset) VALUES ('old chat', 1, 1, 'Concise')")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    upgraded = Store(path)
    assert upgraded.schema_version >= 2 and upgraded.personas() == []
    assert [(c.title, c.preset) for c in upgraded.conversations()] == [("old chat", "Concise")]
    upgraded.save_persona("Pirate", "Talk like a pirate.")
    assert upgraded.personas() == [("Pirate", "Talk like a pirate.")]
    upgraded.close()


def test_personas_are_saved_renamed_and_deleted_with_the_chats_that_use_them(store):
    store.save_persona("Pirate", "Arr.")
    store.save_persona("Butler", "Very good, sir.")
    store.save_persona("pirate", "Arr, matey.")  # names ignore case: this replaces the prompt
    assert store.personas() == [("Butler", "Very good, sir."), ("Pirate", "Arr, matey.")]
    chat = store.create_conversation("sea", system_prompt="Arr, matey.", preset="Pirate")
    store.rename_persona("Pirate", "Captain")
    assert store.conversation(chat.id).preset == "Captain"
    with pytest.raises(sqlite3.IntegrityError):
        store.rename_persona("Butler", "captain")
    store.delete_persona("Captain")
    again = store.conversation(chat.id)
    assert (again.preset, again.system_prompt) == (None, "Arr, matey.")  # the chat keeps its prompt
    with pytest.raises(KeyError):
        store.delete_persona("Captain")
    assert store.personas() == [("Butler", "Very good, sir.")]


def test_a_database_from_before_reasoning_gains_the_column_and_keeps_its_messages(tmp_path):
    import sqlite3

    from app.data.store import MIGRATIONS, split_statements

    path = tmp_path / "schema2.db"
    db = sqlite3.connect(path)
    for version in (1, 2):  # the file as Kvasir wrote it before replies kept their reasoning
        for statement in split_statements(MIGRATIONS[version]):
            db.execute(statement)
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES (1, 'old', 0, 0)")
    db.execute("INSERT INTO messages (id, conversation_id, role, text, created) VALUES (1, 1, 'assistant', 'hi', 0)")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    upgraded = Store(path)
    assert upgraded.schema_version == SCHEMA_VERSION == 4
    old = upgraded.message(1)
    assert (old.text, old.reasoning) == ("hi", "")
    assert upgraded.update_message(1, reasoning="I thought about it").reasoning == "I thought about it"
    upgraded.close()


def test_a_replys_reasoning_is_stored_and_read_back(tmp_path):
    path = tmp_path / "kvasir.db"
    first = Store(path)
    conv = first.create_conversation("thinking")
    reply = first.add_message(conv.id, "assistant", "Paris.", reasoning="France's capital is Paris.",
                              stats={"reasoning_tokens": 7, "reasoning_s": 0.4})
    first.close()
    again = Store(path)
    kept = again.thread(conv.id)[-1]
    assert (kept.id, kept.text, kept.reasoning) == (reply.id, "Paris.", "France's capital is Paris.")
    assert (kept.stats["reasoning_tokens"], kept.stats["reasoning_s"]) == (7, 0.4)
    again.close()


def test_a_database_from_before_tool_calls_gains_the_column_and_keeps_its_messages(tmp_path):
    import sqlite3

    from app.data.store import MIGRATIONS, split_statements

    path = tmp_path / "schema3.db"
    db = sqlite3.connect(path)
    for version in (1, 2, 3):  # the file as Kvasir wrote it before replies kept their tool calls
        for statement in split_statements(MIGRATIONS[version]):
            db.execute(statement)
    db.execute("INSERT INTO conversations (id, title, created, updated) VALUES (1, 'old', 0, 0)")
    db.execute("INSERT INTO messages (id, conversation_id, role, text, created, reasoning)"
               " VALUES (1, 1, 'assistant', 'hi', 0, 'hm')")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    upgraded = Store(path)
    assert upgraded.schema_version == SCHEMA_VERSION == 4
    old = upgraded.message(1)
    assert (old.text, old.reasoning, old.tool_calls) == ("hi", "hm", [])
    call = {"id": "call_1", "name": "add", "arguments": '{"a": 1}', "status": "done", "result": "1"}
    assert upgraded.update_message(1, tool_calls=[call]).tool_calls == [call]
    upgraded.close()
    assert Store(path).message(1).tool_calls == [call]
