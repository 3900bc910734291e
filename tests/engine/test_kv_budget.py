"""One rule sizes the KV cache: the engine allocates what the fit estimate promised before loading."""

import pytest
import torch

from engine import Engine, EngineConfig
from engine.models.fit import estimate
from engine.serving.kv_cache import CPU_KV_DEFAULT_CAP, CPU_KV_SHARE, CUDA_KV_SHARE, kv_cache_blocks

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
GIB = 1024**3


def test_the_rule():
    per_token, context = 1024, 65536
    config = EngineConfig(block_size=16, max_num_seqs=64)
    # a share of what is free beside the weights; on the CPU never more than the cap
    assert kv_cache_blocks(config, CPU, per_token, context, 4 * GIB) == int(4 * GIB * CPU_KV_SHARE) // (16 * 1024)
    assert kv_cache_blocks(config, CPU, per_token, context, 64 * GIB) == CPU_KV_DEFAULT_CAP // (16 * 1024)
    assert kv_cache_blocks(config, CUDA, per_token, context, 2 * GIB) == int(2 * GIB * CUDA_KV_SHARE) // (16 * 1024)
    # never more than max_num_seqs full contexts; at least one block; explicit settings decide
    small = EngineConfig(block_size=16, max_num_seqs=2)
    assert kv_cache_blocks(small, CUDA, per_token, context, 64 * GIB) == 2 * 65536 // 16 + 1
    assert kv_cache_blocks(config, CPU, per_token, context, 0) == 1
    assert kv_cache_blocks(EngineConfig(num_kv_blocks=7), CPU, per_token, context, 64 * GIB) == 7
    assert kv_cache_blocks(EngineConfig(kv_cache_memory=GIB), CPU, per_token, context, 0) == GIB // (16 * 1024)


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


def test_the_cpu_pool_takes_memory_as_its_blocks_are_used():
    from engine.models.memory import resident_bytes
    from engine.serving.kv_cache import KVCache, KVShape

    before = resident_bytes()
    cache = KVCache(KVShape(8, 4, 64, torch.float32), 2048, 16, CPU)  # 512 MiB of keys and values
    untouched = resident_bytes() - before
    assert cache.memory_bytes == 512 * 1024**2 and untouched < 32 * 1024**2
    assert not cache.keys[5].any() and not cache.values[7].any()  # zeros, as torch.zeros would give
    for layer in range(8):
        cache.keys[layer][:1024] = 1.0  # half the key blocks of every layer: 128 MiB
    assert resident_bytes() - before > 100 * 1024**2
