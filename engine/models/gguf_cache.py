"""A converted copy of each GGUF model, so it loads in seconds after the first time.

transformers reads GGUF in Python (the tokenizer's vocabulary, tensor name mapping, dequantisation), which
takes tens of seconds even for a small model. After the first load through transformers, the dequantised
weights in the compute dtype (exactly the values transformers produced) and the tokenizer are saved as a
Hugging Face folder in the user cache; later loads read that folder instead (tensor by tensor, see
:mod:`.streamed_weights`). The key covers the file's path, size and modification time, the dtype and the
transformers version, so a changed file or library is converted afresh.

A copy is about five times its GGUF file, so the cache looks after its disk: a new copy of a file replaces the
older copies of the same file, the least recently used copies go when the total passes a cap
(``KVASIR_GGUF_CACHE_MAX_BYTES``, default 4 GiB), a copy that would leave less than 1 GiB free is not made,
and a failed write leaves nothing behind. Caching is only a speed-up: no failure here fails a load.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from .sources import ModelSource

log = logging.getLogger(__name__)
CACHE_ENV = "KVASIR_CACHE_DIR"
MAX_BYTES_ENV = "KVASIR_GGUF_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 4 * 1024**3
FREE_MARGIN_BYTES = 1024**3  # disk that must stay free after a copy is written
COMPLETE_MARKER = ".complete"  # written last; holds the GGUF file's path
STAGING_PREFIX = ".staging-"
STALE_STAGING_S = 3600  # a staging folder this old belongs to no running write


def cache_root() -> Path:
    """Kvasir's user cache folder (``KVASIR_CACHE_DIR`` overrides it)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("Kvasir", appauthor=False))


def max_bytes() -> int:
    """The cap on the converted copies' total size: ``KVASIR_GGUF_CACHE_MAX_BYTES`` or 4 GiB."""
    value = os.environ.get(MAX_BYTES_ENV)
    if value is None:
        return DEFAULT_MAX_BYTES
    try:
        return max(0, int(value))
    except ValueError:
        log.warning("%s=%r is not a number of bytes; using %d", MAX_BYTES_ENV, value, DEFAULT_MAX_BYTES)
        return DEFAULT_MAX_BYTES


def _folder_for(source: ModelSource, dtype: torch.dtype = torch.float32) -> Path:
    import transformers

    stat = source.path.stat()
    key = f"{source.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    if dtype != torch.float32:  # float32 copies keep the key they always had
        key += f"|{dtype}"
    return cache_root() / "gguf" / hashlib.sha256(key.encode()).hexdigest()[:24]


def lookup(source: ModelSource, dtype: torch.dtype = torch.float32) -> Path | None:
    """The converted folder of a GGUF source in ``dtype``, if a complete one exists; marks it as just used."""
    if source.kind != "gguf":
        return None
    try:
        marker = _folder_for(source, dtype) / COMPLETE_MARKER
        if not marker.is_file():
            return None
        marker.touch()  # its mtime is the copy's last use, for least-recently-used eviction
        return marker.parent
    except OSError:
        return None


HEADERS_SUFFIX = "-headers"  # the small copy: config.json and the tokenizer's files only


def header_folder(source: ModelSource) -> Path | None:
    """A folder holding a GGUF file's config.json and tokenizer as transformers read them before: the
    converted copy where there is one, else the small headers copy that packed loads leave; None before."""
    if source.kind != "gguf":
        return None
    converted = lookup(source)
    if converted is not None:
        return converted
    try:
        marker = _headers_folder(source) / COMPLETE_MARKER
        return marker.parent if marker.is_file() else None
    except OSError:
        return None


def store_headers(source: ModelSource, config, tokenizer) -> None:
    """Keep ``config`` and ``tokenizer`` of a GGUF file (a few MB), so later loads need not parse its metadata
    through transformers again (seconds). Failures only cost the speed-up."""
    folder = _headers_folder(source)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=STAGING_PREFIX))
        try:
            config.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / COMPLETE_MARKER).write_text(str(source.path.resolve()))
            shutil.rmtree(folder, ignore_errors=True)
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    except Exception as exc:  # noqa: BLE001 - a cache must never fail the load that fills it
        log.warning("could not keep the headers of %s: %s", source.name, exc)


