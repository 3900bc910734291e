"""A stand-in for flash-attn's ``flash_attn_varlen_func`` with a block table, in plain torch, for CPU tests.

It takes the kernel's arguments and refuses what the kernel refuses (flash-attn 2's ``mha_varlen_fwd`` checks):
query, key and value of one dtype (float16 or bfloat16; float32 only when built with ``allow_float32`` for
exact-parity tests), the last dimension contiguous, int32 cumulative lengths and block table, a cache block
size divisible by 256, head sizes up to 256 in multiples of 8, query heads a multiple of the KV heads. It then
attends each sequence's queries over its cached keys with the kernel's causal alignment: the queries are the
sequence's last ones, so query ``i`` of ``n`` sees keys ``0 .. k_len - n + i``.
"""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F


def make_module(allow_float32: bool = False) -> types.ModuleType:
    """A module object to install as ``sys.modules["flash_attn"]``; ``calls`` counts the kernel's calls."""
    module = types.ModuleType("flash_attn")
    module.calls = 0

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, block_table=None, **unused):
        module.calls += 1
        _check(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, allow_float32)
        return _attend(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, softmax_scale, causal)

    module.flash_attn_varlen_func = flash_attn_varlen_func
    return module


def _check(q, k, v, cu_q, cu_k, block_table, allow_float32: bool) -> None:
    allowed = (torch.float16, torch.bfloat16, *((torch.float32,) if allow_float32 else ()))
    if q.dtype not in allowed or k.dtype != q.dtype or v.dtype != q.dtype:
        raise RuntimeError(f"FlashAttention only supports fp16 and bf16 data type (got {q.dtype}, {k.dtype})")
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        raise RuntimeError("Input tensor must have contiguous last dimension")
    if cu_q.dtype != torch.int32 or cu_k.dtype != torch.int32:
        raise RuntimeError("cu_seqlens_q and cu_seqlens_k must have dtype int32")
    if block_table is None or block_table.dtype != torch.int32:
        raise RuntimeError("block_table must have dtype torch.int32")
    if k.dim() != 4 or k.shape[1] % 256:
        raise RuntimeError("Paged KV cache block size must be divisible by 256")
    head_dim = q.shape[-1]
    if head_dim > 256 or head_dim % 8:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256 (multiples of 8)")
    if q.shape[1] % k.shape[2]:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")


def _attend(q, k, v, cu_q, cu_k, block_table, scale, causal):
    heads, kv_heads, block = q.shape[1], k.shape[2], k.shape[1]
    out = torch.empty_like(q)
    for b in range(len(cu_q) - 1):
        q_start, q_end = int(cu_q[b]), int(cu_q[b + 1])
        k_len, n = int(cu_k[b + 1] - cu_k[b]), q_end - q_start
        blocks = block_table[b, : -(-k_len // block)].long()
        keys = k[blocks].reshape(-1, kv_heads, k.shape[-1])[:k_len]  # [L, KH, D]
        values = v[blocks].reshape(-1, kv_heads, v.shape[-1])[:k_len]
        query = q[q_start:q_end].transpose(0, 1)  # [H, n, D]
        keys = keys.transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
        values = values.transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
        mask = None
        if causal:  # bottom-right aligned: the queries are the sequence's last n positions
            mask = torch.arange(k_len)[None, :] <= torch.arange(k_len - n, k_len)[:, None]
        out[q_start:q_end] = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask,
                                                            scale=scale).transpose(0, 1)
    return out
