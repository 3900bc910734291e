"""Paged attention by itself, against plain causal attention over each sequence's whole keys: decode rows both
through the native kernel (the CPU's float32 steps) and through torch's SDPA (CUDA's, and other dtypes')."""

import types

import pytest
import torch

from engine.serving.kv_cache import KVCache, KVShape
from engine.step import kernels
from engine.step.attention import SequenceSlice, build_metadata, paged_attention

PATHS = ["native", "sdpa"]

HEADS, KV_HEADS, DIM, BS = 4, 2, 8, 4


def reference(q, k, v):
    """Causal attention of the last ``len(q)`` positions of one sequence; k, v: [L, kv_heads, D]."""
    groups = HEADS // KV_HEADS
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    offset = k.shape[0] - q.shape[0]
    mask = torch.arange(k.shape[0])[None, :] <= (torch.arange(q.shape[0])[:, None] + offset)
    return torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
    ).transpose(0, 1)


def run_step(cache, slices, new_k, new_v, q, path="native"):
    assert kernels.available(), kernels.status().detail  # make install builds them
    meta = build_metadata(cache, slices, torch.device("cpu"), "torch", torch.float32)
    assert meta.native_decode  # the CPU's float32 steps take the native kernel
    meta.native_decode = path == "native"  # the SDPA path: CUDA's, and other dtypes'; tested here on the CPU
    module = types.SimpleNamespace(layer_idx=0)
    out, _ = paged_attention(module, q.transpose(0, 1)[None], new_k.transpose(0, 1)[None],
                             new_v.transpose(0, 1)[None], None, scaling=None, kvasir=meta)
    return out[0], meta


@pytest.mark.parametrize("path", PATHS)
def test_mixed_decode_and_prefill_step_matches_reference(path):
    torch.manual_seed(0)
    cache = KVCache(KVShape(1, KV_HEADS, DIM, torch.float32), 32, BS, torch.device("cpu"))
    # Sequence A: 6 tokens already cached in blocks [5, 2]; decodes 1 token now (block 2, offset 2).
    # Sequence B: 3 tokens cached in block [9]; prefills 7 more now (blocks 9, 4, 7).
    full_a, full_b = torch.randn(7, KV_HEADS, DIM), torch.randn(10, KV_HEADS, DIM)
    vals_a, vals_b = torch.randn(7, KV_HEADS, DIM), torch.randn(10, KV_HEADS, DIM)
    table_a, table_b = [5, 2], [9, 4, 7]
    for table, keys, values, n in ((table_a, full_a, vals_a, 6), (table_b, full_b, vals_b, 3)):
        for pos in range(n):
            slot = table[pos // BS] * BS + pos % BS
            cache.flat_keys[0][slot], cache.flat_values[0][slot] = keys[pos], values[pos]
    slices = [SequenceSlice(0, 6, 7, table_a), SequenceSlice(1, 3, 10, table_b)]
    q = torch.randn(8, HEADS, DIM)
    new_k = torch.cat([full_a[6:], full_b[3:]])
    new_v = torch.cat([vals_a[6:], vals_b[3:]])
    out, meta = run_step(cache, slices, new_k, new_v, q, path)
    assert meta.decode is not None and meta.prefill is not None
    assert torch.allclose(out[:1], reference(q[:1], full_a, vals_a), atol=1e-5)
    assert torch.allclose(out[1:], reference(q[1:], full_b, vals_b), atol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_lone_sequence_reads_consecutive_blocks_in_place(path):
    cache = KVCache(KVShape(1, KV_HEADS, DIM, torch.float32), 16, BS, torch.device("cpu"))
    consecutive = build_metadata(cache, [SequenceSlice(0, 5, 6, [3, 4])], torch.device("cpu"), "torch", torch.float32)
    scattered = build_metadata(cache, [SequenceSlice(0, 5, 6, [4, 3])], torch.device("cpu"), "torch", torch.float32)
    assert consecutive.decode.first_block == 3 and scattered.decode.first_block is None
    torch.manual_seed(1)
    for table in ([3, 4], [4, 3]):
        keys, values = torch.randn(6, KV_HEADS, DIM), torch.randn(6, KV_HEADS, DIM)
        for pos in range(5):
            slot = table[pos // BS] * BS + pos % BS
            cache.flat_keys[0][slot], cache.flat_values[0][slot] = keys[pos], values[pos]
        q = torch.randn(1, HEADS, DIM)
        out, _ = run_step(cache, [SequenceSlice(0, 5, 6, table)], keys[5:], values[5:], q, path)
        assert torch.allclose(out, reference(q, keys, values), atol=1e-5)


def test_a_drafts_positions_as_decode_rows_get_what_decoding_them_one_at_a_time_gets():
    """A draft being checked is a run of decode rows of one sequence (its last token, then each draft token, each
    row one position longer), beside another sequence's decode row. Through the native kernel each row's output
    is bit for bit the output of the same row decoded in a step of its own (so a greedy reply with drafts is
    token for token the reply without), and plain attention's within float32 rounding."""
    torch.manual_seed(2)
    cache = KVCache(KVShape(1, KV_HEADS, DIM, torch.float32), 32, BS, torch.device("cpu"))
    table, other = [6, 1, 8, 3], [2, 5]
    keys, values = torch.randn(14, KV_HEADS, DIM), torch.randn(14, KV_HEADS, DIM)
    other_keys, other_values = torch.randn(7, KV_HEADS, DIM), torch.randn(7, KV_HEADS, DIM)
    for blocks, k, v, n in ((table, keys, values, 10), (other, other_keys, other_values, 6)):
        for pos in range(n):
            slot = blocks[pos // BS] * BS + pos % BS
            cache.flat_keys[0][slot], cache.flat_values[0][slot] = k[pos], v[pos]
    q = torch.randn(5, HEADS, DIM)  # positions 10 .. 13 of the drafted sequence, then the other's position 6
    run = [SequenceSlice(j, 10 + j, 11 + j, table) for j in range(4)] + [SequenceSlice(4, 6, 7, other)]
    together, _ = run_step(cache, run, torch.cat([keys[10:], other_keys[6:]]),
                           torch.cat([values[10:], other_values[6:]]), q)
    for j in range(4):
        alone, _ = run_step(cache, [SequenceSlice(0, 10 + j, 11 + j, table)], keys[10 + j : 11 + j],
                            values[10 + j : 11 + j], q[j : j + 1])
        assert torch.equal(together[j], alone[0]), f"draft row {j}"
        assert torch.allclose(alone, reference(q[j : j + 1], keys[: 11 + j], values[: 11 + j]), atol=1e-5)
