"""Loading a model: tokenizer, weights, architecture check, quantisation, with progress and peak memory."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..config import PACKED_MODES, EngineConfig
from ..devices import choose_quantization, resolve_dtype
from ..errors import ModelLoadError, UnsupportedModelError
from ..step import kernels
from ..step.attention import register as register_attention
from ..step.float_linear import use_few_rows_kernel
from ..step.quantization import module_bytes, quantize_model
from ..templates.chat_template import ChatTemplate
from ..templates.sandbox import shared_sandbox
from . import gguf_cache, gguf_config
from .gguf_weights import load_packed_gguf
from .memory import PeakMemory, return_freed_memory
from .sources import ModelSource, resolve_source
from .streamed_weights import load_streamed, streams
from .weights_check import check_architecture_known

log = logging.getLogger(__name__)

Progress = Callable[[float, str], None]
RECURRENT_MODEL_TYPES = {"mamba", "mamba2", "rwkv", "jamba", "falcon_mamba", "zamba", "zamba2", "bamba", "lfm2"}
FALLBACK_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] | capitalize }}: {{ message['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)
FALLBACK_TEMPLATE_WARNING = (
    "this model has no chat template, so a plain 'Role: text' template is used; its replies may be poorer"
)


@dataclass(slots=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    source: ModelSource
    device: torch.device
    dtype: torch.dtype
    quantization: str
    max_model_len: int
    eos_token_ids: frozenset[int]
    memory_bytes: int
    peak_load_bytes: int
    warnings: list[str] = field(default_factory=list)
    loaded_from: Path | None = None  # where the weights were read (a converted copy of a GGUF file, say)


def _no_progress(fraction: float, phrase: str) -> None:
    pass


def load_model(
    config: EngineConfig, device: torch.device, attn_implementation: str, progress: Progress | None = None
) -> LoadedModel:
    """Load tokenizer and weights of ``config.model`` onto ``device``, quantised as configured."""
    report = progress or _no_progress
    report(0.0, "checking the model files")
    shared_sandbox()  # the template workers start now, beside the reading, for the check at the end
    source = resolve_source(config.model)  # also checks the config against the weights' shapes
    if source.kind == "hf":
        check_architecture_known(source.folder)  # transformers' own refusal comes later, as a page of text
    dtype = resolve_dtype(config.dtype, device)
    quantization, quantization_note = choose_quantization(config.quantization, device, source, dtype)
    from_blocks = source.kind == "gguf" and quantization in PACKED_MODES  # packed straight from the file
    converted = gguf_cache.lookup(source, dtype)
    files = ModelSource(source.name, converted, origin=source.origin) if converted else source
    headers = gguf_cache.header_folder(source)  # config and tokenizer as transformers read them before
    report(0.05, "reading the tokenizer")
    tokenizer, warnings = load_tokenizer(ModelSource(source.name, headers, origin=source.origin) if headers
                                         else files)
    keep_headers = source.kind == "gguf" and headers is None and not warnings
    if quantization_note:
        warnings.append(quantization_note)
    if from_blocks:
        files = source
    if quantization in PACKED_MODES and device.type == "cpu":
        if not kernels.is_ready():
            report(0.1, "building the CPU kernels (once per machine)")
        if not kernels.available():  # also a library built before that no longer loads
            warnings.append(f"{kernels.status().detail}; using torch's slower packed kernels")
    first_conversion = source.kind == "gguf" and not converted and not from_blocks
    streamed = files.kind == "hf" and streams(quantization, device)
    phrase = ("converting the GGUF file (once)" if first_conversion
              else f"reading the weights into {quantization}" if streamed and quantization != "none"
              else "reading the weights")
    report(0.15, phrase)
    with PeakMemory(device) as reading:
        plan = WeightsPlan(quantization, from_blocks, streamed, dtype, attn_implementation, device)
        model, load_warnings, ready = _load_weights(files, plan, headers, lambda f: report(0.15 + 0.75 * f, phrase))
        warnings += load_warnings
        max_model_len = config.max_model_len or getattr(model.config, "max_position_embeddings", None) or 2048
        check_supported(model.config, max_model_len)
    ChatTemplate(tokenizer).check(source.name)
    if files.kind == "gguf" and not warnings and not from_blocks:
        report(0.55, "keeping a converted copy for faster loads")
        gguf_cache.store(source, model, tokenizer, dtype)  # not part of loading's peak: it happens once per file
        return_freed_memory()
    elif from_blocks and keep_headers:
        gguf_cache.store_headers(source, model.config, tokenizer)
    with PeakMemory(device) as placing:
        if quantization != "none" and not ready:
            phrase = f"quantising to {quantization}"
            report(0.6, phrase)
            quantize_model(model, quantization, dtype, device, lambda f: report(0.6 + 0.35 * f, phrase))
        report(0.95, f"moving to {device}")
        model = model.to(device).eval()
        use_few_rows_kernel(model, device)
    report(1.0, "ready")
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        source=source,
        device=device,
        dtype=dtype,
        quantization=quantization,
        max_model_len=max_model_len,
        eos_token_ids=_eos_token_ids(model, tokenizer),
        memory_bytes=module_bytes(model),
        peak_load_bytes=max(reading.bytes, placing.start - reading.start + placing.bytes),
        warnings=warnings,
        loaded_from=files.path,
    )


def load_tokenizer(source: ModelSource):
    """The tokenizer (and chat template) of ``source``, plus warnings for the user; the template is checked by
    :func:`load_model` once the weights are read (its sandbox's workers start meanwhile)."""
    from transformers import AutoTokenizer

    try:
        if source.kind == "gguf":
            tokenizer = gguf_config.read_tokenizer(source)
        else:
            tokenizer = AutoTokenizer.from_pretrained(source.folder, trust_remote_code=False)
    except Exception as exc:
        raise ModelLoadError(f"could not read the tokenizer of {source.name}: {exc}") from exc
    warnings = []
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
        warnings.append(FALLBACK_TEMPLATE_WARNING)
        log.warning("%s: %s", source.name, FALLBACK_TEMPLATE_WARNING)
    return tokenizer, warnings


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


@dataclass(frozen=True, slots=True)
class WeightsPlan:
    """How the weights are read: ``from_blocks`` packed from a GGUF file's blocks, ``streamed`` tensor by
    tensor (quantised and placed on the way, see :mod:`.streamed_weights`), else whole through transformers."""

    quantization: str
    from_blocks: bool
    streamed: bool
    dtype: torch.dtype
    attn: str
    device: torch.device


def _load_weights(source: ModelSource, plan: WeightsPlan, config_folder: Path | None,
                  progress: Callable[[float], None]) -> tuple[torch.nn.Module, list[str], bool]:
    """The model from ``source``, warnings, and whether it is already quantised and on the device.

    ``config_folder``: where a GGUF file's config was kept before (see :func:`.gguf_cache.header_folder`).
    """
    if plan.from_blocks:
        try:
            loaded = load_packed_gguf(source, plan.quantization, plan.dtype, plan.attn, plan.device, config_folder)
        except ModelLoadError:
            raise
        except Exception as exc:
            raise ModelLoadError(f"could not load the weights of {source.name}: {exc}") from exc
        return loaded.model.eval(), loaded.warnings(), True
    if plan.streamed:
        model = load_streamed(source, plan.quantization, plan.dtype, plan.attn, plan.device, progress)
        if model is not None:
            return model, [], True
    from transformers import AutoModelForCausalLM

    register_attention()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            source.folder,
            gguf_file=source.gguf_file,
            dtype=plan.dtype,
            attn_implementation=plan.attn,
            use_safetensors=None if source.gguf_file else True,
            trust_remote_code=False,
        )
    except Exception as exc:
        raise ModelLoadError(f"could not load the weights of {source.name}: {exc}") from exc
    return model.eval(), [], False


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
