"""The paged KV cache: one pool of blocks per layer, shared by every request."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one token costs in the cache, from the model config."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def bytes_per_token(self) -> int:
        element = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element

    @classmethod
    def from_config(cls, config, dtype: torch.dtype) -> KVShape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        return cls(config.num_hidden_layers, kv_heads, head_dim, dtype)


class KVCache:
    """Per layer, K and V tensors ``[num_blocks, block_size, kv_heads, head_dim]``.

    The attention backends write and read them through flat ``[num_blocks * block_size, kv_heads,
    head_dim]`` views, addressed by slot = block id * block_size + offset in the block.
    """

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int, device: torch.device) -> None:
        self.shape = shape
        self.num_blocks = num_blocks
        self.block_size = block_size
        dims = (num_blocks, block_size, shape.num_kv_heads, shape.head_dim)
        self.keys = [torch.zeros(dims, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
        self.values = [torch.zeros(dims, dtype=shape.dtype, device=device) for _ in range(shape.num_layers)]
        flat = (num_blocks * block_size, shape.num_kv_heads, shape.head_dim)
        self.flat_keys = [k.view(flat) for k in self.keys]
        self.flat_values = [v.view(flat) for v in self.values]

    @property
    def memory_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.shape.bytes_per_token()


def blocks_for_memory(shape: KVShape, block_size: int, memory_bytes: int) -> int:
    """How many blocks fit in ``memory_bytes``."""
    return max(1, memory_bytes // (block_size * shape.bytes_per_token()))
