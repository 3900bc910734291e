"""Finding chat models on the Hugging Face Hub, and what each repository offers, before any weight is fetched.

A search lists text-generation repositories with GGUF or safetensors weights, most downloaded first. A
repository's files become :class:`HubOption` s, the things a user can download: each single-file GGUF is one
(its quantisation read from its name, as llama.cpp's tools name them), and the safetensors weights are one
model together with their config and tokenizer files.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import PurePosixPath, PureWindowsPath

from .hub_api import API_TIMEOUT_S, hub_api, in_words
from .sources import HUB_PATTERNS, REPO_ID
from .weights_check import INDEX_NAME, SINGLE_NAME

PAGE_SIZE = 20
CHAT_PIPELINE = "text-generation"
FORMATS = ("gguf", "safetensors")  # the weight formats Kvasir loads, as the Hub tags them
SEARCH_EXPAND = ["downloads", "likes", "lastModified", "tags", "pipeline_tag", "gated"]
SHARD = re.compile(r"^.+-\d{5}-of-\d{5}\.safetensors$")  # transformers' shard names
SPLIT_GGUF = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
NOT_A_CHAT_MODEL = ("mmproj", "imatrix")  # vision projectors and importance matrices beside the models


@dataclass(frozen=True, slots=True)
class HubModel:
    """One search result."""

    repo_id: str
    downloads: int
    likes: int
    updated: datetime | None
    formats: tuple[str, ...]  # of FORMATS
    conversational: bool
    gated: bool


@dataclass(frozen=True, slots=True)
class RemoteFile:
    path: str  # relative to the repository's root
    size: int
    sha256: str | None = None  # for files stored with LFS (the weights), checked after download


@dataclass(frozen=True, slots=True)
class HubOption:
    """One thing to download: a GGUF file (``kind`` "gguf"), or the safetensors model as a whole ("hf")."""

    kind: str
    name: str  # the GGUF file's path, or "safetensors"
    quantization: str  # "Q4_K_M", "Q8_0", ... for GGUF; the weights' dtype ("BF16") for safetensors
    files: tuple[RemoteFile, ...]
    problem: str | None = None  # why Kvasir can't use it, when it can't

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def weight_files(self) -> tuple[RemoteFile, ...]:
        return tuple(f for f in self.files if f.path.endswith((".gguf", ".safetensors")))


@dataclass(frozen=True, slots=True)
class HubRepo:
    """A repository at one commit (downloads ask for that commit, so files can't change under a resume)."""

    repo_id: str
    revision: str
    options: tuple[HubOption, ...]
    licence: str | None = None
    gated: bool = False

    def option(self, name: str) -> HubOption:
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(name)


def search_models(query: str, fmt: str | None = None, limit: int = PAGE_SIZE,
                  address: str | None = None) -> list[HubModel]:
    """Text-generation models whose id contains ``query``, with weights in ``fmt`` (one of FORMATS; None: either),
    most downloaded first."""
    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS} or None, not {fmt!r}")
    api = hub_api(address)
    with in_words("the search on the Hub failed", api.endpoint):
        found = api.list_models(search=query.strip() or None, filter=fmt, pipeline_tag=CHAT_PIPELINE,
                                sort="downloads", limit=limit * 2 if fmt is None else limit, expand=SEARCH_EXPAND)
        models = [_hub_model(m) for m in found]
    return [m for m in models if m.formats][:limit]  # without a format filter the Hub also lists other formats


def _hub_model(info) -> HubModel:
    tags = set(info.tags or ())
    return HubModel(
        repo_id=info.id,
        downloads=info.downloads or 0,
        likes=info.likes or 0,
        updated=info.last_modified,
        formats=tuple(f for f in FORMATS if f in tags),
        conversational="conversational" in tags,
        gated=bool(info.gated),
    )


def repo_options(repo_id: str, address: str | None = None) -> HubRepo:
    """The repository's downloadable options with their sizes, from one metadata request."""
    if not REPO_ID.match(repo_id):
        raise ValueError(f"{repo_id!r} is not a Hugging Face repo id (owner/name)")
    api = hub_api(address)
    with in_words(f"the files of {repo_id} could not be listed", api.endpoint):
        info = api.model_info(repo_id, files_metadata=True, timeout=API_TIMEOUT_S)
    files = [RemoteFile(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else None) for s in info.siblings or ()]
    files = [f for f in files if _safe_path(f.path)]
    options = [*_gguf_options(files), *_safetensors_options(files, info)]
    card = info.card_data
    licence = card.get("license") if card is not None else None
    return HubRepo(info.id, info.sha or "main", tuple(options), licence, bool(info.gated))


