"""A converted copy of each GGUF model, so it loads in seconds after the first time.

transformers reads GGUF in Python (the tokenizer's vocabulary, tensor name mapping, dequantisation), which
takes tens of seconds even for a small model. After the first float32 load, the dequantised weights (exactly
the values transformers produced) and the tokenizer are saved as a Hugging Face folder in the user cache;
later loads read that folder instead. The key covers the file's path, size and modification time, and the
transformers version, so a changed file or library is converted afresh.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch

from .sources import ModelSource

log = logging.getLogger(__name__)
CACHE_ENV = "KVASIR_CACHE_DIR"
COMPLETE_MARKER = ".complete"


def cache_root() -> Path:
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("Kvasir", appauthor=False))


def _folder_for(source: ModelSource) -> Path:
    import transformers

    stat = source.path.stat()
    key = f"{source.path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}"
    return cache_root() / "gguf" / hashlib.sha256(key.encode()).hexdigest()[:24]


def lookup(source: ModelSource) -> Path | None:
    """The converted folder of a GGUF source, if a complete one exists."""
    if source.kind != "gguf":
        return None
    folder = _folder_for(source)
    return folder if (folder / COMPLETE_MARKER).is_file() else None


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


def store(source: ModelSource, model: torch.nn.Module, tokenizer) -> Path | None:
    """Save a freshly loaded float32 GGUF model and its tokenizer; failures only cost the speed-up."""
    folder = _folder_for(source)
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".staging-"))
        with _plain_checkpoint(model):
            model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / COMPLETE_MARKER).write_text(str(source.path))
        shutil.rmtree(folder, ignore_errors=True)
        staging.rename(folder)
        return folder
    except OSError as exc:
        log.warning("could not cache the converted %s: %s", source.name, exc)
        return None
