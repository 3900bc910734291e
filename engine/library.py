"""The model library: the models a user has added, described from their files, kept in the user data dir."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError
from .model_info import ModelInfo, read_model_info
from .sources import resolve_source

DATA_DIR_ENV = "KVASIR_DATA_DIR"
INDEX_VERSION = 1


def data_dir() -> Path:
    """Kvasir's user data folder (``KVASIR_DATA_DIR`` overrides it)."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_data_dir("Kvasir", appauthor=False))


@dataclass(frozen=True, slots=True)
class LibraryEntry:
    """A model in the library: what it is, and the setting that loads it (``EngineConfig(model=spec)``)."""

    spec: str
    info: ModelInfo
    added: float
    builtin: bool = False

    @property
    def name(self) -> str:
        return self.info.name


class ModelLibrary:
    """Add, list, describe and remove models. The bundled default model is always there."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or data_dir() / "models"
        self.index = self.root / "library.json"

    def entries(self) -> list[LibraryEntry]:
        """The default model first, then the added ones, newest first."""
        stored = sorted(self._load(), key=lambda e: e.added, reverse=True)
        return [self._default_entry(), *stored]

    def get(self, name: str) -> LibraryEntry:
        for entry in self.entries():
            if entry.name == name:
                return entry
        known = ", ".join(e.name for e in self.entries())
        raise ModelLoadError(f"no model named {name!r} in the library (it has: {known})")

    def add(self, spec: str, download: bool = True) -> LibraryEntry:
        """Check and describe ``spec`` (a file, folder or Hub repo id, downloaded if needed), then record it."""
        source = resolve_source(spec, download=download)
        stored_spec = spec if source.origin == spec and not Path(spec).exists() else str(source.path.resolve())
        entries = self._load()
        for entry in entries:
            if entry.spec == stored_spec:
                return entry
        info = read_model_info(source)
        taken = {e.name for e in self.entries()}
        name, n = info.name, 2
        while name in taken:
            name, n = f"{info.name}-{n}", n + 1
        entry = LibraryEntry(stored_spec, _renamed(info, name), time.time())
        self._save([*entries, entry])
        return entry

    def remove(self, name: str) -> LibraryEntry:
        """Forget a model (its files stay where they are)."""
        entry = self.get(name)
        if entry.builtin:
            raise ModelLoadError("the bundled default model can't be removed")
        self._save([e for e in self._load() if e.name != name])
        return entry

    def _default_entry(self) -> LibraryEntry:
        return LibraryEntry("default", read_model_info(resolve_source("default")), 0.0, builtin=True)

    def _load(self) -> list[LibraryEntry]:
        if not self.index.is_file():
            return []
        data = json.loads(self.index.read_text())
        if data.get("version", 0) > INDEX_VERSION:
            raise ModelLoadError(f"{self.index} was written by a newer Kvasir (version {data['version']})")
        return [LibraryEntry(e["spec"], ModelInfo(**e["info"]), e["added"]) for e in data.get("models", [])]

    def _save(self, entries: list[LibraryEntry]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {
            "version": INDEX_VERSION,
            "models": [{"spec": e.spec, "info": e.info.to_dict(), "added": e.added} for e in entries],
        }
        tmp = self.index.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.index)


def _renamed(info: ModelInfo, name: str) -> ModelInfo:
    return ModelInfo(**{**info.to_dict(), "name": name})
