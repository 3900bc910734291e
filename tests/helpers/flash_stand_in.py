"""Stand-ins for flash-attn's ``flash_attn_varlen_func`` and ``flash_attn_with_kvcache`` with a block table, in
plain torch, for CPU tests.

It takes the kernel's arguments and refuses what the kernel refuses (flash-attn 2's ``mha_varlen_fwd`` checks):
query, key and value of one dtype (float16 or bfloat16; float32 only when built with ``allow_float32`` for
exact-parity tests), the last dimension contiguous, int32 cumulative lengths and block table, a cache block
size divisible by 256, head sizes up to 256 in multiples of 8, query heads a multiple of the KV heads. It then
attends each sequence's queries over its cached keys with the kernel's causal alignment: the queries are the
sequence's last ones, so query ``i`` of ``n`` sees keys ``0 .. k_len - n + i``.

Under a simulated graph capture (:mod:`tests.helpers.eager_graphs`) the kernels' own work is allowed to read
tensors (a GPU kernel reads device memory), but ``flash_attn_with_kvcache`` reads ``cache_seqlens.max()`` back to
the host first, as flash-attn's Python wrapper does after 2.8.3, so it cannot be captured.

``flash_attn_with_kvcache`` (the paged decode kernel, ``mha_fwd_kvcache``) is checked the same way for its own
arguments: ``q`` ``[batch, seqlen_q, heads, D]``, caches ``[num_blocks, block_size, kv_heads, D]`` of the query's
dtype with a contiguous last dimension, ``cache_seqlens`` int32, contiguous, one per batch row, an int32
``[batch, max_blocks]`` block table and no ``cache_batch_idx`` with it. The stand-in attends over the cache only
(no ``k``/``v`` appended, no rotary), which is how the engine calls it.
"""

from __future__ import annotations

import sys
import types

import torch
import torch.nn.functional as F

from engine.step import attention_plan
from tests.helpers.eager_graphs import kernel_side


def install(monkeypatch, allow_float32: bool = True) -> types.ModuleType:
    """The stand-in as ``flash_attn``, and every attention plan (the engine's and the fit estimate's) choosing it
    unless the torch path is asked for by name: flash-attn is CUDA-only, the stand-in runs its path on the CPU."""
    module = make_module(allow_float32)
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    plan_as_backend(monkeypatch, "flash_attn")
    return module


def plan_as_backend(monkeypatch, backend: str) -> None:
    """Make :func:`attention_plan.plan_attention` pick ``backend`` with the block size it runs with on CUDA."""
    plan = attention_plan.plan_attention

    def as_if_on_cuda(config, device, head_dim, dtype, kv=None):
        if config.attention_backend == "torch" or (kv is not None and kv.storage != dtype):
            return plan(config, device, head_dim, dtype, kv)
        block_size = attention_plan.backend_block_size(backend, config.block_size, torch.device("cuda"))
        return attention_plan.AttentionPlan(backend, f"{backend} as on CUDA", block_size)

    monkeypatch.setattr(attention_plan, "plan_attention", as_if_on_cuda)


