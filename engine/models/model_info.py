"""What a model is, read from its files without loading weights: architecture, sizes, licence."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import ModelLoadError
from .gguf_info import read_gguf_info
from .sources import ModelSource
from .weights_check import model_config, safetensors_shapes, weight_files


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
    heads = info.positive_int(".attention.head_count", 1)
    hidden = info.positive_int(".embedding_length")
    linear = [shape for shape, _ in info.linear_tensors().values()]
    return ModelInfo(
        name=source.name,
        architecture=info.architecture,
        parameter_count=info.parameter_count,
        linear_parameter_count=sum(a * b for a, b in linear),
        linear_rows=sum(shape[1] for shape in linear),  # GGUF lists dims innermost first: (in, out)
        context_length=info.positive_int(".context_length", 2048),
        num_layers=info.positive_int(".block_count"),
        num_kv_heads=info.positive_int(".attention.head_count_kv", heads),
        head_dim=info.positive_int(".attention.key_length", hidden // heads or 1),
        size_on_disk=info.file_size,
        source=source.origin,
        kind="gguf",
        licence=info.metadata.get("general.license"),
    )


def _folder_info(source: ModelSource) -> ModelInfo:
    config = model_config(source.folder)
    shapes = safetensors_shapes(weight_files(source.folder))
    linear = [s for name, s in shapes.items() if _is_block_linear(name, s)]
    heads = _positive(config, "num_attention_heads", 1)
    return ModelInfo(
        name=source.name,
        architecture=str(config.get("model_type", "unknown")),
        parameter_count=sum(_numel(s) for s in shapes.values()),
        linear_parameter_count=sum(_numel(s) for s in linear),
        linear_rows=sum(s[0] for s in linear),
        context_length=_positive(config, "max_position_embeddings", 2048),
        num_layers=_positive(config, "num_hidden_layers", 0),
        num_kv_heads=_positive(config, "num_key_value_heads", heads),
        head_dim=_positive(config, "head_dim", _positive(config, "hidden_size", 0) // heads),
        size_on_disk=sum(f.stat().st_size for f in source.folder.iterdir() if f.is_file()),
        source=source.origin,
        kind="hf",
        licence=_licence_from_readme(source.folder / "README.md"),
    )


def _positive(config: dict, key: str, default: int) -> int:
    """``config[key]`` as a positive whole number (``default`` when absent or null), else a ModelLoadError."""
    value = config.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"config.json: {key} is {value!r}; it must be a positive whole number")
    return value


def _is_block_linear(name: str, shape: tuple[int, ...]) -> bool:
    return len(shape) == 2 and ".layers." in name and name.endswith(".weight") and "norm" not in name


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _licence_from_readme(readme: Path) -> str | None:
    if not readme.is_file():
        return None
    try:
        text = readme.read_text(errors="replace")
    except OSError:
        return None  # the licence is a nicety; an unreadable README does not stop the model
    if not text.startswith("---"):
        return None
    for line in text.split("---", 2)[1].splitlines():
        if line.strip().lower().startswith("license:"):
            return line.split(":", 1)[1].strip() or None
    return None
