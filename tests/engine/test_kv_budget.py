"""One rule sizes the KV cache: the engine allocates what the fit estimate promised before loading."""

import ctypes
import mmap
import sys

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig
from engine.models.fit import estimate
from engine.serving.kv_cache import CPU_KV_DEFAULT_CAP, CPU_KV_SHARE, CUDA_KV_SHARE, kv_cache_blocks
from tests.helpers import flash_stand_in

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
GIB = 1024**3


def test_the_rule():
    per_token, context = 1024, 65536
    config = EngineConfig(block_size=16, max_num_seqs=64)
    # a share of what is free beside the weights; on the CPU never more than the cap
    assert kv_cache_blocks(config, CPU, per_token, context, 4 * GIB, 16) == int(4 * GIB * CPU_KV_SHARE) // (16 * 1024)
    assert kv_cache_blocks(config, CPU, per_token, context, 64 * GIB, 16) == CPU_KV_DEFAULT_CAP // (16 * 1024)
    assert kv_cache_blocks(config, CUDA, per_token, context, 2 * GIB, 16) == int(2 * GIB * CUDA_KV_SHARE) // (16 * 1024)
    # never more than max_num_seqs full contexts; at least one block; explicit settings decide
    small = EngineConfig(block_size=16, max_num_seqs=2)
    assert kv_cache_blocks(small, CUDA, per_token, context, 64 * GIB, 16) == 2 * 65536 // 16 + 1
    assert kv_cache_blocks(config, CPU, per_token, context, 0, 16) == 1
    assert kv_cache_blocks(EngineConfig(num_kv_blocks=7), CPU, per_token, context, 64 * GIB, 16) == 7
    assert kv_cache_blocks(EngineConfig(kv_cache_memory=GIB), CPU, per_token, context, 0, 16) == GIB // (16 * 1024)


def test_the_rule_counts_in_the_blocks_that_run():
    """A backend with 256-token blocks gets the same bytes as one with 16-token blocks: 16 times fewer blocks."""
    per_token, context = 1024, 65536
    config, small = EngineConfig(block_size=16), EngineConfig(block_size=16, max_num_seqs=2)
    budget = int(2 * GIB * CUDA_KV_SHARE)
    assert kv_cache_blocks(config, CUDA, per_token, context, 2 * GIB, 256) == budget // (256 * 1024)
    assert kv_cache_blocks(small, CUDA, per_token, context, 64 * GIB, 256) == 2 * 65536 // 256 + 1


@pytest.mark.parametrize("backend, block_size", [("flash_attn", 256), ("flex", 128)])
@pytest.mark.parametrize("settings", [{}, {"kv_cache_memory": 3 * 1024**2}])
def test_a_backend_with_larger_blocks_stays_within_the_budget(tiny_llama, monkeypatch, backend, block_size, settings):
    """flash-attn runs 256-token blocks and compiled FlexAttention 128-token ones whatever ``block_size`` says; the
    pool must still hold the budget's bytes (or at most ``max_num_seqs`` full contexts), not 16 or 8 times that,
    and the fit estimate must promise the pool the engine allocates."""
    flash_stand_in.plan_as_backend(monkeypatch, backend)
    config = EngineConfig(model=str(tiny_llama), **settings)
    promised = estimate(config)
    engine = Engine(config)
    tokens = engine.kv_cache.num_blocks * engine.block_size
    pool_bytes = tokens * engine.kv_cache.shape.bytes_per_token()
    assert engine.block_size == block_size and engine.stats().block_size == block_size
    if settings:
        assert pool_bytes <= settings["kv_cache_memory"] and promised.kv_tokens == tokens
    else:
        full_contexts = config.max_num_seqs * engine.max_model_len
        assert full_contexts <= tokens <= full_contexts + block_size
        assert abs(promised.kv_tokens - tokens) <= 0.05 * tokens
        assert pool_bytes <= CPU_KV_DEFAULT_CAP


@pytest.mark.parametrize("settings", [{}, {"kv_cache_memory": 3 * 1024**2}, {"num_kv_blocks": 40}])
def test_the_engine_allocates_what_the_estimate_promised(tiny_llama, settings):
    config = EngineConfig(model=str(tiny_llama), **settings)
    promised = estimate(config).kv_tokens
    engine = Engine(config)
    allocated = engine.kv_cache.num_blocks * engine.block_size
    if settings:
        assert allocated == promised
    else:  # both read the free memory, a moment apart
        assert abs(allocated - promised) <= 0.05 * allocated


