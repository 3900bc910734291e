"""Will it fit? Weight and KV-cache memory of a configuration, estimated before anything is loaded."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from ..config import PACKED_MODES, EngineConfig
from ..devices import available_memory, resolve_device, resolve_dtype, resolve_quantization
from ..serving.kv_cache import kv_cache_blocks
from ..serving.kv_format import KVFormat, choose_kv_format, draft_kv_format
from ..step import attention_plan
from ..step.block_linear import BLOCK, BLOCK_BYTES, GGUF_KINDS
from ..step.quantization import packs_output_head, uses_native_blocks
from . import gguf_cache, kv_verdicts
from .gguf_info import GGML_TYPE_NAMES, read_gguf_info
from .model_info import ModelInfo, read_model_info
from .sizes import MEMORY_SHARE, float_weight_bytes, kv_bytes_per_token
from .sources import ModelSource, resolve_source
from .weights_check import model_config

# bitsandbytes 4-bit: two weights a byte; one 8-bit absmax per 64 weights, and (double quantisation)
# one float32 per 256 absmax values.
FOUR_BIT_BYTES_PER_WEIGHT = 0.5 + 1 / 64 + 4 / (64 * 256)
# packed int4: two weights a byte and two 16-bit numbers per 32 weights (Q4_1 blocks; torch's int4 kernel alike)
INT4_BYTES_PER_WEIGHT = 20 / 32
# a GGUF's Q4_K weights on the native CPU kernels: Q4_1 blocks with float32 scales
Q4_K_BYTES_PER_WEIGHT = 24 / 32
# packed 8-bit: Q8_0 blocks, a byte a weight and a float16 scale per 32 (torch's int8 rows are 6% smaller)
W8_BYTES_PER_WEIGHT = 34 / 32
MIN_CONTEXT_TOKENS = 256  # refuse a configuration that leaves less KV room than this


@dataclass(frozen=True, slots=True)
class FitEstimate:
    """Memory a configuration needs, and how much context x concurrency the device's free memory allows."""

    model_name: str
    quantization: str
    dtype: str
    device: str
    weight_bytes: int
    kv_bytes_per_token: int
    available_bytes: int
    kv_tokens: int  # tokens of KV cache the engine will allocate beside the weights (kv_cache_blocks)
    context_length: int
    max_concurrent_full_context: int
    kv_size_set: bool = False  # the configuration sets the cache's size itself (num_kv_blocks, kv_cache_memory)
    host_load_bytes: int = 0  # system memory a load onto a GPU passes through at its peak (see host_load_bytes)
    host_available_bytes: int = 0
    kv_dtype: str = ""  # the KV cache's stored format (engine/serving/kv_format.py)
    draft_model: str = ""  # a draft model loaded beside it (its weights and KV are in the figures above)
    draft_weight_bytes: int = 0

    @property
    def fits(self) -> bool:
        """Weights and cache within the free memory, (unless sized by hand) room for a useful context, and
        on a GPU enough system memory for the way there."""
        needed = self.weight_bytes + self.kv_tokens * self.kv_bytes_per_token
        enough_context = self.kv_size_set or self.kv_tokens >= MIN_CONTEXT_TOKENS
        return needed <= self.available_bytes * MEMORY_SHARE and enough_context and self.host_fits

    @property
    def host_fits(self) -> bool:
        return self.host_load_bytes <= self.host_available_bytes * MEMORY_SHARE

    def summary(self) -> str:
        gib = 1024**3
        text = (
            f"{self.model_name} ({self.quantization}, {self.dtype}) on {self.device}: weights "
            f"{self.weight_bytes / gib:.2f} GiB, KV cache{f' ({self.kv_dtype})' if self.kv_dtype else ''} "
            f"{self.kv_bytes_per_token / 1024:.1f} KiB per token, "
            f"{self.available_bytes / gib:.2f} GiB free -> {self.kv_tokens:,} tokens of context "
            f"({self.max_concurrent_full_context} chats at the full {self.context_length:,})"
        )
        if self.draft_model:
            text += f", a draft model {self.draft_model} included ({self.draft_weight_bytes / gib:.2f} GiB of weights)"
        if not self.host_fits:
            text += (f"; loading needs {self.host_load_bytes / gib:.2f} GiB of system memory on the way, "
                     f"{self.host_available_bytes / gib:.2f} GiB free")
        return text

    def to_dict(self) -> dict:
        return {**asdict(self), "fits": self.fits}


@dataclass(frozen=True, slots=True)
class OutputHead:
    """The output head's shape, and whether it shares the embedding's weight (then it is not in the files)."""

    rows: int
    cols: int
    tied: bool
    embedding_type: str | None = None  # a GGUF file's token_embd type ("Q8_0", ...), None for float weights


