"""Bytes a model's weights and KV cache take, from its :class:`.ModelInfo` alone: the arithmetic the fit estimate
and the device's choice of quantisation share."""

from __future__ import annotations

import torch

MEMORY_SHARE = 0.9  # of the free memory that weights and KV cache may take together


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def float_weight_bytes(info, dtype: torch.dtype) -> int:
    """Every parameter in ``dtype``: the weights unquantised."""
    return info.parameter_count * element_bytes(dtype)


def kv_bytes_per_token(info, dtype: torch.dtype, kv=None) -> int:
    """Keys and values of every layer for one token, stored as ``kv`` (a :class:`KVFormat`; None: in ``dtype``)."""
    per_head = kv.bytes_per_values(info.head_dim) if kv is not None else info.head_dim * element_bytes(dtype)
    return 2 * info.num_layers * info.num_kv_heads * per_head
