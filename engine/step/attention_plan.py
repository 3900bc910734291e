"""The attention backend an engine will run and the KV block size that backend runs with.

One rule, read by the engine before it loads, by the KV sizing and by the fit estimate, so that the pool the
engine allocates is the pool the estimate promised: flash-attn's paged kernel needs blocks of a multiple of 256
tokens and the compiled FlexAttention kernels a multiple of their key tile, so a backend may run with blocks
larger than ``EngineConfig.block_size``, and every count of blocks is made in the blocks that will run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import EngineConfig
from ..serving.kv_format import KVFormat
from . import attention, flex_attention
from .attention_backend import choose_backend


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """The backend, why it was chosen (the stats' line), and the KV block size it runs with."""

    backend: str
    reason: str
    block_size: int


def plan_attention(config: EngineConfig, device: torch.device, head_dim: int, dtype: torch.dtype,
                   kv: KVFormat | None = None) -> AttentionPlan:
    """The backend ``config`` gets for a model of ``head_dim`` computing in ``dtype`` on ``device``, its KV cache
    stored as ``kv`` (None: in ``dtype``). flash-attn and FlexAttention read the cache as it is stored, so they
    run only on a cache in the compute dtype; the torch path converts the blocks it reads."""
    wanted, on_cuda = config.attention_backend, device.type == "cuda"
    converted = kv is not None and kv.storage != dtype
    stored = f"the KV cache is stored as {kv.name}, and only the torch path reads that" if converted else None
    flash = stored or (_flash_problem(device, head_dim, dtype) if on_cuda and wanted in ("auto", "flash_attn")
                       else None)
    flex = stored or (flex_attention.flex_problem(device) if wanted == "flex" else None)  # the check imports dynamo
    backend, reason = choose_backend(wanted, on_cuda, flash, flex)
    block_size = backend_block_size(backend, config.block_size, device)
    if block_size != config.block_size:
        reason += f"; {block_size}-token KV blocks, the kernel's multiple (block_size={config.block_size} asked)"
    return AttentionPlan(backend, reason, block_size)


def backend_block_size(backend: str, block_size: int, device: torch.device) -> int:
    """The KV block size ``backend`` runs with when ``block_size`` is asked for: the next multiple it takes."""
    if backend == "flash_attn":
        return _next_multiple(block_size, attention.FLASH_BLOCK_SIZE)
    if backend == "flex":
        return flex_attention.flex_block_size(block_size, device)
    return block_size


def _next_multiple(value: int, step: int) -> int:
    return step * -(-value // step)


def _flash_problem(device: torch.device, head_dim: int, dtype: torch.dtype) -> str | None:
    """Why flash-attn's kernel can't run this model on this GPU (None when it can)."""
    if not attention.flash_attn_available():
        return "flash-attn is not installed"
    return attention.flash_attn_problem(dtype, torch.cuda.get_device_capability(device), head_dim)