def _safe_path(path: str) -> bool:
    """A file name that stays inside the download folder on every system (a hostile listing could say
    ``../../.bashrc``, or ``C:/Users/...``, which Windows joins as a path of its own)."""
    parts = PurePosixPath(path).parts
    return (bool(parts) and not path.startswith("/") and ".." not in parts and "\\" not in path
            and ":" not in path and not PureWindowsPath(path).anchor)


def _gguf_options(files: list[RemoteFile]) -> list[HubOption]:
    options, splits = [], {}
    for f in sorted(files, key=lambda f: f.path):
        name = PurePosixPath(f.path).name
        if not name.lower().endswith(".gguf") or name.lower().startswith(NOT_A_CHAT_MODEL):
            continue
        if split := SPLIT_GGUF.search(f.path):
            splits.setdefault(f.path[: split.start()], []).append(f)
            continue
        options.append(HubOption("gguf", f.path, gguf_quantization(name), (f,)))
    for stem, parts in splits.items():
        options.append(HubOption(
            "gguf", parts[0].path, gguf_quantization(PurePosixPath(stem).name + ".gguf"), tuple(parts),
            problem=f"split into {len(parts)} files; Kvasir reads single-file GGUF models"))
    return sorted(options, key=lambda o: o.size)


def _safetensors_options(files: list[RemoteFile], info) -> list[HubOption]:
    """The root folder's safetensors model: the weights transformers reads (the index's shards, else
    model.safetensors; not the extra copies some releases carry, such as consolidated.safetensors) with the
    files that come with them (config, tokenizer)."""
    root = [f for f in files if "/" not in f.path]
    names = {f.path for f in root}
    if not any(f.path.endswith(".safetensors") for f in root):
        return []
    extras = {f.path for f in root if f.path.endswith(".safetensors") and not _model_weights(f.path, names)}
    wanted = [f for f in root if f.path not in extras and any(fnmatch.fnmatch(f.path, p) for p in HUB_PATTERNS)]
    problem = None
    if "config.json" not in names:
        problem = "no config.json beside the weights, so transformers can't build the model"
    elif not any(f.path.endswith(".safetensors") for f in wanted):
        problem = f"no {SINGLE_NAME} and no {INDEX_NAME}, so transformers would not find the weights"
    return [HubOption("hf", "safetensors", _safetensors_dtype(info), tuple(wanted), problem)]


def _model_weights(name: str, names: set[str]) -> bool:
    if INDEX_NAME in names:
        return bool(SHARD.match(name)) or not any(SHARD.match(n) for n in names)
    return name == SINGLE_NAME


def _safetensors_dtype(info) -> str:
    parameters = getattr(info.safetensors, "parameters", None) or {}
    return max(parameters, key=parameters.get) if parameters else "safetensors"


@cache
def _quantization_pattern() -> re.Pattern:
    """llama.cpp's quantisation names, from the gguf package (which owns them), longest first."""
    import gguf

    names = {m.name.removeprefix("MOSTLY_").removeprefix("ALL_") for m in gguf.LlamaFileType} - {"GUESSED"}
    names |= {m.name for m in gguf.GGMLQuantizationType if not m.name.startswith(("I8", "I16", "I32", "I64"))}
    alternatives = "|".join(sorted(map(re.escape, names), key=len, reverse=True))
    # a trailing _L / _XL: releases that keep the embeddings and output at 8 bits (Q4_K_L, UD-Q4_K_XL)
    return re.compile(rf"(?<![A-Za-z0-9])({alternatives})(_X?L)?(?![A-Za-z0-9])", re.IGNORECASE)


def gguf_quantization(file_name: str) -> str:
    """The quantisation a GGUF file's name says ("Q4_K_M"), or "unknown"."""
    found = _quantization_pattern().findall(PurePosixPath(file_name).stem)
    if not found:
        return "unknown"
    name, suffix = found[-1]  # the last one: "Q8_0" in "model-f16-Q8_0"
    return (name + suffix).upper()

