"""Paged attention, registered with transformers' ``AttentionInterface``.

The model runs on one packed row of tokens from many sequences (``input_ids`` of shape ``(1, T)``). Each
layer's attention call receives the step's :class:`StepMetadata` as the ``kvasir`` keyword: it writes the
new keys and values into the paged cache through the slot mapping, then attends over each sequence's
blocks. Everything that is the same for every layer (gather indices, masks) is built once per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..serving.kv_cache import KVCache
from . import kernels
from .flex_attention import FlexMetadata, build_flex_metadata, flex_paged_attention
from .transfer import to_device

ATTENTION_NAME = "kvasir_paged"


@dataclass(slots=True)
class GroupMetadata:
    """A batch of sequences attended together: queries padded to ``[B, Q]``, keys to ``[B, L]``."""

    query_index: torch.Tensor  # [B, Q] positions in the packed row (padding repeats a valid one)
    kv_blocks: torch.Tensor  # [B * N] each sequence's block table, padded with block 0
    kv_lengths: torch.Tensor  # [B] each sequence's key count (its length after this step's tokens)
    kv_width: int  # L: the longest sequence's length; keys beyond a sequence's own length are masked
    is_whole_step: bool  # the group's queries are exactly the step's tokens, in order
    query_positions: list[list[int]]  # [B][Q] absolute position of each (padded) query
    mask_dtype: torch.dtype
    sequences: list[tuple[int, int, int, int | None]]  # per sequence: offset in T, new tokens, keys, first block
    blocks_per_sequence: int  # N: each sequence's row of kv_blocks
    _masks: dict[int, torch.Tensor | None] = field(default_factory=dict)

    @property
    def first_block(self) -> int | None:
        """A lone sequence whose blocks are consecutive in the pool: where they start (read them in place)."""
        return self.sequences[0][3] if len(self.sequences) == 1 else None

    @property
    def mask(self) -> torch.Tensor | None:
        """``[B, 1, Q, L]`` additive mask (0 or -inf), None when nothing is masked; built on first use (the
        native decode kernel never needs it)."""
        if 1 not in self._masks:
            self._masks[1] = _causal_mask(self.query_positions, self.kv_width, self.mask_dtype,
                                          self.query_index.device)
        return self._masks[1]

    def mask_for_groups(self, groups: int) -> torch.Tensor | None:
        """The mask for queries packed as ``[B, kv_heads, groups * Q, D]`` (built once per step)."""
        mask = self.mask
        if groups == 1 or mask is None:
            return mask
        if groups not in self._masks:
            batch, _, queries, keys = mask.shape
            expanded = mask.unsqueeze(2).expand(batch, 1, groups, queries, keys)
            self._masks[groups] = expanded.reshape(batch, 1, groups * queries, keys)
        return self._masks[groups]


def _causal_mask(query_positions: list[list[int]], kv_width: int, dtype: torch.dtype,
                 device: torch.device) -> torch.Tensor | None:
    """Key ``k`` is visible to a query at position ``p`` when ``k <= p`` (which also bounds each sequence)."""
    if all(p >= kv_width - 1 for row in query_positions for p in row):
        return None
    allowed = torch.arange(kv_width)[None, None, :] <= torch.tensor(query_positions)[:, :, None]
    return to_device(torch.zeros(allowed.shape, dtype=dtype).masked_fill_(~allowed, float("-inf")).unsqueeze(1), device)


@dataclass(slots=True)
class FlashMetadata:
    """Arguments of flash-attn's varlen kernel with a block table."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_k: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    block_table: torch.Tensor


@dataclass(slots=True)
class StepMetadata:
    """What every layer needs to run paged attention for one step."""

    kv_cache: KVCache
    positions: torch.Tensor  # [T] position of each new token in its sequence
    slot_mapping: torch.Tensor  # [T] cache slot of each new token
    decode: GroupMetadata | None = None  # sequences with one new token
    prefill: GroupMetadata | None = None  # sequences with several new tokens
    flash: FlashMetadata | None = None
    flex: FlexMetadata | None = None
    native_decode: bool = False  # decode rows go through the native kernel (:func:`uses_native_decode`)


@dataclass(slots=True)
class SequenceSlice:
    """One sequence's share of a step: new tokens at ``[start, end)`` of its positions, at ``offset`` in T."""

    offset: int
    start: int
    end: int
    block_table: list[int]


