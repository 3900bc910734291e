"""The remote servers the user added, their API keys, and which of their models a conversation runs on
(:class:`RemoteChoice`, kept in the conversation's settings). No Qt in here.

Servers live in ``remote_servers.json`` in the settings folder, readable by the user only. Each key goes to the
system keyring (``keyring``: macOS Keychain, Windows Credential Locker, the Secret Service on Linux) where
there is one that works; where there is none (a headless Linux machine, say) the key is kept in that file
instead, and :func:`key_storage` says so in words the dialog shows before anything is saved.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from engine.remote import RemoteConfig
from engine.remote.server_url import normalise_base_url

from .settings import config_dir
from .store import Conversation

log = logging.getLogger(__name__)

FILE_NAME = "remote_servers.json"
FORMAT_VERSION = 1
KEYRING_SERVICE = "Kvasir remote servers"
KEY_PLACES = ("keyring", "file", "none")
SETTING = "remote"  # the key of a conversation's settings that names its server and model


class RemoteStoreError(ValueError):
    """The server list can't be read or a server can't be saved; the message says why."""


@dataclass(frozen=True, slots=True)
class RemoteServer:
    """A server the user added. ``key_in``: where its API key is kept ("keyring", "file" or "none")."""

    id: str
    name: str
    base_url: str
    key_in: str = "none"


@dataclass(frozen=True, slots=True)
class KeyStorage:
    """Where a new API key would be kept, and that in words for the dialog."""

    place: str  # "keyring" | "file"
    description: str


@dataclass(frozen=True, slots=True)
class RemoteChoice:
    """A model on a remote server: what a conversation runs on instead of the local engine."""

    server_id: str
    model: str

    def to_setting(self) -> dict:
        return {"server": self.server_id, "model": self.model}

    @classmethod
    def from_setting(cls, value) -> RemoteChoice | None:
        """The choice stored in a conversation's settings, or None (the local engine) for anything else."""
        if isinstance(value, dict) and isinstance(value.get("server"), str) and isinstance(value.get("model"), str):
            return cls(value["server"], value["model"])
        return None


def choice_of(conversation: Conversation) -> RemoteChoice | None:
    """The remote model a conversation runs on; None when it runs on the local engine."""
    return RemoteChoice.from_setting(conversation.settings.get(SETTING))


def key_storage(file: Path) -> KeyStorage:
    """The system keyring when one works here, else ``file`` (readable by the user only)."""
    backend = _keyring_backend()
    if backend is not None:
        return KeyStorage("keyring", f"The API key is kept in the system keyring ({backend}).")
    return KeyStorage("file", "No system keyring is available on this computer, so the API key is kept in "
                              f"{file}, readable only by your user account.")