def _headers_folder(source: ModelSource) -> Path:
    folder = _folder_for(source)
    return folder.with_name(folder.name + HEADERS_SUFFIX)


@contextmanager
def _plain_checkpoint(model: torch.nn.Module):
    """Save the dequantised weights as an ordinary checkpoint: hide the GGUF loader's quantiser meanwhile."""
    quantizer = getattr(model, "hf_quantizer", None)
    config = getattr(model.config, "quantization_config", None)
    model.hf_quantizer = None
    if config is not None:
        del model.config.quantization_config
    try:
        yield
    finally:
        model.hf_quantizer = quantizer
        if config is not None:
            model.config.quantization_config = config


def store(source: ModelSource, model: torch.nn.Module, tokenizer, dtype: torch.dtype = torch.float32) -> Path | None:
    """Save a GGUF model freshly converted to ``dtype`` (float32 for the CPU, bfloat16 or float16 on a GPU)
    and its tokenizer; failures only cost the speed-up."""
    folder = _folder_for(source, dtype)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_staging(folder.parent)
        if not _has_room(folder.parent, _model_bytes(model)):
            return None
        _write(source, model, tokenizer, folder)
        _remove_other_copies(folder.parent, source.path, keep=folder)
        _evict(folder.parent, max_bytes(), keep=folder)
        return folder
    except Exception as exc:  # noqa: BLE001 - a cache must never fail the load that fills it
        log.warning("could not cache the converted %s: %s", source.name, exc)
        return None


def _write(source: ModelSource, model: torch.nn.Module, tokenizer, folder: Path) -> None:
    """Write into a staging folder and rename it into place, so a half-written copy is never found."""
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=STAGING_PREFIX))
    try:
        with _plain_checkpoint(model):
            model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(str(source.path.resolve()))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # already gone after the rename; the remains of a failure


def _model_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def _has_room(root: Path, needed: int) -> bool:
    """Whether a copy of ``needed`` bytes fits under the cap and leaves 1 GiB of the disk free."""
    cap, free = max_bytes(), shutil.disk_usage(root).free
    if needed > cap:
        log.info("not caching a converted copy of %d bytes: the cache is capped at %d", needed, cap)
        return False
    if free < needed + FREE_MARGIN_BYTES:
        log.info("not caching a converted copy of %d bytes: only %d bytes are free on the disk", needed, free)
        return False
    return True


def _remove_stale_staging(root: Path) -> None:
    """Staging folders left by a write that died (killed, power cut) and is not coming back."""
    for path in root.glob(f"{STAGING_PREFIX}*"):
        if time.time() - path.stat().st_mtime > STALE_STAGING_S:
            shutil.rmtree(path, ignore_errors=True)


def _copies(root: Path) -> list[Path]:
    return [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(STAGING_PREFIX)]


def _remove_other_copies(root: Path, gguf: Path, keep: Path) -> None:
    """Copies of the same file made before it changed, or by another transformers version."""
    target = gguf.resolve()
    for copy in _copies(root):
        marker = copy / COMPLETE_MARKER
        if copy != keep and marker.is_file() and Path(marker.read_text()).resolve() == target:
            log.info("removing an older converted copy of %s", gguf.name)
            shutil.rmtree(copy, ignore_errors=True)


def _evict(root: Path, cap: int, keep: Path) -> None:
    """Remove the least recently used copies until the total is under ``cap``."""
    copies = sorted(_copies(root), key=_last_used)
    total = sum(_size(c) for c in copies)
    for copy in copies:
        if total <= cap:
            return
        if copy != keep:
            total -= _size(copy)
            log.info("evicting the converted copy %s (least recently used)", copy.name)
            shutil.rmtree(copy, ignore_errors=True)


def _last_used(copy: Path) -> float:
    marker = copy / COMPLETE_MARKER
    return (marker if marker.is_file() else copy).stat().st_mtime


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
