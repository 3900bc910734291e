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
    # every block the prompt and reply were written to, the partial last one included (freed since, still mapped)
    assert after.kv_touched_bytes == -(-computed // engine.block_size) * per_block > 60 * 1024**2
    grown = after.process_resident_bytes - before.process_resident_bytes
    # the pool's new pages are in the resident set (plus the step's activations, which come and go)
    assert grown >= 0.9 * after.kv_touched_bytes
