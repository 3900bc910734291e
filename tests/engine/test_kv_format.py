"""The KV cache's stored formats: the rounding rule of each, the cache reading back what it wrote, the native
kernels reading and writing the same bytes as torch, the choice ``auto`` makes, and greedy parity with
transformers' ``generate`` whose attention reads keys and values rounded the same way."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from engine import Engine, EngineConfig, SamplingParams
from engine.serving import kv_format
from engine.serving.kv_cache import KVCache, KVShape
from engine.serving.kv_format import FORMATS, choose_kv_format, decode, draft_kv_format, encode
from engine.step import kernels
from engine.step.attention import SequenceSlice, build_metadata
from engine.step.native_decoder import NativeDecoder
from tests.engine.test_parity import chat_prompts
from tests.helpers.oracle import load_reference, reference_greedy
from tests.helpers.tiny_models import ARCHITECTURES, write_tiny_model

CPU = torch.device("cpu")
CPU_FORMATS = ("float32", "bfloat16", "float16", "q8_0")
STORED_FORMATS = (*CPU_FORMATS, "fp8")  # fp8 is served on CUDA only, but the cache stores it anywhere


# -- the rounding rules ------------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(arrays("float32", (3, 64), elements=st.floats(-1e4, 1e4, width=32)))
def test_q8_0_keeps_each_value_within_half_a_step_of_its_groups_scale(values):
    x = torch.from_numpy(values)
    quants, scales = kv_format.quantize_q8_0(x)
    assert quants.dtype == torch.int8 and scales.dtype == torch.float16 and scales.shape == (3, 2)
    back = kv_format.dequantize_q8_0(quants, scales, torch.float32)
    step = x.unflatten(-1, (2, 32)).abs().amax(-1) / 127  # each group's scale before float16 rounding
    # half a step from rounding to an integer, plus 127 times the scale's float16 rounding: 2^-11 of it, or 2^-25
    # where it is below float16's normal range (as in llama.cpp's q8_0, tiny groups lose their relative precision)
    scale_error = torch.maximum(step * 2**-11, torch.full_like(step, 2**-25))
    bound = (step * 0.5 + 127 * scale_error + 1e-12).repeat_interleave(32, -1)
    assert bool(((back - x).abs() <= bound).all())
    assert int(quants.abs().max()) <= 127


def test_q8_0_of_an_all_zero_group_is_zero_and_its_largest_value_is_exact_to_its_scale():
    x = torch.zeros(64)
    x[40] = -3.0
    quants, scales = kv_format.quantize_q8_0(x)
    assert scales[0] == 0 and not quants[:32].any()
    assert quants[40] == -127 and float(scales[1]) == pytest.approx(3.0 / 127, rel=2**-11)


def test_float_formats_round_as_torch_does_and_fp8_saturates():
    x = torch.tensor([1.0 + 2**-9, -70000.0, 1e-3, 1000.0])
    for name in ("bfloat16", "float16"):
        stored, scales = encode(FORMATS[name], x)
        assert scales is None and torch.equal(stored, x.to(FORMATS[name].storage))
    fp8, _ = encode(FORMATS["fp8"], x)
    assert decode(FORMATS["fp8"], fp8, None, torch.float32).tolist()[1::2] == [-448.0, 448.0]


def test_bytes_per_token_of_each_format():
    per_token = {name: KVShape(30, 3, 64, torch.float32, FORMATS[name]).bytes_per_token() for name in FORMATS}
    assert per_token["float32"] == 2 * 30 * 3 * 64 * 4
    assert per_token["bfloat16"] == per_token["float16"] == per_token["float32"] // 2
    assert per_token["q8_0"] == 2 * 30 * 3 * (64 + 2 * 2)  # 34 bytes per 32 values, as llama.cpp's q8_0
    assert per_token["fp8"] == per_token["float32"] // 4


# -- which format a model gets -----------------------------------------------------------------------------------


def test_auto_takes_the_smallest_measured_format_the_model_and_device_can_hold():
    f32 = torch.float32
    assert choose_kv_format("auto", f32, 64, CPU, None)[0].name == "float32"  # nothing measured: exact
    assert choose_kv_format("auto", f32, 64, CPU, frozenset({"bfloat16", "q8_0"}))[0].name == "q8_0"
    assert choose_kv_format("auto", f32, 48, CPU, frozenset({"bfloat16", "q8_0"}))[0].name == "bfloat16"
    assert choose_kv_format("auto", f32, 64, CPU, frozenset({"fp8"}))[0].name == "float32"  # fp8 is CUDA's
    assert choose_kv_format("auto", torch.bfloat16, 64, CPU, frozenset({"float16"}))[0].name == "bfloat16"
    fmt, reason = choose_kv_format("q8_0", f32, 64, CPU, None)
    assert fmt.name == "q8_0" and reason == "chosen in the settings"


def test_a_draft_models_cache_is_at_most_16_bits_and_the_serving_format_where_the_heads_agree():
    f32, f16 = torch.float32, FORMATS["float16"]
    assert draft_kv_format(FORMATS["float32"], 64, 64, f32) == f16  # an exact target's: its draft need not be
    assert draft_kv_format(FORMATS["q8_0"], 64, 64, f32) == FORMATS["q8_0"]
    assert draft_kv_format(FORMATS["bfloat16"], 64, 64, f32) == FORMATS["bfloat16"]
    assert draft_kv_format(FORMATS["q8_0"], 64, 48, f32) == f16  # another head size: q8_0 was not checked there
    assert draft_kv_format(FORMATS["q8_0"], 64, 48, torch.bfloat16) == FORMATS["bfloat16"]


@pytest.mark.parametrize("wanted, head_dim, problem", [("fp8", 64, "CUDA only"), ("q8_0", 48, "head size is 48")])
def test_a_format_that_cannot_hold_the_model_is_refused_in_words(wanted, head_dim, problem):
    with pytest.raises(ValueError, match=problem):
        choose_kv_format(wanted, torch.float32, head_dim, CPU, None)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        EngineConfig(kv_cache_dtype="q4_0")


# -- the cache and the kernels -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", STORED_FORMATS)
def test_the_cache_reads_back_what_the_format_stores(name):
    fmt = FORMATS[name]
    cache = KVCache(KVShape(2, 2, 64, torch.float32, fmt), 6, 4, CPU)
    key, value = torch.randn(5, 2, 64), torch.randn(5, 2, 64) * 30
    slots = torch.tensor([3, 8, 9, 17, 22])
    cache.write(1, slots, key, value)
    keys, values = cache.read(1, torch.tensor([0, 2, 4, 5]))
    assert keys.dtype == torch.float32 and keys.shape == (4, 4, 2, 64)
    flat_k, flat_v = keys.flatten(0, 1), values.flatten(0, 1)
    rows = [3, 8 - 4, 9 - 4, 17 - 8, 22 - 8]  # the slots' rows among blocks 0, 2, 4, 5
    torch.testing.assert_close(flat_k[rows], decode(fmt, *encode(fmt, key), torch.float32), rtol=0, atol=0)
    torch.testing.assert_close(flat_v[rows], decode(fmt, *encode(fmt, value), torch.float32), rtol=0, atol=0)
    assert not cache.read(0, slice(0, 6))[0].any()  # another layer untouched


needs_kernels = pytest.mark.skipif(not kernels.available(), reason="native kernels unavailable")


@needs_kernels
@pytest.mark.parametrize("name", CPU_FORMATS)
def test_native_decode_attention_reads_each_format_as_the_cache_does(name):
    torch.manual_seed(3)
    blocks, block_size, kv_heads, heads, dim = 12, 4, 2, 6, 64
    cache = KVCache(KVShape(1, kv_heads, dim, torch.float32, FORMATS[name]), blocks, block_size, CPU)
    cache.write(0, torch.arange(blocks * block_size), torch.randn(blocks * block_size, kv_heads, dim),
                torch.randn(blocks * block_size, kv_heads, dim))
    tables = torch.tensor([[7, 2, 9, 0], [3, 11, 0, 0], [5, 0, 0, 0]])
    lengths = torch.tensor([14, 6, 1])
    query = torch.randn(3, heads * dim)
    scales = (cache.key_scales[0], cache.value_scales[0]) if cache.key_scales else (torch.empty(0),) * 2
    got = torch.ops.kvasir_kernels.paged_decode_attention(query, cache.keys[0], cache.values[0], *scales, tables,
                                                          lengths, heads, 0.125)
    keys, values = cache.read(0, slice(0, blocks))
    for b in range(3):
        k = keys[tables[b]].reshape(-1, kv_heads, dim)[: lengths[b]].repeat_interleave(heads // kv_heads, 1)
        v = values[tables[b]].reshape(-1, kv_heads, dim)[: lengths[b]].repeat_interleave(heads // kv_heads, 1)
        want = F.scaled_dot_product_attention(query[b].view(heads, 1, dim), k.transpose(0, 1), v.transpose(0, 1),
                                              scale=0.125)
        torch.testing.assert_close(got[b], want.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def wide_models(tmp_path_factory, tokenizer_dir):
    """Tiny models with 32-value heads (q8_0's group), one per architecture."""
    root = tmp_path_factory.mktemp("wide-models")
    return {arch: write_tiny_model(arch, root / arch, tokenizer_dir, hidden_size=128, intermediate_size=256,
                                   **({} if arch in ("phi3", "qwen3") else {"head_dim": 32}))
            for arch in ARCHITECTURES}


@needs_kernels
@pytest.mark.parametrize("name", ["q8_0", "float16", "bfloat16"])
@torch.inference_mode()
def test_the_one_call_decode_step_writes_the_same_bytes_as_torch(wide_models, name):
    """decode_layers_ stores keys and values in C++; the per-layer native step stores them through torch: the
    same step both ways leaves the same bytes in the cache and the same logits."""
    engine = Engine(EngineConfig(model=str(wide_models["llama"]), num_kv_blocks=16, quantization="int4",
                                 kv_cache_dtype=name))
    decoder, cache = engine.runner.lean, engine.kv_cache
    assert isinstance(decoder, NativeDecoder) and decoder._one_call
    ids = torch.tensor(engine.encode_prompt("the same bytes from C++ and from torch"))
    n = len(ids)
    prefill = build_metadata(cache, [SequenceSlice(0, 0, n - 1, [3, 4, 5])], CPU, "torch", torch.float32)
    decoder(ids[: n - 1], prefill, torch.tensor([n - 2]))
    results = []
    for one_call in (True, False):
        decoder._one_call = one_call
        meta = build_metadata(cache, [SequenceSlice(0, n - 1, n, [3, 4, 5])], CPU, "torch", torch.float32)
        logits = decoder(ids[n - 1:], meta, torch.tensor([0]))
        stored = [t.clone() for t in (*cache.keys, *cache.values, *cache.key_scales, *cache.value_scales)]
        results.append((logits, stored))
    (one_logits, one_stored), (layered_logits, layered_stored) = results
    assert all(torch.equal(a, b) for a, b in zip(one_stored, layered_stored))
    torch.testing.assert_close(one_logits, layered_logits, rtol=1e-5, atol=1e-5)


# -- parity with transformers' generate --------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["q8_0", "bfloat16", "float16"])
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_concurrent_chats_match_generate_reading_the_same_rounded_keys(wide_models, arch, name):
    """Eight chats at once, with a cache stored as ``name``, equal transformers' greedy ``generate`` one chat at
    a time whose attention reads every key and value rounded as ``name`` stores it: the same arithmetic, so the
    tokens are the same."""
    folder = wide_models[arch]
    engine = Engine(EngineConfig(model=str(folder), num_kv_blocks=256, kv_cache_dtype=name))
    assert engine.stats().kv_cache_dtype == name
    prompts = chat_prompts(engine, n=8, seed=7)
    outputs = engine.generate(prompts, SamplingParams(max_tokens=32, temperature=0.0))
    reference = load_reference(folder, kv_cache_dtype=name)
    eos = engine.loaded.eos_token_ids
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == reference_greedy(reference, prompt, 32, eos)


def test_a_q8_0_cache_gives_the_same_tokens_when_preempted_chunked_and_served_from_the_prefix_cache(wide_models):
    """The pool's invariants hold whatever the format: a pool small enough to preempt, a token budget that chunks
    prompts and a shared system prompt served from cache give exactly what a large pool gives."""
    folder = str(wide_models["llama"])
    system = {"role": "system", "content": "You are a terse assistant who answers about paged caches. " * 3}
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    results = []
    for config in (EngineConfig(model=folder, num_kv_blocks=512, kv_cache_dtype="q8_0"),
                   EngineConfig(model=folder, num_kv_blocks=14, max_num_batched_tokens=32, kv_cache_dtype="q8_0")):
        engine = Engine(config)
        prompts = [[system, {"role": "user", "content": f"question {i} " * (i + 1)}] for i in range(6)]
        first = engine.generate(prompts[:1], params)  # the rest find the system prompt's blocks cached
        results.append([out.token_ids for out in first + engine.generate(prompts[1:], params)])
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and stats.cached_prompt_tokens_total > 0
    assert results[0] == results[1]
    assert engine.stats().num_preempted_total > 0


def test_fit_and_stats_count_the_stored_format(wide_models):
    engine = Engine(EngineConfig(model=str(wide_models["llama"]), num_kv_blocks=32, kv_cache_dtype="q8_0"))
    stats = engine.stats()
    shape = engine.kv_cache.shape
    assert shape.bytes_per_token() == 2 * 2 * 2 * (32 + 2 * 1)  # 2 layers, 2 kv heads, 32 values + one scale
    assert stats.kv_cache_memory_bytes == 32 * engine.block_size * shape.bytes_per_token()
    assert stats.kv_cache_dtype == "q8_0" and stats.kv_cache_dtype_reason == "chosen in the settings"
    from engine.models.fit import estimate

    fit = estimate(EngineConfig(model=str(wide_models["llama"]), kv_cache_dtype="q8_0"))
    assert fit.kv_bytes_per_token == shape.bytes_per_token() and fit.kv_dtype == "q8_0"
    assert "KV cache (q8_0)" in fit.summary()



def test_the_apps_check_scores_every_format_the_model_can_use_against_float32(wide_models):
    from engine import check_kv_formats

    engine = Engine(EngineConfig(model=str(wide_models["qwen3"]), num_kv_blocks=32, kv_cache_dtype="bfloat16"))
    rows = {row.kv_dtype: row for row in check_kv_formats(engine)}
    assert list(rows) == ["float32", "bfloat16", "float16", "q8_0"]  # fp8 is CUDA's
    assert (rows["float32"].kl_divergence, rows["float32"].top1_agreement) == (0.0, 1.0)
    # float16 rounds half as coarsely as q8_0 at these sizes, and bfloat16 eight times as coarsely as float16
    assert 0 < rows["float16"].kl_divergence < rows["bfloat16"].kl_divergence
    assert all(row.perplexity > 1 for row in rows.values())
    assert rows["q8_0"].bytes_per_token == engine.kv_cache.shape.bytes_per_token() * 68 // 128  # it holds bf16
    assert engine.stats().kv_blocks_used == 0 and engine.kv_cache.format.name == "bfloat16"  # its own cache untouched