def weight_bytes(info: ModelInfo, quantization: str, dtype: torch.dtype, head: OutputHead | None = None,
                 device: torch.device | None = None, q4_k_weights: int = 0) -> int:
    """Bytes the loaded weights take for ``quantization`` with compute ``dtype`` on ``device``.

    ``head``: needed for the packed modes, which on the CPU give the output head an 8-bit copy of its own;
    ``q4_k_weights``: linear weights a GGUF file stores as Q4_K (see :func:`q4_k_linear_weights`).
    """
    element = torch.empty((), dtype=dtype).element_size()
    other = info.parameter_count - info.linear_parameter_count
    linear = info.linear_parameter_count
    if quantization == "none":
        return float_weight_bytes(info, dtype)
    if quantization in PACKED_MODES:
        native = device is not None and uses_native_blocks(device, BLOCK)
        linear = _packed_linear_bytes(info, quantization, native, q4_k_weights)
        if device is not None and not packs_output_head(device):  # the head keeps the compute dtype
            return (info.parameter_count - info.linear_parameter_count) * element + linear
        return _packed_bytes(info, quantization, element, head or OutputHead(0, 0, True), native, linear)
    if quantization == "int8":
        return other * element + linear + 4 * info.linear_rows
    return other * element + int(linear * FOUR_BIT_BYTES_PER_WEIGHT)


def _packed_bytes(info: ModelInfo, quantization: str, element: int, head: OutputHead, native: bool,
                  linear: int) -> int:
    other = info.parameter_count - info.linear_parameter_count
    table = head.rows * head.cols
    if native and head.embedding_type in GGUF_KINDS:  # the file's embedding blocks, shared with a tied head
        kind = GGUF_KINDS[head.embedding_type]
        other -= table if head.tied else 2 * table
        embedding = table * BLOCK_BYTES[kind] // BLOCK
        return other * element + linear + embedding + (
            0 if head.tied else int(table * W8_BYTES_PER_WEIGHT))
    if not head.tied:  # the head's float weight becomes the int8 copy
        other -= table
    return other * element + linear + int(table * W8_BYTES_PER_WEIGHT)


def _packed_linear_bytes(info: ModelInfo, quantization: str, native: bool, q4_k_weights: int) -> int:
    per_weight = INT4_BYTES_PER_WEIGHT if quantization == "int4" else W8_BYTES_PER_WEIGHT
    linear = int(info.linear_parameter_count * per_weight)
    if quantization == "int4" and native:  # Q4_K kept with its float32 scales
        linear += int(q4_k_weights * (Q4_K_BYTES_PER_WEIGHT - INT4_BYTES_PER_WEIGHT))
    return linear


def q4_k_linear_weights(source: ModelSource) -> int:
    """How many of a GGUF file's decoder linear weights are stored as Q4_K (0 for other sources)."""
    if source.kind != "gguf":
        return 0
    linear = read_gguf_info(source.path).linear_tensors().values()
    return sum(shape[0] * shape[1] for shape, kind in linear if GGML_TYPE_NAMES.get(kind) == "Q4_K")


def output_head(source: ModelSource) -> OutputHead:
    """The output head's shape from the file headers (it has the embedding's shape)."""
    if source.kind == "gguf":
        tensors = read_gguf_info(source.path).tensors
        (cols, rows), kind = tensors.get("token_embd.weight", ((0, 0), -1))  # GGUF lists dims innermost first
        return OutputHead(rows, cols, "output.weight" not in tensors, GGML_TYPE_NAMES.get(kind))
    config = model_config(source.folder)
    tied = bool(config.get("tie_word_embeddings", True))
    return OutputHead(int(config.get("vocab_size", 0)), int(config.get("hidden_size", 0)), tied)


def host_load_bytes(source: ModelSource, info: ModelInfo, quantization: str, dtype: torch.dtype,
                    device: torch.device) -> int:
    """System memory a load onto ``device`` passes through at its peak; 0 on the CPU, where the weights'
    own estimate is that memory.

    Safetensors folders, converted GGUF copies and GGUF blocks are read one tensor at a time (the largest is the
    embedding table, read as stored and cast); a GGUF file's first conversion through transformers holds the
    whole model in the compute dtype.
    """
    if device.type == "cpu":
        return 0
    element = torch.empty((), dtype=dtype).element_size()
    whole = source.kind == "gguf" and quantization not in PACKED_MODES and gguf_cache.lookup(source, dtype) is None
    if whole:
        return info.parameter_count * element
    head = output_head(source)
    return head.rows * head.cols * (4 + element)


