"""The model library: the models a user has added, described from their files, kept in the user data dir.

The index, ``library.json``, is the user's record. When it is damaged (not JSON, the wrong shape, an entry
with a missing or unknown field at the same version) every use raises :class:`LibraryError` naming the file and
the fault, and nothing overwrites it: :meth:`ModelLibrary.move_aside` renames it, kept, so the app can start
with an empty library.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, fields
from pathlib import Path

from ..errors import LibraryError, ModelLoadError
from .model_info import ModelInfo, read_model_info
from .sources import resolve_source

DATA_DIR_ENV = "KVASIR_DATA_DIR"
INDEX_VERSION = 1
MAX_INDEX_BYTES = 16 * 1024**2  # about 20,000 models' entries
ENTRY_FIELDS = {"spec": (str,), "info": (dict,), "added": (float, int)}
TYPE_WORDS = {str: "text", int: "a whole number", float: "a number", dict: "an object"}
FIELD_TYPES = {"str": (str,), "int": (int,), "str | None": (str, type(None))}  # ModelInfo's annotations


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
        entries = self._load()  # a damaged index is refused before anything is downloaded or written
        source = resolve_source(spec, download=download)
        stored_spec = spec if source.origin == spec and not Path(spec).exists() else str(source.path.resolve())
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

    def move_aside(self) -> Path:
        """Rename a damaged index to ``library.json.damaged-<timestamp>`` (kept) so the library starts empty."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.index.with_name(f"{self.index.name}.damaged-{stamp}")
        n = 2
        while target.exists():
            target, n = self.index.with_name(f"{self.index.name}.damaged-{stamp}-{n}"), n + 1
        try:
            self.index.rename(target)
        except OSError as exc:
            raise LibraryError(f"could not move {self.index} aside: {exc.strerror or exc}") from None
        return target

    def _default_entry(self) -> LibraryEntry:
        return LibraryEntry("default", read_model_info(resolve_source("default")), 0.0, builtin=True)

    def _load(self) -> list[LibraryEntry]:
        if not self.index.is_file():
            return []
        data = self._read_index()
        models = data.get("models")
        if not isinstance(models, list):
            raise self._damaged("'models' is not a list")
        return [self._entry(i, e) for i, e in enumerate(models)]

    def _read_index(self) -> dict:
        try:
            size = self.index.stat().st_size
            if size > MAX_INDEX_BYTES:  # checked before reading: parsing a huge file would take gigabytes
                raise self._damaged(f"it is {size / 1024**2:,.0f} MiB, and an index is never more than "
                                    f"{MAX_INDEX_BYTES // 1024**2} MiB")
            data = json.loads(self.index.read_bytes())
        except OSError as exc:
            raise LibraryError(f"{self.index} can't be read: {exc.strerror or exc}") from None
        except (ValueError, RecursionError):
            raise self._damaged("it is not valid JSON") from None
        if not isinstance(data, dict):
            raise self._damaged("it is not a JSON object")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise self._damaged(f"its version is {version!r}")
        if version > INDEX_VERSION:
            raise LibraryError(f"{self.index} was written by a newer Kvasir (version {version}); update Kvasir")
        return data

    def _entry(self, i: int, entry) -> LibraryEntry:
        """One stored model; at this version every field is known, so a missing or extra one means damage."""
        if not isinstance(entry, dict):
            raise self._damaged(f"model {i} is not an object")
        if fault := _field_fault(entry, ENTRY_FIELDS):
            raise self._damaged(f"model {i} {fault}")
        if fault := _field_fault(entry["info"], {f.name: FIELD_TYPES[f.type] for f in fields(ModelInfo)}):
            raise self._damaged(f"model {i} ({entry['spec']}): its info {fault}")
        return LibraryEntry(entry["spec"], ModelInfo(**entry["info"]), entry["added"])

    def _damaged(self, reason: str) -> LibraryError:
        return LibraryError(f"the model library {self.index} is damaged: {reason}")

    def _save(self, entries: list[LibraryEntry]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        data = {
            "version": INDEX_VERSION,
            "models": [{"spec": e.spec, "info": e.info.to_dict(), "added": e.added} for e in entries],
        }
        tmp = self.index.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        tmp.replace(self.index)


def _field_fault(record: dict, types: dict[str, tuple[type, ...]]) -> str | None:
    """What is wrong with ``record``: a key of ``types`` missing, a key not in it, or a value of another type."""
    missing, unknown = sorted(types.keys() - record.keys()), sorted(record.keys() - types.keys())
    if missing:
        return f"lacks the field(s) {', '.join(missing)}"
    if unknown:
        return f"has the unknown field(s) {', '.join(unknown)}"
    for key, allowed in types.items():
        value = record[key]
        if isinstance(value, bool) or not isinstance(value, allowed):
            return f"has {key} = {value!r}, which is not {TYPE_WORDS[allowed[0]]}"
    return None


def _renamed(info: ModelInfo, name: str) -> ModelInfo:
    return ModelInfo(**{**info.to_dict(), "name": name})
