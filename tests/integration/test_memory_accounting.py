"""The stats' memory figures against the process's own: the KV pool is resident only as far as blocks are written,
and the panel's parts add up to the resident set."""

from engine import Engine, EngineConfig, SamplingParams
from engine.tools.evaluation import eval_text


def test_the_kv_pool_counts_what_is_resident_and_only_that(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path))
    engine = Engine(EngineConfig(kv_cache_dtype="float32", num_kv_blocks=2048, kv_disk_cache=False))
    before = engine.stats()
    assert before.kv_touched_bytes == 0 and before.kv_cache_memory_bytes > 1024**3  # 1.5 GB reserved, none mapped
    assert before.process_resident_bytes < before.model_memory_bytes + before.kv_cache_memory_bytes / 2
    prompt = [{"role": "user", "content": eval_text()[:7000]}]
    out = engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    after = engine.stats()
    per_block = engine.block_size * engine.kv_cache.shape.bytes_per_token()
    computed = out.metrics.prompt_tokens + 8 - 1  # the last token sampled is never fed back
    # the full blocks of the prompt and reply stay cached, and mapped; the partial last one was freed, and its
    # pages given back once the engine was idle
    assert after.kv_blocks_cached == computed // engine.block_size
    assert after.kv_touched_bytes == after.kv_blocks_cached * per_block > 60 * 1024**2
    grown = after.process_resident_bytes - before.process_resident_bytes
    # the pool's new pages are in the resident set (plus the step's activations, which come and go)
    assert grown >= 0.9 * after.kv_touched_bytes


def test_the_pages_of_freed_blocks_go_back_to_the_system_once_the_engine_is_idle(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path))
    engine = Engine(EngineConfig(kv_cache_dtype="float32", num_kv_blocks=2048, kv_disk_cache=False,
                                 enable_prefix_caching=False))  # nothing stays cached: every block is freed
    before = engine.stats().process_resident_bytes
    prompts = [[{"role": "user", "content": eval_text()[i * 1500:(i + 1) * 1500 + 3000]}] for i in range(3)]
    engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0))
    after = engine.stats()
    assert after.kv_blocks_used == after.kv_blocks_cached == 0 and after.kv_touched_bytes == 0
    # three prompts of about 1,000 tokens took 130 MiB of pool while they ran: it is back, give or take the
    # allocator's own buffers
    assert after.process_resident_bytes - before < 40 * 1024**2
