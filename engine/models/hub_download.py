"""Downloading a Hub model into the models folder: with progress, cancellable, resumable, then into the library.

huggingface_hub's ``hf_hub_download`` writes each attempt to a file of its own and deletes it on any failure,
so an interrupted download starts again from zero, and it reads in 10 MB chunks, so a cancel waits for one.
Here each file is fetched with huggingface_hub's HTTP session into ``<name>.<commit>.part`` beside its final
place; a later attempt continues it with a Range request. The URL names the repository's commit, so the
bytes can't change between attempts. A finished file is checked (size, and SHA-256 where the Hub lists one)
before it is renamed into place, and the model is added to the library only when every file is there: nothing
half-downloaded is ever in the library.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import DownloadCancelled, HubError
from .hub_api import endpoint, http_module, in_words
from .hub_search import HubOption, HubRepo, RemoteFile
from .library import LibraryEntry, ModelLibrary

HUB_FOLDER = "hub"  # under the library's models folder: one folder per repository
HASH_CHUNK = 8 * 1024**2


@dataclass(frozen=True, slots=True)
class DownloadSettings:
    retries: int = 3  # attempts after a dropped connection, each continuing where the last stopped
    retry_wait_s: float = 2.0
    progress_interval_s: float = 0.1  # at most this often, and once at the end
    read_timeout_s: float | None = None  # None: huggingface_hub's HF_HUB_DOWNLOAD_TIMEOUT


@dataclass(frozen=True, slots=True)
class DownloadProgress:
    done: int  # bytes of the option on disk (resumed bytes included)
    total: int
    file: str  # the file being fetched now
    resumed_from: int = 0  # bytes that were already there when this download started


ProgressCallback = Callable[[DownloadProgress], None]


def download_folder(library: ModelLibrary, repo_id: str) -> Path:
    """Where a repository's files go: ``<models>/hub/<owner>--<name>``."""
    return library.root / HUB_FOLDER / repo_id.replace("/", "--")


