"""Decode attention that a CUDA graph can hold: every shape fixed by the graph's bucket, nothing built on the host.

A captured graph replays the same kernels on the same addresses, so the step's metadata lives in static device
buffers (see :mod:`.cuda_graphs`) and everything derived from it is computed on the device inside the graph:
no Python value that changes from step to step, no host-built mask, no wait for the device.

Each of the ``B`` rows is one sequence with one new token. Its keys are read through a block table of fixed
width ``W`` (padded with a block no sequence owns); a key is visible when its position is below the row's
context length. Two kernels:

- flash-attn's ``flash_attn_varlen_func`` with a ``block_table``: each row one query, its keys up to its own
  length, so the width costs nothing and one width (the model's whole context) serves every step. The cumulative
  lengths are built on the device from the static context lengths and the maxima are the bucket's (1 query, the
  width's keys), so nothing is read back to the host. Not ``flash_attn_with_kvcache``: flash-attn after 2.8.3
  reads ``cache_seqlens.max().item()`` in its Python wrapper, which a capture refuses.
- torch: the row's ``W`` blocks gathered into ``[B, kv_heads, W * block_size, D]`` and SDPA with a boolean mask
  computed from the context lengths. The gather reads the whole width whatever the row's length, which is why
  :mod:`.cuda_graphs` captures this path per width bucket.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..serving.kv_cache import KVCache


@dataclass(slots=True)
class FlashDecodeMetadata:
    """flash-attn's varlen arguments for one query per row, all on the device or fixed by the bucket."""

    cu_seqlens_q: torch.Tensor  # [B + 1] int32: 0, 1, .., B
    cu_seqlens_k: torch.Tensor  # [B + 1] int32: running sums of the context lengths, from 0
    max_seqlen_k: int  # the bucket's width in tokens: no row is longer


@dataclass(slots=True)
class GraphDecodeMetadata:
    """A decode step's metadata as device tensors of fixed shape: ``B`` rows, block tables ``W`` wide."""

    kv_cache: KVCache
    positions: torch.Tensor  # [B] the new token's position (its context length - 1)
    slot_mapping: torch.Tensor  # [B] int64 cache slot of the new token
    block_table: torch.Tensor  # [B, W] int64 (torch path) or int32 (flash path)
    context_lengths: torch.Tensor  # [B] keys per row, this step's token included; int32 on the flash path
    key_mask: torch.Tensor | None  # [B, 1, 1, W * block_size] True where a key is visible (torch path only)
    flash: FlashDecodeMetadata | None = None  # the flash path's varlen arguments

    def attend(self, layer: int, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               scaling: float | None) -> torch.Tensor:
        """Write this step's keys and values, attend; ``query``: ``[1, H, B, D]``; returns ``[1, B, H, D]``."""
        self.kv_cache.write(layer, self.slot_mapping, key[0].transpose(0, 1), value[0].transpose(0, 1))
        q = query[0].transpose(0, 1)  # [B, H, D]
        if self.flash is not None:  # flash-attn runs only on a cache in the compute dtype (attention_plan)
            return _flash_decode(q, self.kv_cache.keys[layer], self.kv_cache.values[layer], self, scaling)
        return _torch_decode(q, self.kv_cache, layer, self, scaling)


def graph_decode_metadata(kv_cache: KVCache, positions: torch.Tensor, slot_mapping: torch.Tensor,
                          block_table: torch.Tensor, context_lengths: torch.Tensor,
                          flash: bool) -> GraphDecodeMetadata:
    """The metadata every layer reads, derived on the device from the static buffers (once per step)."""
    if flash:  # flash-attn takes int32 tables and lengths, contiguous in their last dimension
        lengths = context_lengths.to(torch.int32)
        varlen = FlashDecodeMetadata(
            cu_seqlens_q=torch.arange(len(lengths) + 1, dtype=torch.int32, device=lengths.device),
            cu_seqlens_k=F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)),
            max_seqlen_k=block_table.shape[1] * kv_cache.block_size,
        )
        return GraphDecodeMetadata(kv_cache, positions, slot_mapping, block_table.to(torch.int32), lengths, None,
                                   varlen)
    keys = block_table.shape[1] * kv_cache.block_size
    visible = torch.arange(keys, device=context_lengths.device)[None, :] < context_lengths[:, None]
    return GraphDecodeMetadata(kv_cache, positions, slot_mapping, block_table, context_lengths,
                               visible[:, None, None, :])


def _torch_decode(q: torch.Tensor, cache: KVCache, layer: int, meta: GraphDecodeMetadata,
                  scaling: float | None) -> torch.Tensor:
    batch, heads, head_dim = q.shape
    kv_heads = cache.shape.num_kv_heads
    # query heads that share a KV head are attended together: [B, kv_heads, groups, D], as the eager path does
    queries = q.reshape(batch, kv_heads, heads // kv_heads, head_dim)
    # each row's W blocks in table order, [B, W, block_size, kv_heads, D] -> [B, kv_heads, W * block_size, D]
    keys, values = (blocks.flatten(1, 2).transpose(1, 2) for blocks in cache.read(layer, meta.block_table))
    attended = F.scaled_dot_product_attention(queries, keys, values, attn_mask=meta.key_mask, scale=scaling)
    return attended.reshape(batch, heads, head_dim).unsqueeze(0)


def _flash_decode(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, meta: GraphDecodeMetadata,
                  scaling: float | None) -> torch.Tensor:
    from flash_attn import flash_attn_varlen_func

    varlen = meta.flash
    out = flash_attn_varlen_func(q, cache_k, cache_v, cu_seqlens_q=varlen.cu_seqlens_q,
                                 cu_seqlens_k=varlen.cu_seqlens_k, max_seqlen_q=1, max_seqlen_k=varlen.max_seqlen_k,
                                 softmax_scale=scaling, causal=True, block_table=meta.block_table)
    return out.unsqueeze(0)  # [B, H, D] -> [1, B, H, D]
