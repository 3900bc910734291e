"""What a model is, read from its files without loading weights: architecture, sizes, licence."""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import ModelLoadError
from .gguf_info import read_gguf_info
from .sources import ModelSource


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """Facts about a model's files, enough to describe it and to estimate its memory."""

    name: str
    architecture: str
    parameter_count: int
    linear_parameter_count: int  # weights that quantisation replaces (2-D, inside the decoder blocks)
    linear_rows: int  # output features summed over those layers (int8 keeps one scale per row)
    context_length: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    size_on_disk: int
    source: str
    kind: str
    licence: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def read_model_info(source: ModelSource) -> ModelInfo:
    """Describe ``source`` from its headers (GGUF metadata, or config.json and safetensors headers)."""
    return _gguf_info(source) if source.kind == "gguf" else _folder_info(source)


def _gguf_info(source: ModelSource) -> ModelInfo:
    info = read_gguf_info(source.path)
    heads = int(info.arch_value(".attention.head_count", 1))
    hidden = int(info.arch_value(".embedding_length", 0))
    linear = [shape for name, (shape, _) in info.tensors.items() if name.startswith("blk.") and len(shape) == 2]
    return ModelInfo(
        name=source.name,
        architecture=info.architecture,
        parameter_count=info.parameter_count,
        linear_parameter_count=sum(a * b for a, b in linear),
        linear_rows=sum(shape[1] for shape in linear),  # GGUF lists dims innermost first: (in, out)
        context_length=int(info.arch_value(".context_length", 2048)),
        num_layers=int(info.arch_value(".block_count", 0)),
        num_kv_heads=int(info.arch_value(".attention.head_count_kv", heads)),
        head_dim=hidden // heads if heads else 0,
        size_on_disk=info.file_size,
        source=source.origin,
        kind="gguf",
        licence=info.metadata.get("general.license"),
    )


def _folder_info(source: ModelSource) -> ModelInfo:
    config = json.loads((source.folder / "config.json").read_text())
    config = config.get("text_config", config)
    shapes = _safetensors_shapes(source.folder)
    linear = [s for name, s in shapes.items() if _is_block_linear(name, s)]
    heads = config.get("num_attention_heads", 1)
    return ModelInfo(
        name=source.name,
        architecture=config.get("model_type", "unknown"),
        parameter_count=sum(_numel(s) for s in shapes.values()),
        linear_parameter_count=sum(_numel(s) for s in linear),
        linear_rows=sum(s[0] for s in linear),
        context_length=int(config.get("max_position_embeddings", 2048)),
        num_layers=int(config.get("num_hidden_layers", 0)),
        num_kv_heads=int(config.get("num_key_value_heads") or heads),
        head_dim=int(config.get("head_dim") or config.get("hidden_size", 0) // heads),
        size_on_disk=sum(f.stat().st_size for f in source.folder.iterdir() if f.is_file()),
        source=source.origin,
        kind="hf",
        licence=_licence_from_readme(source.folder / "README.md"),
    )


def _is_block_linear(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and ".layers." in name and name.endswith(".weight") and "norm" not in name


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _safetensors_shapes(folder: Path) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        for name, entry in _safetensors_header(file).items():
            if name != "__metadata__":
                shapes[name] = tuple(entry["shape"])
    return shapes


def _safetensors_header(file: Path) -> dict:
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= size - 8:
            raise ModelLoadError(f"{file.name} is not a valid safetensors file (its header is damaged)")
        try:
            return json.loads(f.read(length))
        except ValueError:
            raise ModelLoadError(f"{file.name} is not a valid safetensors file (its header is damaged)") from None


def _licence_from_readme(readme: Path) -> str | None:
    if not readme.is_file():
        return None
    text = readme.read_text(errors="replace")
    if not text.startswith("---"):
        return None
    for line in text.split("---", 2)[1].splitlines():
        if line.strip().lower().startswith("license:"):
            return line.split(":", 1)[1].strip() or None
    return None
