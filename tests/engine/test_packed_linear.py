"""Packed weight-only layers: the kernels compute with the weights we think, and GGUF blocks map exactly."""

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize

from engine.step.packed_linear import Int4Linear, Int8Linear, decode_q4_blocks, quantize_int4

BF16_STEP = 2.0**-8  # relative rounding of a bfloat16 value


def _linear(out_features=48, in_features=128, seed=0, bias=True):
    torch.manual_seed(seed)
    layer = torch.nn.Linear(in_features, out_features, bias=bias)
    with torch.no_grad():
        layer.weight.normal_(0.0, 0.5)
    return layer


def _gguf_blocks(kind: str, rows=32, cols=128, seed=1):
    weights = np.random.default_rng(seed).normal(0.0, 1.0, (rows, cols)).astype(np.float32)
    qtype = gguf.GGMLQuantizationType[kind]
    blocks = quantize(weights, qtype)
    return blocks, torch.from_numpy(dequantize(blocks, qtype))


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_int4_layer_computes_with_its_dequantised_weight(group_size):
    linear = _linear()
    packed = Int4Linear.from_float(linear, group_size)
    weight = packed.dequantize().float()
    x = torch.randn(5, 3, 128)
    out = packed(x)
    assert out.dtype == torch.float32 and out.shape == (5, 3, 48)
    expected = x @ weight.T + linear.bias
    torch.testing.assert_close(out, expected, atol=0.05, rtol=0.02)  # bfloat16 activations
    # min/max per group, 16 levels: every weight within half a step (plus bfloat16 rounding) of the original
    groups = linear.weight.detach().reshape(48, -1, group_size)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    error = (weight - linear.weight.detach()).abs().reshape(48, -1, group_size)
    assert (error <= step[..., None] * 0.51 + BF16_STEP * 3).all()
    assert not torch.equal(weight, linear.weight.detach())  # it really is quantised


def test_int4_codes_cover_the_range_of_each_group():
    codes, _, _ = quantize_int4(_linear().weight.detach(), 32)
    per_group = codes.reshape(48, -1, 32)
    assert codes.min() == 0 and codes.max() == 15
    assert (per_group.amin(-1) <= 1).all() and (per_group.amax(-1) >= 14).all()


def test_int8_layer_computes_with_its_dequantised_weight():
    linear = _linear()
    packed = Int8Linear.from_float(linear)
    weight = packed.dequantize()
    assert packed.weight.dtype == torch.int8 and packed.weight.abs().amax(dim=1).eq(127).all()
    torch.testing.assert_close(weight, linear.weight.detach(), atol=linear.weight.abs().max().item() / 127, rtol=0)
    x = torch.randn(4, 128)
    torch.testing.assert_close(packed(x), x @ weight.T + linear.bias, atol=0.05, rtol=0.02)


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_q4_blocks_decode_to_exactly_what_gguf_dequantises(kind):
    blocks, reference = _gguf_blocks(kind)
    codes, scales, zeros = decode_q4_blocks(blocks, kind)
    assert codes.shape == (32, 128) and scales.shape == zeros.shape == (32, 4)
    assert codes.min() >= 0 and codes.max() <= 15
    weight = ((codes.float() - 8).reshape(32, 4, 32) * scales[..., None] + zeros[..., None]).reshape(32, 128)
    torch.testing.assert_close(weight, reference, atol=1e-6, rtol=0)
    if kind == "Q4_0":
        assert (zeros == 0).all()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
def test_q4_blocks_packed_give_gguf_weights_up_to_bfloat16_scales(kind):
    blocks, reference = _gguf_blocks(kind)
    packed = Int4Linear.from_gguf_blocks(blocks, kind)
    codes, scales, zeros = decode_q4_blocks(blocks, kind)
    # the kernel keeps scale and zero in bfloat16: this is the weight it must compute with
    bf16 = scales.bfloat16().float()[..., None], zeros.bfloat16().float()[..., None]
    expected = ((codes.float() - 8).reshape(32, 4, 32) * bf16[0] + bf16[1]).reshape(32, 128)
    torch.testing.assert_close(packed.dequantize().float(), expected, atol=1e-6, rtol=BF16_STEP)
    bound = BF16_STEP * (8 * scales.abs() + zeros.abs()).repeat_interleave(32, dim=1) + BF16_STEP * reference.abs()
    assert ((packed.dequantize().float() - reference).abs() <= bound).all()


def test_row_order_moves_whole_rows_with_their_scales():
    blocks, reference = _gguf_blocks("Q4_1")
    order = torch.randperm(32, generator=torch.Generator().manual_seed(3))
    plain = Int4Linear.from_gguf_blocks(blocks, "Q4_1").dequantize()
    moved = Int4Linear.from_gguf_blocks(blocks, "Q4_1", row_order=order).dequantize()
    assert torch.equal(moved, plain[order])
    assert not torch.equal(moved, plain)


def test_q8_blocks_become_int8_rows_close_to_gguf():
    blocks, reference = _gguf_blocks("Q8_0")
    packed = Int8Linear.from_gguf_blocks(blocks)
    row_step = reference.abs().amax(dim=1, keepdim=True) / 127
    assert ((packed.dequantize() - reference).abs() <= row_step * 0.51 + BF16_STEP * reference.abs()).all()