def estimate(config: EngineConfig, reclaimable_bytes: int = 0) -> FitEstimate:
    """The memory ``config`` needs and what fits beside it, from file headers only; a draft model's weights and
    KV included.

    ``reclaimable_bytes``: memory held now that would be freed first (the model being switched away from).
    """
    device, _ = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    info, plan, kv = model_plan(config.model, config.quantization, config.kv_cache_dtype, device, dtype)
    draft = None
    if config.draft_model:
        draft_info, draft_plan, _ = model_plan(config.draft_model, config.draft_quantization, "auto", device, dtype)
        draft_kv = draft_kv_format(kv, info.head_dim, draft_info.head_dim, dtype)
        draft = DraftPlan(f"{draft_info.name} ({draft_plan.quantization})", draft_plan.weight_bytes,
                          kv_bytes_per_token(draft_info, dtype, draft_kv), draft_plan.host_load_bytes)
    return estimate_weights(info, config, plan, device, dtype, reclaimable_bytes, kv, draft)


def model_plan(model: str, quantization: str, kv_cache_dtype: str, device: torch.device, dtype: torch.dtype
                ) -> tuple[ModelInfo, WeightPlan, KVFormat]:
    """A model's description from its headers, how its weights will be held, and its KV cache's format."""
    source = resolve_source(model)
    info = read_model_info(source)
    quantization = resolve_quantization(quantization, device, source, dtype)
    head = output_head(source) if quantization in PACKED_MODES else None
    weights = weight_bytes(info, quantization, dtype, head, device, q4_k_linear_weights(source))
    host = host_load_bytes(source, info, quantization, dtype, device)
    kv, _ = kv_verdicts.kv_format_for(kv_cache_dtype, source, quantization, info.head_dim, device, dtype)
    return info, WeightPlan(quantization, weights, host), kv


@dataclass(frozen=True, slots=True)
class DraftPlan:
    """A draft model's share: its weights, and its KV beside every token of the pool (engine/serving/draft_model.py)."""

    name: str
    weight_bytes: int
    kv_bytes_per_token: int
    host_load_bytes: int = 0


@dataclass(frozen=True, slots=True)
class WeightPlan:
    """How a model's weights will be held: the quantisation, their bytes, and the system memory on the way."""

    quantization: str
    weight_bytes: int
    host_load_bytes: int = 0


def estimate_weights(info: ModelInfo, config: EngineConfig, plan: WeightPlan, device: torch.device,
                     dtype: torch.dtype, reclaimable_bytes: int = 0, kv: KVFormat | None = None,
                     draft: DraftPlan | None = None) -> FitEstimate:
    """The fit of a model described by ``info`` whose weights take ``plan``: the KV cache the engine would
    allocate beside them on ``device`` (also for a model not downloaded yet, described from remote headers).
    ``kv``: the cache's format (None: as ``config`` names it, ``auto`` counted as the compute dtype, since
    nothing has been measured of a model that is not here). ``draft``: a draft model loaded beside it."""
    if kv is None:
        kv, _ = choose_kv_format(config.kv_cache_dtype, dtype, info.head_dim, device, None)
    per_token = kv_bytes_per_token(info, dtype, kv)
    if draft is not None:
        plan = WeightPlan(plan.quantization, plan.weight_bytes + draft.weight_bytes,
                          max(plan.host_load_bytes, draft.host_load_bytes))
        per_token += draft.kv_bytes_per_token
    available = available_memory(device) + reclaimable_bytes
    context = min(config.max_model_len or info.context_length, info.context_length)
    block_size = attention_plan.plan_attention(config, device, info.head_dim, dtype, kv).block_size
    blocks = kv_cache_blocks(config, device, per_token, config.max_model_len or info.context_length,
                             max(0, available - plan.weight_bytes), block_size) if per_token else 0
    kv_tokens = blocks * block_size
    return FitEstimate(
        model_name=info.name,
        quantization=plan.quantization,
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
        weight_bytes=plan.weight_bytes,
        kv_bytes_per_token=per_token,
        available_bytes=available,
        kv_tokens=kv_tokens,
        context_length=context,
        max_concurrent_full_context=kv_tokens // context if context else 0,
        kv_size_set=config.num_kv_blocks is not None or config.kv_cache_memory is not None,
        host_load_bytes=plan.host_load_bytes,
        host_available_bytes=available_memory(torch.device("cpu")),
        kv_dtype=kv.name,
        draft_model=draft.name if draft else "",
        draft_weight_bytes=draft.weight_bytes if draft else 0,
    )
