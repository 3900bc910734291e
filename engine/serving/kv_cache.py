"""The paged KV cache: one pool of blocks per layer, shared by every request."""

from __future__ import annotations

import math
import mmap
import weakref
from dataclasses import dataclass

import torch

from ..config import EngineConfig
from . import kv_format
from .kv_format import KVFormat

CPU_KV_SHARE = 0.25  # of free system memory after the weights, when neither num_kv_blocks nor kv_cache_memory is set
CPU_KV_DEFAULT_CAP = 2 * 1024**3
CUDA_KV_SHARE = 0.80  # of free device memory after the weights


@dataclass(frozen=True, slots=True)
class KVShape:
    """What one token costs in the cache, from the model config."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype  # the compute dtype: what reads return
    stored_as: KVFormat | None = None  # how values are kept (None: in ``dtype``)

    @property
    def format(self) -> KVFormat:
        return self.stored_as or kv_format.format_for("auto", self.dtype)

    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.format.bytes_per_values(self.head_dim)

    @classmethod
    def from_config(cls, config, dtype: torch.dtype, stored_as: KVFormat | None = None) -> KVShape:
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return cls(config.num_hidden_layers, kv_heads, config_head_dim(config), dtype, stored_as)


def config_head_dim(config) -> int:
    """A transformers config's attention head size: ``head_dim`` where it says one, else hidden / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class KVCache:
    """Per layer, K and V tensors ``[num_blocks, block_size, kv_heads, head_dim]`` in the storage type of the
    shape's :class:`KVFormat` (for q8_0 with float16 scales ``[num_blocks, block_size, kv_heads, head_dim / 32]``
    beside them).

    New keys and values go in through :meth:`write`, addressed by slot = block id * block_size + offset in the
    block; the attention backends read blocks back in the compute dtype through :meth:`read` (a view, no copy,
    where the cache is in the compute dtype; otherwise only the blocks read are converted).

    ``reserved_blocks`` more blocks follow the ``num_blocks`` that the block manager hands out (ids
    ``num_blocks ..``): no sequence ever owns them. The CUDA-graph decode step points its padding rows at the
    first (:attr:`scratch_block`), so they write and read there and never touch a sequence's blocks.
    """

    def __init__(self, shape: KVShape, num_blocks: int, block_size: int, device: torch.device,
                 reserved_blocks: int = 0) -> None:
        self.shape = shape
        self.num_blocks = num_blocks
        self.reserved_blocks = reserved_blocks
        self.block_size = block_size
        self.format = shape.format
        dims = (num_blocks + reserved_blocks, block_size, shape.num_kv_heads, shape.head_dim)
        self.keys, self.flat_keys = _layers(dims, self.format.storage, device, shape.num_layers)
        self.values, self.flat_values = _layers(dims, self.format.storage, device, shape.num_layers)
        self.key_scales = self.value_scales = self.flat_key_scales = self.flat_value_scales = []
        if self.format.scaled:
            scale_dims = (*dims[:3], shape.head_dim // kv_format.Q8_GROUP)
            self.key_scales, self.flat_key_scales = _layers(scale_dims, torch.float16, device, shape.num_layers)
            self.value_scales, self.flat_value_scales = _layers(scale_dims, torch.float16, device, shape.num_layers)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the pool, layer by layer: keys, values and (q8_0) their scales. A block's bytes on disk
        (:mod:`.kv_disk`) follow this order."""
        tensors = []
        for layer in range(self.shape.num_layers):
            tensors += [self.keys[layer], self.values[layer]]
            if self.key_scales:
                tensors += [self.key_scales[layer], self.value_scales[layer]]
        return tensors

    def write(self, layer: int, slots: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store ``key`` and ``value`` (``[T, kv_heads, head_dim]``, any float dtype) at ``slots`` ``[T]``."""
        for new, flat, flat_scales in ((key, self.flat_keys, self.flat_key_scales),
                                       (value, self.flat_values, self.flat_value_scales)):
            stored, scales = kv_format.encode(self.format, new)
            _as_bytes(flat[layer]).index_copy_(0, slots, _as_bytes(stored))
            if scales is not None:
                flat_scales[layer].index_copy_(0, slots, scales)

    def read(self, layer: int, blocks: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of ``blocks`` (block ids of any shape, or a slice of consecutive blocks), each
        ``[*blocks, block_size, kv_heads, head_dim]`` in the compute dtype."""
        return self._read(self.keys, self.key_scales, layer, blocks), self._read(self.values, self.value_scales,
                                                                                 layer, blocks)

    def _read(self, stored: list[torch.Tensor], scales: list[torch.Tensor], layer: int,
              blocks: torch.Tensor | slice) -> torch.Tensor:
        picked = _pick(stored[layer], blocks)
        return kv_format.decode(self.format, picked, _pick(scales[layer], blocks) if scales else None,
                                self.shape.dtype)

    @property
    def scratch_block(self) -> int | None:
        """A block outside the block manager's pool, or None when none is reserved."""
        return self.num_blocks if self.reserved_blocks else None

    @property
    def memory_bytes(self) -> int:
        """Bytes of every block, the reserved ones included."""
        return (self.num_blocks + self.reserved_blocks) * self.block_size * self.shape.bytes_per_token()


def _layers(dims: tuple[int, ...], dtype: torch.dtype, device: torch.device,
            count: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``count`` zeroed tensors of ``dims``, and their flat views ``[blocks * block_size, ...]`` (one row a slot)."""
    tensors = [_zeros(dims, dtype, device) for _ in range(count)]
    return tensors, [t.view(dims[0] * dims[1], *dims[2:]) for t in tensors]


def release_pages(cache: KVCache, block_ids: list[int]) -> int:
    """Give the memory of ``block_ids`` (free blocks: nothing in them is needed) back to the system, on the CPU;
    they read as zeros and are mapped again when next written. Only whole pages inside a run of the given blocks
    go (a block smaller than a page shares it with its neighbours). Returns the bytes released."""
    released = 0
    for tensor in cache.tensors():
        mapping = _MAPPINGS.get(tensor.data_ptr())
        if mapping is None:
            continue
        per_block = tensor[0].numel() * tensor.element_size()
        for first, count in _runs(sorted(block_ids)):
            start = -(-first * per_block // mmap.PAGESIZE) * mmap.PAGESIZE
            end = (first + count) * per_block // mmap.PAGESIZE * mmap.PAGESIZE
            if end > start:
                mapping.madvise(mmap.MADV_DONTNEED, start, end - start)
                released += end - start
    return released


def _runs(ids: list[int]) -> list[tuple[int, int]]:
    """Sorted ids as runs of consecutive ones: (first, count)."""
    runs: list[tuple[int, int]] = []
    for block_id in ids:
        if runs and runs[-1][0] + runs[-1][1] == block_id:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((block_id, 1))
    return runs


def _pick(tensor: torch.Tensor, blocks: torch.Tensor | slice) -> torch.Tensor:
    if isinstance(blocks, slice):
        return tensor[blocks]
    raw = _as_bytes(tensor)
    picked = raw.index_select(0, blocks) if blocks.dim() == 1 else raw[blocks]
    return picked.view(tensor.dtype)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """float8 tensors as bytes: copying and indexing them is not implemented for every float8 type on every
    device, while bytes are; other types as they are."""
    return tensor.view(torch.uint8) if tensor.dtype.itemsize == 1 and tensor.is_floating_point() else tensor


def _zeros(dims: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed tensor; on the CPU in its own anonymous memory mapping, whose pages the system maps only once
    they are written, so resident memory grows with the blocks in use rather than with the pool's size.

    Not calloc: glibc serves a calloc from its heap once a freed block has raised its mmap threshold, and
    then zeroes (and so makes resident) the whole pool at once.
    """
    if device.type != "cpu":
        return torch.zeros(dims, dtype=dtype, device=device)
    nbytes = math.prod(dims) * torch.empty((), dtype=dtype).element_size()
    if nbytes == 0:
        return torch.zeros(dims, dtype=dtype)
    mapping = _anonymous_mapping(nbytes)
    tensor = torch.frombuffer(mapping, dtype=dtype).view(dims)
    if hasattr(mapping, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
        _MAPPINGS[tensor.data_ptr()] = mapping  # for release_pages; forgotten with the tensor
        weakref.finalize(tensor.untyped_storage(), _MAPPINGS.pop, tensor.data_ptr(), None)
    return tensor


_MAPPINGS: dict[int, mmap.mmap] = {}  # a CPU pool tensor's address -> the mapping under it


def _anonymous_mapping(nbytes: int) -> mmap.mmap:
    """Private zero-filled memory, returned to the system when the last tensor over it is gone."""
    if hasattr(mmap, "MAP_PRIVATE"):
        return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mmap.mmap(-1, nbytes)  # Windows: pagefile-backed, committed page by page as it is written


def kv_cache_blocks(config: EngineConfig, device: torch.device, bytes_per_token: int, max_model_len: int,
                    free_bytes: int, block_size: int) -> int:
    """How many KV blocks the engine allocates: the one rule, used by the engine and by the fit estimate.

    ``free_bytes``: memory free once the weights are in place (measured by the engine after loading, predicted
    by the estimate before). ``block_size``: the tokens a block holds with the backend that will run
    (:func:`engine.step.attention_plan.backend_block_size`, which may be larger than ``config.block_size``).
    ``num_kv_blocks`` or ``kv_cache_memory`` in ``config`` decide when set; else a share of the free memory (on
    the CPU at most ``CPU_KV_DEFAULT_CAP``, since the system needs the rest). Never more than ``max_num_seqs``
    sequences of the full context could use.
    """
    if config.num_kv_blocks is not None:
        return config.num_kv_blocks
    memory = config.kv_cache_memory or default_kv_memory(device, free_bytes)
    ceiling = config.max_num_seqs * -(-max_model_len // block_size) + 1
    return max(1, min(memory // (block_size * bytes_per_token), ceiling))


def default_kv_memory(device: torch.device, free_bytes: int) -> int:
    if device.type == "cuda":
        return int(free_bytes * CUDA_KV_SHARE)
    return min(int(free_bytes * CPU_KV_SHARE), CPU_KV_DEFAULT_CAP)