class RemoteServerStore:
    """``servers()``, ``save(...)``, ``remove(id)``, ``api_key(id)``, ``config(id)``; writes at once."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or config_dir() / FILE_NAME
        self._servers: dict[str, RemoteServer] = {}
        self._file_keys: dict[str, str] = {}
        self.load_error: str | None = None  # the file could not be read: no server is shown, nothing is written
        if self.path.is_file():
            try:
                self._read()
            except RemoteStoreError as exc:
                log.warning("%s", exc)
                self._servers, self._file_keys, self.load_error = {}, {}, str(exc)

    def servers(self) -> list[RemoteServer]:
        """Every server, in the order they were added."""
        return list(self._servers.values())

    def get(self, server_id: str) -> RemoteServer:
        return self._servers[server_id]

    def key_storage(self) -> KeyStorage:
        return key_storage(self.path)

    def save(self, name: str, base_url: str, api_key: str | None, server_id: str | None = None,
             keep_key: bool = False) -> RemoteServer:
        """Add a server (``server_id`` None) or change one; ``keep_key``: leave an edited server's key as it is.
        Raises :class:`RemoteStoreError` with the reason for a missing name, a name in use or a bad address."""
        if self.load_error:
            raise RemoteStoreError(f"{self.load_error}; move it aside or fix it, then open Kvasir again")
        name = (name or "").strip()
        if not name:
            raise RemoteStoreError("give the server a name")
        if any(s.name.lower() == name.lower() and s.id != server_id for s in self._servers.values()):
            raise RemoteStoreError(f"there is already a server called {name!r}")
        try:
            url = normalise_base_url(base_url)
        except ValueError as exc:
            raise RemoteStoreError(str(exc)) from None
        if server_id is not None and server_id not in self._servers:
            raise RemoteStoreError("that server was removed meanwhile")
        server_id = server_id or uuid.uuid4().hex[:12]
        key_in = self._servers[server_id].key_in if keep_key else self._store_key(server_id, api_key)
        self._servers[server_id] = RemoteServer(server_id, name, url, key_in)
        self._write()
        return self._servers[server_id]

    def remove(self, server_id: str) -> None:
        """Forget a server and its key."""
        server = self._servers.pop(server_id, None)
        if server is None:
            return
        self._forget_key(server)
        self._write()

    def api_key(self, server_id: str) -> str | None:
        """The server's key from where it is kept; None when it has none or the keyring can't be read now."""
        server = self._servers[server_id]
        if server.key_in == "file":
            return self._file_keys.get(server_id)
        if server.key_in == "keyring":
            try:
                import keyring

                return keyring.get_password(KEYRING_SERVICE, server_id)
            except Exception as exc:  # a locked or vanished keyring: the request goes without, and 401 says so
                log.warning("could not read the API key of %s from the keyring: %s", server.name, exc)
        return None

    def config(self, server_id: str) -> RemoteConfig:
        """The client configuration of a server, its key included."""
        return RemoteConfig(self._servers[server_id].base_url, api_key=self.api_key(server_id))

    # -- keys -----------------------------------------------------------------------------------------

    def _store_key(self, server_id: str, api_key: str | None) -> str:
        """Keep ``api_key`` where keys go now; an older key of the server is forgotten only once it is."""
        old = self._servers.get(server_id)
        api_key = (api_key or "").strip()
        place = "none" if not api_key else self.key_storage().place
        if place == "keyring":
            try:
                import keyring

                keyring.set_password(KEYRING_SERVICE, server_id, api_key)  # replaces an older key there
            except Exception as exc:
                raise RemoteStoreError(f"the system keyring refused the key ({exc}); nothing was saved") from exc
        if old is not None and old.key_in != place:
            self._forget_key(old)
        if place == "file":
            self._file_keys[server_id] = api_key
        return place

    def _forget_key(self, server: RemoteServer) -> None:
        self._file_keys.pop(server.id, None)
        if server.key_in == "keyring":
            try:
                import keyring

                keyring.delete_password(KEYRING_SERVICE, server.id)
            except Exception as exc:
                log.warning("could not delete the API key of %s from the keyring: %s", server.name, exc)

    # -- the file -------------------------------------------------------------------------------------

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            entries = data["servers"]
            for entry in entries:
                server = RemoteServer(str(entry["id"]), str(entry["name"]), normalise_base_url(entry["base_url"]),
                                      entry.get("key_in", "none") if entry.get("key_in") in KEY_PLACES else "none")
                self._servers[server.id] = server
                if server.key_in == "file" and isinstance(entry.get("api_key"), str):
                    self._file_keys[server.id] = entry["api_key"]
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise RemoteStoreError(f"{self.path} can't be read as a list of servers ({type(exc).__name__}: "
                                   f"{exc})") from None

    def _write(self) -> None:
        entries = []
        for server in self._servers.values():
            entry = asdict(server)
            if server.key_in == "file":
                entry["api_key"] = self._file_keys[server.id]
            entries.append(entry)
        if not self.path.parent.exists():
            self.path.parent.mkdir(parents=True, mode=0o700)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump({"version": FORMAT_VERSION, "servers": entries}, file, indent=2)
        if os.name == "posix":
            os.chmod(tmp, 0o600)
        tmp.replace(self.path)


def _keyring_backend() -> str | None:
    """The name of a keyring backend that can store secrets here, or None."""
    try:
        import keyring
        from keyring.backends import fail
    except ImportError:
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:
        return None
    if isinstance(backend, fail.Keyring) or getattr(backend, "priority", 1) <= 0:
        return None
    chain = getattr(backend, "backends", None)
    if chain is not None and not chain:
        return None
    return getattr(backend, "name", type(backend).__name__)