class HubDownload:
    """One option of a repository, downloaded by :meth:`run` (on any thread), cancelled by :meth:`cancel`."""

    def __init__(self, repo: HubRepo, option: HubOption, library: ModelLibrary, address: str | None = None,
                 progress: ProgressCallback | None = None, settings: DownloadSettings | None = None) -> None:
        if option.problem:
            raise HubError(f"{option.name} can't be used: {option.problem}")
        self.repo, self.option, self.library = repo, option, library
        self.address = address or endpoint()
        self.progress = progress or (lambda p: None)
        self.settings = settings or DownloadSettings()
        self.folder = download_folder(library, repo.repo_id)
        self._cancelled = threading.Event()
        self._done = 0
        self._resumed = 0
        self._last_report = 0.0

    def cancel(self) -> None:
        """Stop soon (within one network read); what arrived stays for the next attempt."""
        self._cancelled.set()

    @property
    def target(self) -> Path:
        """What the library will load: the GGUF file, or the folder of the safetensors model."""
        return self.folder / self.option.name if self.option.kind == "gguf" else self.folder

    def run(self) -> LibraryEntry:
        """Fetch every file (continuing partial ones), check them, then add the model to the library."""
        files = self.option.files
        self._resumed = self._done = sum(self._on_disk(f) for f in files)
        self._check_disk_space(self.option.size - self._done)
        for file in files:
            self._fetch(file)
        self._report(self.option.files[-1].path, force=True)
        return self.library.add(str(self.target), download=False)

    def partial_bytes(self) -> int:
        """Bytes of this option already on disk, finished or partial."""
        return sum(self._on_disk(f) for f in self.option.files)

    # -- one file ---------------------------------------------------------------------------------------

    def _final(self, file: RemoteFile) -> Path:
        path = self.folder / file.path
        if not path.resolve().is_relative_to(self.folder.resolve()):  # the listing's names are checked; twice
            raise HubError(f"the file name {file.path!r} would land outside the model's folder; not downloaded")
        return path

    def _part(self, file: RemoteFile) -> Path:
        final = self._final(file)
        return final.with_name(f"{final.name}.{self.repo.revision[:16]}.part")

    def _on_disk(self, file: RemoteFile) -> int:
        final, part = self._final(file), self._part(file)
        if final.is_file() and final.stat().st_size == file.size:
            return file.size
        return min(part.stat().st_size, file.size) if part.is_file() else 0

    def _fetch(self, file: RemoteFile) -> None:
        final, part = self._final(file), self._part(file)
        if final.is_file() and final.stat().st_size == file.size:
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        self._remove_stale_parts(final, part)
        for attempt in range(self.settings.retries + 1):
            try:
                self._stream(file, part)
                break
            except HubError as exc:
                if self._cancelled.is_set() and not isinstance(exc, DownloadCancelled):
                    raise DownloadCancelled(self._cancel_message()) from None  # a read cut short by the cancel
                if isinstance(exc, DownloadCancelled) or attempt == self.settings.retries or not _transient(exc):
                    raise
                if self._cancelled.wait(self.settings.retry_wait_s):
                    raise DownloadCancelled(self._cancel_message()) from None
        self._verify(file, part)
        part.replace(final)

    def _remove_stale_parts(self, final: Path, part: Path) -> None:
        """Partial files of other commits of the repository can't be continued."""
        for other in final.parent.glob(f"{final.name}.*.part"):
            if other != part:
                other.unlink(missing_ok=True)

    def _stream(self, file: RemoteFile, part: Path) -> None:
        from huggingface_hub import constants, hf_hub_url
        from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

        have = part.stat().st_size if part.is_file() else 0
        if have > file.size:  # not this file's bytes; start over
            part.unlink()
            have = 0
        if have == file.size:
            return
        url = hf_hub_url(self.repo.repo_id, file.path, revision=self.repo.revision, endpoint=self.address)
        headers = build_hf_headers(library_name="kvasir")
        if have:
            headers["Range"] = f"bytes={have}-"
        timeout = self.settings.read_timeout_s or constants.HF_HUB_DOWNLOAD_TIMEOUT
        with in_words(f"the download of {file.path} stopped at {_mb(self._done)}", self.address):
            with get_session().stream("GET", url, headers=headers, timeout=timeout) as response:
                hf_raise_for_status(response)
                start = _start_of(response, have)
                with open(part, "r+b" if part.exists() else "wb") as out:
                    out.truncate(start)
                    out.seek(start)
                    self._done += start - have
                    self._copy(response, out, file)

    def _copy(self, response, out, file: RemoteFile) -> None:
        for chunk in response.iter_bytes():
            if self._cancelled.is_set():
                raise DownloadCancelled(self._cancel_message())
            out.write(chunk)
            self._done += len(chunk)
            self._report(file.path)

    def _verify(self, file: RemoteFile, part: Path) -> None:
        size = part.stat().st_size
        if size != file.size:
            part.unlink()
            raise HubError(f"{file.path} arrived with {size:,} bytes instead of {file.size:,}; download it again")
        if file.sha256 and _sha256(part, self._cancelled) != file.sha256:
            part.unlink()
            raise HubError(f"{file.path} arrived damaged (its SHA-256 is not the Hub's); download it again")

    def _check_disk_space(self, needed: int) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.folder).free
        if needed > free:
            raise HubError(f"{self.repo.repo_id} needs {_mb(needed)} more on disk; {_mb(free)} is free in "
                           f"{self.folder.parent}")

    def _report(self, name: str, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_report >= self.settings.progress_interval_s:
            self._last_report = now
            self.progress(DownloadProgress(self._done, self.option.size, name, self._resumed))

    def _cancel_message(self) -> str:
        return f"the download of {self.option.name} was cancelled at {_mb(self._done)}; downloading again continues"


def _start_of(response, have: int) -> int:
    """Where the response's bytes begin: ``have`` for a 206 answer to our Range, 0 when the server sent it all."""
    if have and response.status_code == 206:
        given = response.headers.get("Content-Range", "")
        if not given.startswith(f"bytes {have}-"):
            raise HubError(f"the server answered a request from byte {have:,} with {given or 'no range'}")
        return have
    return 0


def _transient(exc: HubError) -> bool:
    """A dropped or timed-out connection is worth another attempt; a refusal by the server is not."""
    http = http_module()
    return isinstance(exc.__cause__, http.TransportError)


def _sha256(path: Path, cancelled: threading.Event) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            if cancelled.is_set():
                raise DownloadCancelled(f"the check of {path.name} was cancelled; downloading again repeats it")
            digest.update(chunk)
    return digest.hexdigest()


def _mb(n: int) -> str:
    return f"{n / 1024**3:.2f} GB" if n >= 1024**3 else f"{n / 1024**2:.1f} MB"
