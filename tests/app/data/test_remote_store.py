"""Remote servers on disk and their keys: the system keyring where one works, else the settings file, readable
only by the user; bad names and addresses are refused with the reason."""

import json
import os
import stat

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends import fail

from app.data.remote_store import KEYRING_SERVICE, RemoteServerStore, RemoteStoreError


class MemoryKeyring(KeyringBackend):
    """A working keyring backend that keeps secrets in memory."""

    priority = 1

    def __init__(self) -> None:
        super().__init__()
        self.secrets: dict[tuple[str, str], str] = {}

    def get_password(self, service, username):
        return self.secrets.get((service, username))

    def set_password(self, service, username, password):
        self.secrets[(service, username)] = password

    def delete_password(self, service, username):
        self.secrets.pop((service, username), None)


@pytest.fixture
def memory_keyring():
    previous = keyring.get_keyring()
    backend = MemoryKeyring()
    keyring.set_keyring(backend)
    yield backend
    keyring.set_keyring(previous)


@pytest.fixture
def no_keyring():
    previous = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(previous)


def test_with_a_keyring_the_key_goes_there_and_never_into_the_file(tmp_path, memory_keyring):
    store = RemoteServerStore(tmp_path / "remote_servers.json")
    assert store.key_storage().place == "keyring" and "system keyring" in store.key_storage().description
    server = store.save("Lab", "http://gpu-box:8000/v1/", "sk-secret")
    assert server.base_url == "http://gpu-box:8000" and server.key_in == "keyring"
    assert memory_keyring.secrets[(KEYRING_SERVICE, server.id)] == "sk-secret"
    assert "sk-secret" not in (tmp_path / "remote_servers.json").read_text()
    again = RemoteServerStore(tmp_path / "remote_servers.json")
    assert again.servers() == [server] and again.api_key(server.id) == "sk-secret"
    assert again.config(server.id).api_key == "sk-secret"
    again.remove(server.id)
    assert memory_keyring.secrets == {} and RemoteServerStore(tmp_path / "remote_servers.json").servers() == []


def test_without_a_keyring_the_key_stays_in_a_file_only_the_user_can_read(tmp_path, no_keyring):
    path = tmp_path / "remote_servers.json"
    store = RemoteServerStore(path)
    storage = store.key_storage()
    assert storage.place == "file" and "No system keyring" in storage.description and str(path) in storage.description
    server = store.save("Lab", "https://llm.example", "sk-file")
    assert server.key_in == "file" and json.loads(path.read_text())["servers"][0]["api_key"] == "sk-file"
    if os.name == "posix":
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert RemoteServerStore(path).api_key(server.id) == "sk-file"


def test_editing_keeps_replaces_or_clears_the_key(tmp_path, memory_keyring):
    store = RemoteServerStore(tmp_path / "s.json")
    server = store.save("Lab", "http://h:1", "sk-1")
    renamed = store.save("Lab 2", "http://h:2", None, server.id, keep_key=True)
    assert (renamed.id, renamed.name, renamed.key_in, store.api_key(server.id)) == (server.id, "Lab 2", "keyring",
                                                                                    "sk-1")
    store.save("Lab 2", "http://h:2", "sk-2", server.id)
    assert store.api_key(server.id) == "sk-2"
    cleared = store.save("Lab 2", "http://h:2", "", server.id)
    assert cleared.key_in == "none" and store.api_key(server.id) is None and memory_keyring.secrets == {}


def test_a_server_without_a_key_needs_no_keyring(tmp_path, no_keyring):
    server = RemoteServerStore(tmp_path / "s.json").save("Local llama", "http://127.0.0.1:8080", None)
    assert server.key_in == "none"


@pytest.mark.parametrize("name, url, reason", [
    ("", "http://h", "give the server a name"),
    ("Lab", "h:8000", "start it with http"),
    ("Lab", "ftp://h", "only http"),
])
def test_bad_servers_are_refused_with_the_reason(tmp_path, no_keyring, name, url, reason):
    store = RemoteServerStore(tmp_path / "s.json")
    with pytest.raises(RemoteStoreError, match=reason):
        store.save(name, url, None)
    assert store.servers() == [] and not (tmp_path / "s.json").exists()


def test_names_are_unique_regardless_of_case(tmp_path, no_keyring):
    store = RemoteServerStore(tmp_path / "s.json")
    first = store.save("Lab", "http://a", None)
    with pytest.raises(RemoteStoreError, match="already a server called 'lab'"):
        store.save("lab", "http://b", None)
    assert store.save("Lab", "http://c", None, first.id).base_url == "http://c"  # its own name is fine


def test_a_damaged_file_is_read_as_no_server_and_never_overwritten(tmp_path, no_keyring):
    path = tmp_path / "s.json"
    damaged = '{"servers": [{"id": "x", "name": "n", "base_url": "not a url"}]}'
    path.write_text(damaged)
    store = RemoteServerStore(path)
    assert store.servers() == [] and "can't be read as a list of servers" in store.load_error
    with pytest.raises(RemoteStoreError, match="move it aside or fix it"):
        store.save("Lab", "http://h", None)
    assert path.read_text() == damaged