def make_module(allow_float32: bool = False) -> types.ModuleType:
    """A module object to install as ``sys.modules["flash_attn"]``; ``calls`` counts the kernel's calls."""
    module = types.ModuleType("flash_attn")
    module.calls = 0

    def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                               softmax_scale=None, causal=False, block_table=None, **unused):
        module.calls += 1
        with kernel_side():  # the C++ kernel's checks and work: no read of the caller's
            _check(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, allow_float32)
            return _attend(q, k, v, cu_seqlens_q, cu_seqlens_k, block_table, softmax_scale, causal)

    def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                                cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                                softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
        module.kvcache_calls += 1
        if any(x is not None for x in (k, v, rotary_cos, rotary_sin, cache_leftpad, alibi_slopes)):
            raise NotImplementedError("the stand-in attends over the cache only, as the engine calls it")
        # the Python wrapper's own steps: asserts on the caches, then contiguous q and block table
        assert k_cache.stride(-1) == 1, "k_cache must have contiguous last dimension"
        assert v_cache.stride(-1) == 1, "v_cache must have contiguous last dimension"
        q = q if q.stride(-1) == 1 else q.contiguous()
        if block_table is not None and block_table.stride(-1) != 1:
            block_table = block_table.contiguous()
        if cache_seqlens is not None:  # flash-attn after 2.8.3 (PR 2711): a host read, which a capture refuses
            cache_seqlens.max().item()
        with kernel_side():
            _check_kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, block_table, allow_float32)
            scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
            return _attend_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, scale, causal)

    module.flash_attn_varlen_func = flash_attn_varlen_func
    module.flash_attn_with_kvcache = flash_attn_with_kvcache
    module.kvcache_calls = 0
    return module


def _check_kvcache(q, k_cache, v_cache, seqlens, cache_batch_idx, block_table, allow_float32: bool) -> None:
    allowed = (torch.float16, torch.bfloat16, *((torch.float32,) if allow_float32 else ()))
    if q.dtype not in allowed:
        raise RuntimeError(f"FlashAttention only support fp16 and bf16 data type (got {q.dtype})")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise RuntimeError("query and key must have the same dtype")
    if block_table is None:
        raise NotImplementedError("the stand-in covers the paged cache only (block_table given)")
    if cache_batch_idx is not None:
        raise RuntimeError("Paged KVcache does not support cache_batch_idx")
    if block_table.dtype != torch.int32:
        raise RuntimeError("block_table must have dtype torch.int32")
    if q.dim() != 4 or k_cache.dim() != 4 or v_cache.shape != k_cache.shape:
        raise RuntimeError("q must be [batch, seqlen_q, heads, D] and the caches [blocks, block_size, kv_heads, D]")
    batch, _, heads, head_dim = q.shape
    if k_cache.shape[1] % 256:
        raise RuntimeError("Paged KV cache block size must be divisible by 256")
    if batch <= 0:
        raise RuntimeError("batch size must be positive")
    if head_dim > 256 or k_cache.shape[3] != head_dim:
        raise RuntimeError("FlashAttention forward only supports head dimension at most 256 (and q's must match)")
    if heads % k_cache.shape[2]:
        raise RuntimeError("Number of heads in key/value must divide number of heads in query")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise RuntimeError("block_table must be [batch_size, max_num_blocks_per_seq]")
    if seqlens is None or seqlens.dtype != torch.int32:
        raise RuntimeError("seqlens_k must have dtype int32")
    if not seqlens.is_contiguous() or seqlens.shape != (batch,):
        raise RuntimeError("seqlens_k must be contiguous with one length per batch row")
    if int(seqlens.max()) > block_table.shape[1] * k_cache.shape[1]:
        raise RuntimeError("a cache length is longer than its block table holds (the kernel would read past it)")


def _attend_kvcache(q, k_cache, v_cache, seqlens, block_table, scale, causal):
    batch, n, heads, head_dim = q.shape
    kv_heads, block = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty_like(q)
    for b in range(batch):
        k_len = int(seqlens[b])
        blocks = block_table[b, : -(-k_len // block)].long()
        keys = k_cache[blocks].reshape(-1, kv_heads, head_dim)[:k_len].transpose(0, 1)
        values = v_cache[blocks].reshape(-1, kv_heads, head_dim)[:k_len].transpose(0, 1)
        keys = keys.repeat_interleave(heads // kv_heads, dim=0)
        values = values.repeat_interleave(heads // kv_heads, dim=0)
        mask = torch.arange(k_len)[None, :] <= torch.arange(k_len - n, k_len)[:, None] if causal else None
        out[b] = F.scaled_dot_product_attention(q[b].transpose(0, 1), keys, values, attn_mask=mask,
                                                scale=scale).transpose(0, 1)
    return out


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