def _resident_bytes_of(tensors) -> int:
    """Resident bytes of the pages under ``tensors``, page by page (mincore): exactly their own memory, not the
    whole mappings around them, which the system may merge with neighbouring memory the process uses."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    page = mmap.PAGESIZE
    total = 0
    for tensor in tensors:
        start = tensor.data_ptr() // page * page
        end = tensor.data_ptr() + tensor.numel() * tensor.element_size()
        pages = -(-(end - start) // page)
        vector = (ctypes.c_ubyte * pages)()
        assert libc.mincore(start, end - start, vector) == 0, ctypes.get_errno()
        total += sum(byte & 1 for byte in vector) * page
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts resident pages with Linux's mincore")
def test_the_cpu_pool_takes_memory_as_its_blocks_are_used():
    from engine.serving.kv_cache import KVCache, KVShape

    freed = np.ones(24 * 1024**2, dtype=np.uint8)
    del freed  # a freed large block raises glibc's mmap threshold: the pool must not come from the heap then
    cache = KVCache(KVShape(8, 4, 64, torch.float32), 2048, 16, CPU)  # 512 MiB of keys and values
    untouched = _resident_bytes_of(cache.keys + cache.values)
    assert cache.memory_bytes == 512 * 1024**2 and untouched < 32 * 1024**2
    for layer in range(8):
        cache.keys[layer][:1024] = 1.0  # half the key blocks of every layer: 128 MiB
    grown = _resident_bytes_of(cache.keys + cache.values) - untouched
    assert 100 * 1024**2 < grown < 160 * 1024**2  # the written half of the keys, not the whole pool
    assert not cache.keys[5][1024:].any() and not cache.values[7].any()  # zeros, as torch.zeros would give


def test_on_a_gpu_the_cache_is_sized_from_what_a_measured_step_leaves(monkeypatch):
    """free memory - the warm-up step's peak, then the one rule; sized-by-hand caches skip the warm-up."""
    from types import SimpleNamespace

    from engine.serving import engine as engine_module
    from engine.serving.kv_cache import KVShape

    monkeypatch.setattr(engine_module, "available_memory", lambda device: 10 * GIB)
    calls = []

    def measured(model, shape, block_size, device, backend, tokens):
        calls.append(tokens)
        return 3 * GIB

    monkeypatch.setattr(engine_module, "step_peak_bytes", measured)
    shape = KVShape(num_layers=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    per_token = shape.bytes_per_token()
    fake = SimpleNamespace(device=CUDA, config=EngineConfig(max_num_batched_tokens=512, max_num_seqs=4096),
                           max_model_len=300, loaded=SimpleNamespace(model=None), block_size=16,
                           attention_backend="torch")
    blocks = Engine._num_kv_blocks(fake, shape)
    assert calls == [300]  # the largest step: max_num_batched_tokens, at most the context
    assert fake.step_peak_bytes == 3 * GIB
    assert blocks == int(7 * GIB * CUDA_KV_SHARE) // (16 * per_token)
    fake.config = EngineConfig(num_kv_blocks=9)
    assert Engine._num_kv_blocks(fake, shape) == 9 and calls == [300]


def test_the_warm_up_step_runs_the_model_and_leaves_the_engine_as_it_was(tiny_llama):
    from engine import SamplingParams
    from engine.serving.kv_cache import KVShape
    from engine.serving.warmup import step_peak_bytes

    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64))
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    before = engine.generate([[1, 5, 9, 200]], greedy)[0].token_ids
    shape = KVShape.from_config(engine.loaded.model.config, engine.loaded.dtype)
    peak = step_peak_bytes(engine.loaded.model, shape, engine.block_size, engine.device, engine.attention_backend,
                           512)
    assert isinstance(peak, int) and peak >= 0
    assert engine.generate([[1, 5, 9, 200]], greedy)[0].token_ids == before


def test_the_warm_up_prompt_stays_inside_a_small_vocabulary(tokenizer_dir, tmp_path):
    """A warm-up step longer than the vocabulary: ids past it are a device-side assert on CUDA, which poisons the
    context for good (here the embedding raises). The ids wrap around instead."""
    from engine.serving.kv_cache import KVShape
    from engine.serving.warmup import step_peak_bytes, warmup_token_ids
    from tests.helpers.tiny_models import write_tiny_model

    assert warmup_token_ids(5, 3) == [0, 1, 2, 0, 1]
    small = write_tiny_model("llama", tmp_path / "small-vocab", tokenizer_dir, vocab_size=256,
                             num_key_value_heads=2)
    engine = Engine(EngineConfig(model=str(small), num_kv_blocks=8))
    assert engine.loaded.model.config.vocab_size == 256
    shape = KVShape.from_config(engine.loaded.model.config, engine.loaded.dtype)
    peak = step_peak_bytes(engine.loaded.model, shape, engine.block_size, engine.device, engine.attention_backend,
                           600)
    assert isinstance(peak, int) and peak >= 0


def test_a_gpu_load_needs_system_memory_on_the_way(tiny_llama, tmp_path, monkeypatch):
    """Tensor by tensor for safetensors (the embedding is the largest); a GGUF's first conversion holds the whole
    model; an estimate whose way through system memory does not fit says so and does not fit."""
    from dataclasses import replace

    from engine.models import fit
    from engine.models.model_info import read_model_info
    from engine.models.sources import resolve_source
    from tests.helpers.tiny_gguf import write_tiny_llama_gguf

    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path / "cache"))
    source = resolve_source(str(tiny_llama))
    info = read_model_info(source)
    head = fit.output_head(source)
    assert fit.host_load_bytes(source, info, "nf4", torch.bfloat16, CPU) == 0
    assert fit.host_load_bytes(source, info, "nf4", torch.bfloat16, CUDA) == head.rows * head.cols * (4 + 2)
    gguf = resolve_source(str(write_tiny_llama_gguf(tiny_llama, tmp_path / "tiny.gguf", "Q8_0")))
    gguf_info = read_model_info(gguf)
    assert fit.host_load_bytes(gguf, gguf_info, "none", torch.bfloat16, CUDA) == gguf_info.parameter_count * 2
    gguf_head = fit.output_head(gguf)  # packed from the file's blocks: one tensor at a time
    assert fit.host_load_bytes(gguf, gguf_info, "int4", torch.bfloat16, CUDA) == gguf_head.rows * gguf_head.cols * 6
    good = estimate(EngineConfig(model=str(tiny_llama)))
    assert good.host_fits and good.fits
    short = replace(good, host_load_bytes=good.host_available_bytes)
    assert not short.fits and "of system memory on the way" in short.summary()
