"""The native CPU kernels compute what their torch formulas compute; block layers hold GGUF's blocks exactly."""

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine import Engine, EngineConfig
from engine.serving.kv_cache import KVCache, KVShape
from engine.serving.kv_format import FORMATS
from engine.step import kernels
from engine.step.attention import SequenceSlice, build_metadata
from engine.step.block_linear import BlockQuantLinear, fuse, quantize_q4_1, quantize_q8_0
from engine.step.lean_decoder import _rotate, lean_decoder_for
from engine.step.native_decoder import NativeDecoder

# Where a C++ compiler exists (every test machine here) the kernels must build: a failed build fails these tests
# rather than skipping them.
NO_COMPILER = sys.platform == "win32" or not any(shutil.which(c) for c in ("c++", "g++", "clang++"))
pytestmark = pytest.mark.skipif(NO_COMPILER, reason="no C++ compiler to build the native kernels with")


def test_the_kernels_build_and_load():
    assert kernels.available(), kernels.status().detail
    assert kernels.status().detail == kernels.flavour().name


@pytest.mark.slow
@pytest.mark.parametrize("flavour", [f.name for f in kernels.SIMD_FLAVOURS[1:]])
def test_the_slower_flavours_compute_the_same(flavour):
    """The AVX2 and plain C++ builds (what CPUs without AVX-512 VNNI, or without AVX2, run) pass the exactness
    tests too, each in a process of its own: one build of the kernels loads per process."""
    if flavour not in [f.name for f in kernels.runnable_flavours()]:
        pytest.skip(f"this CPU does not run the {flavour} flavour")
    checks = "build or exact or rounded or equals_its_formula or held_exactly or float_linear"
    command = [sys.executable, "-m", "pytest", __file__, "-q", "-x", "-k", checks, "-p", "no:cacheprovider"]
    done = subprocess.run(command, env={**os.environ, kernels.FLAVOUR_ENV: flavour}, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "deselected" in done.stdout
ops = torch.ops.kvasir_kernels
CPU = torch.device("cpu")


def _round_away(x: torch.Tensor) -> torch.Tensor:
    """C's round(): halves away from zero (torch.round rounds them to even)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def _reference_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T with x quantised to int8 per 32 values, as llama.cpp and the kernels do (float64 sums)."""
    rows, cols = x.shape
    groups = x.reshape(rows, cols // 32, 32)
    d = groups.abs().amax(-1, keepdim=True) / 127
    codes = torch.where(d > 0, _round_away(groups / d.clamp(min=1e-30)), 0.0)
    return (codes * d).reshape(rows, cols).double() @ weight.double().t()


@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
@pytest.mark.parametrize("rows", [1, 3, 4, 9])
@pytest.mark.parametrize("outputs", [80, 21])  # whole groups of eight rows, and a padded last group
def test_block_linear_equals_its_formula(kind, rows, outputs):
    torch.manual_seed(rows)
    layer = BlockQuantLinear.from_float(torch.randn(outputs, 96), kind, bias=torch.randn(outputs))
    x = torch.randn(2, rows, 96)
    weight = layer.dequantize()
    got = layer(x)
    want = _reference_linear(x.reshape(-1, 96), weight).float().reshape(2, rows, outputs) + layer.bias
    assert got.shape == (2, rows, outputs)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # and the activation rounding is the only difference from a float matmul: under 1% of the output's size
    exact = x @ weight.t() + layer.bias
    assert float((got - exact).norm() / exact.norm()) < 0.01


def _exact_blocks(kind: str, outputs: int, blocks: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """GGUF-ordered ``kind`` blocks and the float64 weights they hold, with power-of-two scales, so that every
    product and sum the kernel forms is exact in float32."""
    g = torch.Generator().manual_seed(seed)
    d = 2.0 ** -torch.randint(2, 5, (outputs, blocks), generator=g).double()
    if kind == "q8_0":
        codes = torch.randint(-128, 128, (outputs, blocks, 32), generator=g)  # -128 too: a file may hold it
        weight = d[..., None] * codes
        raw = [_as_bytes(d.half()), codes.to(torch.int8).view(torch.uint8)]
    else:
        codes = torch.randint(0, 16, (outputs, blocks, 32), generator=g)
        m = -d * torch.randint(0, 9, (outputs, blocks), generator=g)
        weight = d[..., None] * codes + m[..., None]
        scale_type = torch.float16 if kind == "q4_1" else torch.float32
        nibbles = (codes[..., :16] | (codes[..., 16:] << 4)).to(torch.uint8)
        raw = [_as_bytes(d.to(scale_type)), _as_bytes(m.to(scale_type)), nibbles]
    return torch.cat(raw, dim=-1).reshape(outputs, -1), weight.reshape(outputs, -1)


def _as_bytes(values: torch.Tensor) -> torch.Tensor:
    return values.contiguous().view(torch.uint8).reshape(*values.shape, -1)


@pytest.mark.parametrize("in_features, out_features", [(576, 1536), (13, 7), (64, 9), (1000, 41)])
def test_float_linear_equals_its_formula(in_features, out_features):
    """Float32 rows times a float32 weight (and bias) within float32's rounding of a float64 sum, for inputs
    that are and are not a multiple of the eight lanes, output counts that do and do not fill the groups of four
    weight rows, and every row count up to past the tiles (three rows, six in the AVX-512 build) and their
    remainders."""
    assert kernels.available(), kernels.status().detail
    g = torch.Generator().manual_seed(in_features)
    weight = torch.randn(out_features, in_features, generator=g)
    bias = torch.randn(out_features, generator=g)
    for rows in [*range(1, 11), 16, 17]:
        x = torch.randn(rows, in_features, generator=g)
        want = x.double() @ weight.double().t() + bias.double()
        got = ops.float_linear(x, weight, bias)
        # each output: a float32 sum of in_features products, so its error is bounded by in_features ulps of
        # the sum of the products' sizes
        bound = (x.double().abs() @ weight.double().abs().t() + bias.double().abs()) * in_features * 2 ** -24
        assert got.dtype == torch.float32 and got.shape == (rows, out_features)
        assert bool(((got.double() - want).abs() <= bound).all()), f"{rows} rows"
        assert torch.allclose(got, F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)
    assert torch.equal(ops.float_linear(x, weight, None) + bias, got)


def test_float_linear_is_exact_for_every_row_count():
    """A row's outputs are the same bits alone and beside any number of other rows (decode and a speculative
    check compute the same)."""
    assert kernels.available(), kernels.status().detail
    g = torch.Generator().manual_seed(7)
    weight = torch.randn(45, 203, generator=g)
    x = torch.randn(17, 203, generator=g)
    alone = torch.cat([ops.float_linear(x[i:i + 1], weight, None) for i in range(17)])
    for rows in range(1, 18):
        assert torch.equal(ops.float_linear(x[:rows], weight, None), alone[:rows]), f"{rows} rows"


def test_float_linear_refuses_what_it_cannot_multiply():
    assert kernels.available(), kernels.status().detail
    with pytest.raises(RuntimeError, match="must agree"):
        ops.float_linear(torch.zeros(2, 8), torch.zeros(3, 9), None)
    with pytest.raises(RuntimeError, match="float32 only"):
        ops.float_linear(torch.zeros(2, 8, dtype=torch.float64), torch.zeros(3, 8, dtype=torch.float64), None)


def _exact_activations(rows: int, blocks: int, seed: int) -> torch.Tensor:
    """Rows whose 8-bit quantisation is exact: integers times a power of two, with +-127 in every block."""
    g = torch.Generator().manual_seed(seed)
    ints = torch.randint(-127, 128, (rows, blocks, 32), generator=g)
    ints[..., 0] = 127 * (torch.randint(0, 2, (rows, blocks), generator=g) * 2 - 1)
    return (ints * 2.0 ** -torch.randint(1, 4, (rows, 1, 1), generator=g).double()).reshape(rows, -1)


@pytest.mark.parametrize("kind", ["q4_1", "q4_1f", "q8_0"])
@pytest.mark.parametrize("outputs", [40, 21])
def test_block_linear_is_exact_for_every_row_count(kind, outputs):
    """Each tile of activation rows (1..8 at once) and their remainders give the integer arithmetic's exact
    result, for whole and padded groups of eight outputs."""
    blocks = 5
    raw, weight = _exact_blocks(kind, outputs, blocks, seed=outputs)
    layer = BlockQuantLinear.from_blocks(kind, blocks * 32, raw)
    for rows in [*range(1, 18), 33, 64]:
        x = _exact_activations(rows, blocks, seed=rows)
        want = (x @ weight.t()).float()
        got = layer(x.float())
        assert torch.equal(got, want), f"{kind}, {rows} rows: off by {float((got - want).abs().max())}"


def test_activations_are_rounded_to_8_bits_as_c_rounds():
    """Through an identity Q8_0 layer each output is d * q: the activation codes themselves, halves rounded away
    from zero (llama.cpp's roundf), for random values and for exact halves."""
    features = 64
    codes = torch.eye(features, dtype=torch.int8).view(torch.uint8).reshape(features, 2, 32)
    one = torch.ones(features, 2, dtype=torch.float16).view(torch.uint8).reshape(features, 2, 2)
    identity = BlockQuantLinear.from_blocks("q8_0", features, torch.cat([one, codes], -1).reshape(features, -1))
    torch.manual_seed(6)
    halves = (torch.randint(-127, 127, (5, features)) + 0.5) / 8
    halves[:, ::32] = 127 / 8  # scale 1/8 exactly: every value times 8 is an exact half
    x = torch.cat([torch.randn(11, features) * torch.rand(11, 1) * 10, halves, torch.zeros(1, features)])
    blocks = x.reshape(len(x), 2, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    inverse = torch.where(d > 0, 1 / d, torch.zeros(()))
    want = (_round_away(blocks * inverse) * d).reshape(len(x), features)
    assert torch.equal(identity(x), want)


@pytest.mark.parametrize("kind, encode", [("q4_1", quantize_q4_1), ("q8_0", quantize_q8_0)])
def test_fine_activations_are_rounded_a_hundred_times_finer(kind, encode):
    """With fine activations a block layer's output is its float formula over the unrounded activations to
    within the remainder's own 8-bit rounding: a hundredth of the 8-bit rounding's error, give or take."""
    torch.manual_seed(8)
    layer = BlockQuantLinear.from_blocks(kind, 256, encode(torch.randn(64, 256)))
    x = torch.randn(3, 256) * torch.logspace(-2, 1, 256)  # blocks of different ranges
    remainder = ops.activation_remainder(x)
    step = x.reshape(3, 8, 32).abs().amax(-1, keepdim=True) / 127
    assert bool((remainder.reshape(3, 8, 32).abs() <= step * 0.5 * 1.0001).all())  # what rounding to a step leaves
    assert remainder.abs().amax() > 0
    exact = x.double() @ layer.dequantize().double().t()
    rounded, fine = (layer(x) - exact).abs().amax(), (layer(x, fine_activations=True) - exact).abs().amax()
    assert fine < rounded / 30, (float(fine), float(rounded))


@pytest.mark.parametrize("kind, encode, max_step", [("q4_1", quantize_q4_1, 15), ("q8_0", quantize_q8_0, 254)])
def test_quantising_float_weights_is_within_half_a_step(kind, encode, max_step):
    torch.manual_seed(0)
    weight = torch.randn(48, 64) * torch.linspace(0.01, 3, 48)[:, None]  # rows of very different ranges
    layer = BlockQuantLinear.from_blocks(kind, 64, encode(weight))
    groups = weight.reshape(48, 2, 32)
    step = (groups.amax(-1) - groups.amin(-1)) / max_step if kind == "q4_1" else groups.abs().amax(-1) / 127
    error = (layer.dequantize() - weight).abs().reshape(48, 2, 32).amax(-1)
    assert bool((error <= step * 0.5 * 1.01 + 1e-6).all())


@pytest.mark.parametrize("ggml_type", ["Q4_0", "Q4_1", "Q8_0"])
def test_gguf_blocks_are_used_as_they_are(ggml_type):
    from gguf import GGMLQuantizationType, dequantize, quantize

    rng = np.random.default_rng(1)
    weight = rng.standard_normal((32, 64)).astype(np.float32)
    qtype = GGMLQuantizationType[ggml_type]
    blocks = quantize(weight, qtype)
    layer = BlockQuantLinear.from_gguf(blocks, ggml_type)
    assert layer.kind == ("q8_0" if ggml_type == "Q8_0" else "q4_1")
    np.testing.assert_array_equal(layer.dequantize().numpy(), dequantize(blocks, qtype))
    order = torch.from_numpy(rng.permutation(32))
    moved = BlockQuantLinear.from_gguf(blocks, ggml_type, row_order=order)
    torch.testing.assert_close(moved.dequantize(), layer.dequantize()[order], rtol=0, atol=0)


def test_q4_k_blocks_are_held_exactly():
    from gguf import GGMLQuantizationType, dequantize

    rng = np.random.default_rng(3)
    rows, supers = 16, 2  # 16 x 512 weights
    d = (rng.random((rows, supers, 1)) * 0.01).astype(np.float16).view(np.uint8)
    dmin = (rng.random((rows, supers, 1)) * 0.01).astype(np.float16).view(np.uint8)
    rest = rng.integers(0, 256, (rows, supers, 140), dtype=np.uint8)  # every bit pattern of scales and codes
    blocks = np.concatenate([d, dmin, rest], axis=-1).reshape(rows, -1)
    layer = BlockQuantLinear.from_gguf(blocks, "Q4_K")
    assert layer.kind == "q4_1f" and layer.in_features == 512
    want = dequantize(blocks, GGMLQuantizationType.Q4_K)
    np.testing.assert_array_equal(layer.dequantize().numpy(), want)
    x = torch.randn(3, 512)
    torch.testing.assert_close(layer(x), _reference_linear(x, torch.from_numpy(want)).float(), rtol=1e-4, atol=1e-4)


def test_fused_layers_share_their_blocks():
    torch.manual_seed(2)
    parts = [BlockQuantLinear.from_float(torch.randn(n, 64), "q4_1", torch.randn(n)) for n in (64, 32, 32)]
    x = torch.randn(5, 64)
    separate = torch.cat([p(x) for p in parts], dim=-1)
    fused = fuse(parts)
    torch.testing.assert_close(fused(x), separate, rtol=0, atol=0)
    start = fused.blocks.untyped_storage().data_ptr()
    assert all(p.blocks.untyped_storage().data_ptr() == start for p in parts)  # views, not copies
    torch.testing.assert_close(torch.cat([p(x) for p in parts], dim=-1), separate, rtol=0, atol=0)
    with pytest.raises(ValueError):
        fuse([parts[0], BlockQuantLinear.from_float(torch.randn(32, 64), "q8_0")])


def test_bad_inputs_are_refused_in_words():
    layer = BlockQuantLinear.from_float(torch.randn(32, 64), "q4_1")
    with pytest.raises(RuntimeError, match="features"):
        ops.q4_1_linear(torch.randn(2, 32), layer.blocks, 64, 32)
    with pytest.raises(RuntimeError, match="weight blocks"):
        ops.q4_1_linear(torch.randn(2, 64), layer.blocks, 64, 48)
    with pytest.raises(ValueError, match="blocks"):
        BlockQuantLinear.from_blocks("q4_1", 96, quantize_q4_1(torch.randn(32, 64)))
    with pytest.raises(ValueError, match="blocks"):
        BlockQuantLinear("q4_1", 64, 40, layer.blocks)


def test_norms_and_activation_equal_their_formulas():
    torch.manual_seed(3)
    x, residual, weight = torch.randn(7, 96), torch.randn(7, 96), torch.randn(96)

    def rms(v):
        return weight * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-5))

    torch.testing.assert_close(ops.rms_norm(x, weight, 1e-5), rms(x), rtol=1e-5, atol=1e-5)
    expected_residual = residual + x
    normed = ops.add_rms_norm_(residual, x, weight, 1e-5)
    torch.testing.assert_close(residual, expected_residual, rtol=0, atol=0)  # added in place
    torch.testing.assert_close(normed, rms(expected_residual), rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(7, 64)
    torch.testing.assert_close(ops.silu_mul(gate_up), F.silu(gate_up[:, :32]) * gate_up[:, 32:], rtol=1e-5, atol=1e-6)


def test_rotary_equals_transformers_formula():
    torch.manual_seed(4)
    tokens, heads, kv_heads, dim = 5, 4, 2, 16
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim)
    angles = torch.rand(tokens, dim // 2) * 6
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    q = qkv[:, : heads * dim].reshape(tokens, heads, dim).transpose(0, 1)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].reshape(tokens, kv_heads, dim).transpose(0, 1)
    want_q, want_k = _rotate(q, k, cos, sin)
    values = qkv[:, (heads + kv_heads) * dim :].clone()
    ops.rotary_qk_(qkv, heads, kv_heads, cos, sin)
    torch.testing.assert_close(qkv[:, : heads * dim], want_q.transpose(0, 1).reshape(tokens, -1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(qkv[:, heads * dim : (heads + kv_heads) * dim],
                               want_k.transpose(0, 1).reshape(tokens, -1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(qkv[:, (heads + kv_heads) * dim :], values, rtol=0, atol=0)  # values untouched


def test_paged_decode_attention_equals_sdpa_over_each_sequences_blocks():
    torch.manual_seed(5)
    blocks, block_size, kv_heads, heads, dim = 12, 4, 2, 6, 8
    keys, values = torch.randn(blocks, block_size, kv_heads, dim), torch.randn(blocks, block_size, kv_heads, dim)
    tables = torch.tensor([[7, 2, 9, 0], [3, 11, 0, 0], [5, 0, 0, 0]])
    lengths = torch.tensor([14, 6, 1])
    query = torch.randn(3, heads * dim)
    none = torch.empty(0, dtype=torch.float16)  # a float32 cache has no scales
    got = ops.paged_decode_attention(query, keys, values, none, none, tables, lengths, heads, 0.3)
    for b in range(3):
        k = keys[tables[b]].reshape(-1, kv_heads, dim)[: lengths[b]].repeat_interleave(heads // kv_heads, 1)
        v = values[tables[b]].reshape(-1, kv_heads, dim)[: lengths[b]].repeat_interleave(heads // kv_heads, 1)
        q = query[b].view(heads, 1, dim)
        want = F.scaled_dot_product_attention(q, k.transpose(0, 1), v.transpose(0, 1), scale=0.3)
        torch.testing.assert_close(got[b], want.reshape(-1), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="length"):
        ops.paged_decode_attention(query, keys, values, none, none, tables, torch.tensor([14, 6, 17]), heads, 0.3)


@pytest.mark.parametrize(("name", "dim"), [("float32", 64), ("float32", 12), ("float16", 96), ("bfloat16", 64),
                                         ("q8_0", 96)])
@pytest.mark.parametrize("group", [1, 3, 4, 5])
def test_a_drafted_runs_rows_are_attended_exactly_as_each_row_alone(name, dim, group):
    """Rows that continue one sequence (its last token and each draft, one position longer each) are attended
    together, each key read once for all of them: every row's output is bit for bit what it gets alone, and
    SDPA's within float32 rounding. The runs cross an eight-position boundary and a 128-position tile of values;
    a one-row sequence sits between them. ``group`` query heads share a kv head: the kernel takes up to three of
    them at a time over the same keys and values, so 4 and 5 leave one and two over."""
    torch.manual_seed(11)
    blocks, block_size, kv_heads = 24, 16, 2
    heads = kv_heads * group
    cache = KVCache(KVShape(1, kv_heads, dim, torch.float32, FORMATS[name]), blocks, block_size, CPU)
    cache.write(0, torch.arange(blocks * block_size), torch.randn(blocks * block_size, kv_heads, dim),
                torch.randn(blocks * block_size, kv_heads, dim))
    long_run, short_run = [3, 17, 5, 9, 21, 0, 12, 7, 1, 2], [11, 4, 0, 0, 0, 0, 0, 0, 0, 0]
    tables = torch.tensor([long_run] * 6 + [[8] + [0] * 9] + [short_run] * 3)
    lengths = torch.tensor([131, 132, 133, 134, 135, 136, 5, 7, 8, 9])
    query = torch.randn(len(lengths), heads * dim)
    scales = (cache.key_scales[0], cache.value_scales[0]) if cache.key_scales else (torch.empty(0),) * 2
    together = ops.paged_decode_attention(query, cache.keys[0], cache.values[0], *scales, tables, lengths, heads, 0.3)
    for row in range(len(lengths)):
        alone = ops.paged_decode_attention(query[row : row + 1], cache.keys[0], cache.values[0], *scales,
                                           tables[row : row + 1], lengths[row : row + 1], heads, 0.3)
        assert torch.equal(together[row], alone[0]), f"row {row} differs from the row attended alone"
    keys, values = cache.read(0, slice(0, blocks))
    for row in range(6):
        length = int(lengths[row])
        k = keys[tables[row]].reshape(-1, kv_heads, dim)[:length].repeat_interleave(group, 1)
        v = values[tables[row]].reshape(-1, kv_heads, dim)[:length].repeat_interleave(group, 1)
        want = F.scaled_dot_product_attention(query[row].view(heads, 1, dim), k.transpose(0, 1), v.transpose(0, 1),
                                              scale=0.3)
        torch.testing.assert_close(together[row], want.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("name", "dim"), [("float32", 64), ("float16", 96), ("bfloat16", 64), ("float16", 48)])
def test_a_lone_long_row_shared_among_threads_is_attended_as_in_a_batch(name, dim):
    """A single sequence's row over a long context (past the 1,024 positions from which the kernel shares one row
    out among the threads by positions and features instead of by kv heads) gets the same bits as beside another
    sequence, which is shared out by sequence; and SDPA's result within float32 rounding. Three query heads per kv
    head (two attended together, one alone), and a head size of 48 that the shared path does not take."""
    assert kernels.available(), kernels.status().detail
    torch.manual_seed(12)
    blocks, block_size, kv_heads, heads = 100, 16, 3, 9
    cache = KVCache(KVShape(1, kv_heads, dim, torch.float32, FORMATS[name]), blocks, block_size, CPU)
    cache.write(0, torch.arange(blocks * block_size), torch.randn(blocks * block_size, kv_heads, dim),
                torch.randn(blocks * block_size, kv_heads, dim))
    order = torch.randperm(blocks)
    tables = torch.stack([order[:96], order[4:100]])
    none = torch.empty(0, dtype=torch.float16)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # one thread takes the path a lone row takes in a batch
    try:
        _compare_alone_and_beside(cache, tables, none, heads, kv_heads, dim, blocks)
    finally:
        torch.set_num_threads(threads)


def _compare_alone_and_beside(cache, tables, none, heads, kv_heads, dim, blocks):
    for length in (1029, 1531):
        lengths = torch.tensor([length, 1200])
        query = torch.randn(2, heads * dim)
        alone = ops.paged_decode_attention(query[:1], cache.keys[0], cache.values[0], none, none, tables[:1],
                                           lengths[:1], heads, 0.125)
        beside = ops.paged_decode_attention(query, cache.keys[0], cache.values[0], none, none, tables, lengths, heads,
                                            0.125)
        assert torch.equal(alone[0], beside[0]), f"{length} positions"
        keys, values = cache.read(0, slice(0, blocks))
        k = keys[tables[0]].reshape(-1, kv_heads, dim)[:length].float().repeat_interleave(heads // kv_heads, 1)
        v = values[tables[0]].reshape(-1, kv_heads, dim)[:length].float().repeat_interleave(heads // kv_heads, 1)
        want = F.scaled_dot_product_attention(query[0].view(heads, 1, dim), k.transpose(0, 1), v.transpose(0, 1),
                                              scale=0.125)
        torch.testing.assert_close(alone[0], want.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
@torch.inference_mode()
def test_native_step_matches_the_lean_step_on_the_same_blocks(tiny_model_dirs, arch):
    engine = Engine(EngineConfig(model=str(tiny_model_dirs[arch]), num_kv_blocks=16, quantization="int4"))
    runner = engine.runner
    assert isinstance(runner.lean, NativeDecoder)
    lean = lean_decoder_for(engine.loaded.model)
    ids = torch.tensor(engine.encode_prompt("native kernels against the lean decoder, prefill and decode"))
    n = len(ids)
    for step, slices, rows in [
        ("prefill", [SequenceSlice(0, 0, n - 1, [3, 4])], [n // 2, n - 2]),
        ("decode", [SequenceSlice(0, n - 1, n, [3, 4])], [0]),
    ]:
        step_ids = ids[: n - 1] if step == "prefill" else ids[n - 1 :]
        results = []
        for decoder in (runner.lean, lean):
            meta = build_metadata(runner.kv_cache, slices, runner.device, "torch", torch.float32)
            results.append(decoder(step_ids, meta, torch.tensor(rows)))
        native, reference = results
        assert native.shape == (len(rows), engine.loaded.model.config.vocab_size)
        # the same arithmetic in another order; activations rounded to 8 bits can move by one step
        assert float((native - reference).abs().max()) < 0.02 * float(reference.abs().max())
        assert native.argmax(-1).tolist() == reference.argmax(-1).tolist()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@torch.inference_mode()
def test_one_call_decode_step_equals_the_layer_by_layer_step(tiny_model_dirs, arch):
    engine = Engine(EngineConfig(model=str(tiny_model_dirs[arch]), num_kv_blocks=16, quantization="int4"))
    native = engine.runner.lean
    assert native._one_call
    prompts = [engine.encode_prompt(text) for text in ("a first sequence of words", "and a second, longer one here")]
    for prompt, table in zip(prompts, ([1, 2], [5, 6])):  # fill the cache with each prompt but its last token
        meta = build_metadata(engine.runner.kv_cache, [SequenceSlice(0, 0, len(prompt) - 1, table)], engine.device,
                              "torch", torch.float32)
        native(torch.tensor(prompt[:-1]), meta, torch.tensor([0]))
    step = [SequenceSlice(0, len(prompts[0]) - 1, len(prompts[0]), [1, 2]),
            SequenceSlice(1, len(prompts[1]) - 1, len(prompts[1]), [5, 6])]
    ids = torch.tensor([prompts[0][-1], prompts[1][-1]])
    results = {}
    for fine in (False, True):  # fine activations (a draft model's for a float serving model) in both paths too
        native.fine_activations = fine
        for one_call in (True, False):
            native._one_call = one_call
            meta = build_metadata(engine.runner.kv_cache, step, engine.device, "torch", torch.float32)
            results[fine, one_call] = native(ids, meta, torch.tensor([0, 1]))
        torch.testing.assert_close(results[fine, True], results[fine, False], rtol=1e-5, atol=1e-5)
    assert (results[False, True] - results[True, True]).abs().amax() > 1e-3  # the two roundings differ