def build_metadata(
    kv_cache: KVCache, slices: list[SequenceSlice], device: torch.device, backend: str, dtype: torch.dtype
) -> StepMetadata:
    """Build the step's metadata on the CPU, then move it to ``device`` once."""
    block_size = kv_cache.block_size
    positions = [p for s in slices for p in range(s.start, s.end)]
    slots = [s.block_table[p // block_size] * block_size + p % block_size
             for s in slices for p in range(s.start, s.end)]
    meta = StepMetadata(kv_cache, to_device(torch.tensor(positions), device), to_device(torch.tensor(slots), device))
    if backend == "flex":
        meta.flex = build_flex_metadata(slices, block_size, kv_cache.num_blocks, device)
        return meta
    tables = _padded_block_tables(slices)
    if backend == "flash_attn":
        meta.flash = _flash_metadata(slices, tables, device)
        return meta
    meta.native_decode = backend == "torch" and uses_native_decode(device, dtype)
    decode = [i for i, s in enumerate(slices) if s.end - s.start == 1]
    prefill = [i for i, s in enumerate(slices) if s.end - s.start > 1]
    whole = len(decode) == len(slices) or len(prefill) == len(slices)
    if decode:
        meta.decode = _group_metadata([slices[i] for i in decode], tables[decode], block_size, device, whole, dtype)
    if prefill:
        meta.prefill = _group_metadata([slices[i] for i in prefill], tables[prefill], block_size, device, whole, dtype)
    return meta


def uses_native_decode(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether decode rows (one new token of a sequence each: a reply's next token, or one position of a draft
    being checked) are attended by the native kernel (``kernels/layer_ops.cpp``) rather than torch's SDPA over
    gathered keys: on the CPU in float32, where the kernels built. It reads the pool's blocks where they lie (SDPA
    needs each sequence's keys gathered first, a copy of the whole context per layer), and a row's result is
    the same bits whatever rows are beside it, so a draft's positions checked as decode rows compute exactly
    what decoding them one step at a time would. Its sums run in another order than SDPA's (relative
    differences of about 1e-7, what tests/engine/test_native_kernels.py holds it to)."""
    return device.type == "cpu" and dtype == torch.float32 and kernels.available()


def native_decode_attention(query: torch.Tensor, cache: KVCache, layer: int, group: GroupMetadata, heads: int,
                            scaling: float) -> torch.Tensor:
    """Attention of ``group``'s decode rows (``query``: ``[B, heads * D]``, float32, contiguous) over their
    blocks of ``cache``'s layer ``layer``, by the native kernel; returns ``[B, heads * D]``."""
    return torch.ops.kvasir_kernels.paged_decode_attention(
        query, cache.keys[layer], cache.values[layer], _scales(cache.key_scales, layer),
        _scales(cache.value_scales, layer),
        group.kv_blocks.view(group.kv_lengths.numel(), -1), group.kv_lengths, heads, scaling,
    )


def _scales(scales: list[torch.Tensor], layer: int) -> torch.Tensor:
    """A layer's q8_0 scales, or an empty tensor where the cache has none (the kernels' convention)."""
    return scales[layer] if scales else _NO_SCALES


_NO_SCALES = torch.empty(0, dtype=torch.float16)


def _padded_block_tables(slices: list[SequenceSlice]) -> torch.Tensor:
    width = max(len(s.block_table) for s in slices)
    return torch.tensor([s.block_table + [0] * (width - len(s.block_table)) for s in slices], dtype=torch.long)


def _group_metadata(
    slices: list[SequenceSlice],
    tables: torch.Tensor,
    block_size: int,
    device: torch.device,
    whole: bool,
    dtype: torch.dtype,
) -> GroupMetadata:
    # a few hundred values at most: Python lists are cheaper here than a dozen small tensor operations
    lengths = [s.end - s.start for s in slices]
    q_width, kv_width = max(lengths), max(s.end for s in slices)
    steps = [[j if j < n else 0 for j in range(q_width)] for n in lengths]  # padding repeats the first query
    all_valid = all(n == q_width for n in lengths)
    num_blocks = -(-kv_width // block_size)
    first_blocks = [_consecutive_start(s.block_table[: -(-s.end // block_size)]) for s in slices]
    return GroupMetadata(
        query_index=to_device(torch.tensor([[s.offset + j for j in row] for s, row in zip(slices, steps)]), device),
        kv_blocks=to_device(tables[:, :num_blocks].contiguous().view(-1), device),
        kv_lengths=to_device(torch.tensor([s.end for s in slices]), device),
        kv_width=kv_width,
        is_whole_step=whole and all_valid and q_width * len(slices) == sum(lengths),
        query_positions=[[s.start + j for j in row] for s, row in zip(slices, steps)],
        mask_dtype=dtype,
        sequences=[(s.offset, s.end - s.start, s.end, first) for s, first in zip(slices, first_blocks)],
        blocks_per_sequence=num_blocks,
    )


def _consecutive_start(block_table: list[int]) -> int | None:
    first = block_table[0]
    return first if block_table == list(range(first, first + len(block_table))) else None


def _flash_metadata(slices: list[SequenceSlice], tables: torch.Tensor, device: torch.device) -> FlashMetadata:
    q_lens = torch.tensor([s.end - s.start for s in slices], dtype=torch.int32)
    k_lens = torch.tensor([s.end for s in slices], dtype=torch.int32)
    zero = torch.zeros(1, dtype=torch.int32)
    return FlashMetadata(
        cu_seqlens_q=to_device(torch.cat([zero, q_lens.cumsum(0, dtype=torch.int32)]), device),
        cu_seqlens_k=to_device(torch.cat([zero, k_lens.cumsum(0, dtype=torch.int32)]), device),
        max_seqlen_q=int(q_lens.max()),
        max_seqlen_k=int(k_lens.max()),
        block_table=to_device(tables.to(torch.int32), device),
    )


# -- the attention function ------------------------------------------------------------------------


def paged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    kvasir: StepMetadata | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention entry point. ``query``: ``[1, H, T, D]``; returns ``[1, T, H, D]``."""
    if kvasir is None:
        raise RuntimeError("kvasir_paged attention needs the engine's step metadata")
    layer, cache = module.layer_idx, kvasir.kv_cache
    cache.write(layer, kvasir.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
    q = query[0].transpose(0, 1)  # [T, H, D]
    if kvasir.flash is not None:
        out = _flash_attention(q, kvasir.kv_cache, layer, kvasir.flash, scaling)
    elif kvasir.flex is not None:
        out = flex_paged_attention(q, kvasir.kv_cache.keys[layer], kvasir.kv_cache.values[layer], kvasir.flex, scaling)
    else:
        decode, prefill = kvasir.decode, kvasir.prefill
        if kvasir.native_decode:
            out = attend_natively(q, cache, layer, decode, prefill, scaling)
        elif decode is not None and decode.is_whole_step:
            out = attend_group(q, cache, layer, decode, scaling).reshape(q.shape)
        else:
            out = torch.empty_like(q)
            if decode is not None:  # one query per sequence: no padding, so no boolean indexing
                out[decode.query_index.view(-1)] = attend_group(q, cache, layer, decode, scaling).reshape(
                    -1, *q.shape[1:])
            if prefill is not None:
                attend_sequences(out, q, cache, layer, prefill, scaling)
    return out.unsqueeze(0), None


def attend_natively(q: torch.Tensor, cache: KVCache, layer: int, decode: GroupMetadata | None,
                    prefill: GroupMetadata | None, scaling: float | None) -> torch.Tensor:
    """A step's attention (``q``: ``[T, H, D]``, float32) with its decode rows attended by
    :func:`native_decode_attention` and its prefill chunks by :func:`attend_sequences`; returns ``[T, H, D]``."""
    tokens, heads, head_dim = q.shape
    scale = head_dim ** -0.5 if scaling is None else scaling
    if decode is not None and decode.is_whole_step:
        return native_decode_attention(q.reshape(tokens, heads * head_dim), cache, layer, decode, heads,
                                       scale).view(q.shape)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if decode is not None:
        rows = decode.query_index.view(-1)
        out[rows] = native_decode_attention(q.index_select(0, rows).view(-1, heads * head_dim), cache, layer,
                                            decode, heads, scale).view(-1, heads, head_dim)
    if prefill is not None:
        attend_sequences(out, q, cache, layer, prefill, scaling)
    return out


def _gather(cache: KVCache, layer: int, group: GroupMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Each sequence's keys and values, ``[B, kv_heads, L, D]``, read block by block (large contiguous rows)."""
    if group.first_block is not None:  # consecutive blocks: a view where the cache is in the compute dtype
        keys, values = cache.read(layer, slice(group.first_block, group.first_block + group.kv_blocks.numel()))
    else:
        keys, values = cache.read(layer, group.kv_blocks)  # [B * N, block_size, kv_heads, D]
    batch = group.query_index.shape[0]
    return tuple(blocks.view(batch, -1, *blocks.shape[2:])[:, : group.kv_width].transpose(1, 2)
                 for blocks in (keys, values))


def attend_group(
    q: torch.Tensor,
    cache: KVCache,
    layer: int,
    group: GroupMetadata,
    scaling: float | None,
) -> torch.Tensor:
    num_heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = cache.shape.num_kv_heads
    groups = num_heads // kv_heads
    batch, q_width = group.query_index.shape
    # [B, Q, H, D] -> [B, kv_heads, groups * Q, D]: query heads that share a KV head are attended together.
    queries = q if group.is_whole_step else q.index_select(0, group.query_index.view(-1))
    queries = queries.view(batch, q_width, kv_heads, groups, head_dim)
    queries = queries.permute(0, 2, 3, 1, 4).reshape(batch, kv_heads, groups * q_width, head_dim)
    keys, values = _gather(cache, layer, group)  # [B, kv_heads, L, D]
    attended = F.scaled_dot_product_attention(
        queries, keys.to(queries.dtype), values.to(queries.dtype), attn_mask=group.mask_for_groups(groups),
        scale=scaling,
    )
    attended = attended.view(batch, kv_heads, groups, q_width, head_dim).permute(0, 3, 1, 2, 4)
    return attended.reshape(batch, q_width, num_heads, head_dim)


def attend_sequences(
    out: torch.Tensor,
    q: torch.Tensor,
    cache: KVCache,
    layer: int,
    group: GroupMetadata,
    scaling: float | None,
) -> None:
    """Attention of several new tokens per sequence (prefill chunks), one sequence at a time, into ``out``.

    ``q`` and ``out``: ``[T, H, D]``. Each sequence's queries are its last ``n`` positions, so key ``k`` is
    visible to query ``i`` when ``k <= keys - n + i`` (causal, aligned to the bottom right): SDPA takes that
    as a lower-right causal mask (:func:`_lower_right_causal`), and query heads that share a KV head as ``enable_gqa``.
    Keys are read in place where a sequence's blocks are consecutive in the pool (and the cache is in the compute
    dtype), else gathered block by block.
    Every index is a Python number: no wait for the device.
    """
    width = group.blocks_per_sequence
    for row, (offset, count, length, first) in enumerate(group.sequences):
        used = -(-length // cache.block_size)
        if first is not None:
            keys, values = cache.read(layer, slice(first, first + used))
        else:
            keys, values = cache.read(layer, group.kv_blocks[row * width : row * width + used])
        keys = keys.flatten(0, 1)[:length].transpose(0, 1)[None].to(q.dtype)  # [1, KH, L, D]
        values = values.flatten(0, 1)[:length].transpose(0, 1)[None].to(q.dtype)
        queries = q[offset : offset + count].transpose(0, 1)[None]  # [1, H, n, D]
        mask = _lower_right_causal(count, length, q.device) if count < length else None
        attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, is_causal=mask is None,
                                                  scale=scaling, enable_gqa=True)
        out[offset : offset + count] = attended[0].transpose(0, 1)


def _lower_right_causal(queries: int, keys: int, device: torch.device):
    """The mask of ``queries`` queries over ``keys`` keys aligned to the bottom right. On CUDA torch's causal bias,
    which its kernels take without a dense mask; on the CPU torch would build this very boolean mask from it, so
    it is built here and the bias module, which brings in torch's compiler (a second and 40 MiB), stays out."""
    if device.type == "cuda":
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(queries, keys)
    return torch.ones(queries, keys, dtype=torch.bool, device=device).tril(keys - queries)


def _flash_attention(
    q: torch.Tensor, kv_cache: KVCache, layer: int, meta: FlashMetadata, scaling: float | None
) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(
        q,
        kv_cache.keys[layer],
        kv_cache.values[layer],
        cu_seqlens_q=meta.cu_seqlens_q,
        cu_seqlens_k=meta.cu_seqlens_k,
        max_seqlen_q=meta.max_seqlen_q,
        max_seqlen_k=meta.max_seqlen_k,
        softmax_scale=scaling,
        causal=True,
        block_table=meta.block_table,
    )


def flash_attn_available() -> bool:
    """True when flash-attn's varlen kernel can be imported."""
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
    except Exception:
        return False
    return True


FLASH_BLOCK_SIZE = 256  # flash-attn's paged kernel needs a multiple of 256
FLASH_MIN_CAPABILITY = (8, 0)  # flash-attn 2: Ampere or newer
FLASH_MAX_HEAD_DIM = 256


def flash_attn_problem(dtype: torch.dtype, capability: tuple[int, int], head_dim: int) -> str | None:
    """Why flash-attn's kernel can't run this model on this GPU (None when it can): it computes in float16 or
    bfloat16 only, on compute capability 8.0 or newer, for head sizes up to 256 in multiples of 8."""
    if dtype not in (torch.float16, torch.bfloat16):
        return f"flash-attn computes in float16 or bfloat16, not {str(dtype).removeprefix('torch.')}"
    if tuple(capability) < FLASH_MIN_CAPABILITY:
        return f"flash-attn needs compute capability 8.0 or newer; this GPU has {capability[0]}.{capability[1]}"
    if head_dim > FLASH_MAX_HEAD_DIM or head_dim % 8:
        return f"flash-attn takes head sizes up to {FLASH_MAX_HEAD_DIM} in multiples of 8; this model's is {head_dim}"
    return None


def register() -> str:
    """Register the paged attention function with transformers; returns its name. Called where a model of
    transformers' own classes is built (the import brings in transformers' modeling stack)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, paged_attention)
    return ATTENTION_NAME
