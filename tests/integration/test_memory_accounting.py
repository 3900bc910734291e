"""The stats' KV memory against the system's own figures: the pool's pages are present (/proc/self/pagemap) only
as far as blocks are written, as ``kv_touched_bytes`` says, and freed blocks give their pages back once idle."""

import mmap
import struct
import sys

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.tools.evaluation import eval_text

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/pagemap")
PRESENT = 1 << 63  # a pagemap entry's bit for a page in memory


def pool_resident_bytes(engine) -> int:
    """The KV pool's pages in memory, page by page over its tensors' own address ranges (the system merges
    neighbouring anonymous mappings, so a mapping's total in smaps can hold other memory too)."""
    page, present = mmap.PAGESIZE, 0
    with open("/proc/self/pagemap", "rb") as pagemap:
        for tensor in engine.kv_cache.tensors():
            first, count = tensor.data_ptr() // page, -(-tensor.numel() * tensor.element_size() // page)
            pagemap.seek(first * 8)
            entries = struct.unpack(f"<{count}Q", pagemap.read(count * 8))
            present += sum(1 for entry in entries if entry & PRESENT)
    return present * page


@pytest.fixture
def engine(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path))
    return Engine(EngineConfig(kv_cache_dtype="float32", num_kv_blocks=2048, kv_disk_cache=False))


def test_the_kv_pool_counts_what_is_resident_and_only_that(engine):
    before = engine.stats()
    assert before.kv_touched_bytes == 0 == pool_resident_bytes(engine)
    assert before.kv_cache_memory_bytes > 1024**3  # 1.5 GB reserved, none of it mapped
    prompt = [{"role": "user", "content": eval_text()[:7000]}]
    out = engine.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))[0]
    after = engine.stats()
    per_block = engine.block_size * engine.kv_cache.shape.bytes_per_token()
    computed = out.metrics.prompt_tokens + 8 - 1  # the last token sampled is never fed back
    # the full blocks of the prompt and reply stay cached, and mapped; the partial last one was freed, and its
    # pages given back once the engine was idle
    assert after.kv_blocks_cached == computed // engine.block_size
    assert after.kv_touched_bytes == after.kv_blocks_cached * per_block > 60 * 1024**2
    # the system's count differs only by the pages the first and last blocks share with their neighbours
    slack = 2 * mmap.PAGESIZE * len(engine.kv_cache.tensors())
    assert abs(pool_resident_bytes(engine) - after.kv_touched_bytes) <= slack


def test_the_pages_of_freed_blocks_go_back_to_the_system_once_the_engine_is_idle(engine):
    engine.block_manager.enable_prefix_caching = False  # nothing stays cached: every block is freed
    prompts = [[{"role": "user", "content": eval_text()[i * 1500:(i + 1) * 1500 + 3000]}] for i in range(3)]
    ids = [engine.add_request(p, SamplingParams(max_tokens=8, temperature=0.0)) for p in prompts]
    engine.step()
    running = pool_resident_bytes(engine)
    assert running > 60 * 1024**2 and engine.stats().kv_touched_bytes > 60 * 1024**2  # the first chunks' blocks
    while engine.has_unfinished():
        engine.step()
    after = engine.stats()
    assert len(ids) == 3 and after.kv_blocks_used == after.kv_blocks_cached == 0
    assert after.kv_touched_bytes == 0 and pool_resident_bytes(engine) == 0


def test_serving_the_default_model_leaves_the_modeling_stack_and_the_compiler_out():
    """transformers' modeling code and torch's compiler are 60 MiB of resident memory a serving engine never uses
    on this path: loading the default model and writing a reply imports neither (a process of its own, since
    other tests import both)."""
    import subprocess

    script = (
        "import sys\n"
        "from engine import Engine, EngineConfig, SamplingParams\n"
        "engine = Engine(EngineConfig(kv_disk_cache=False))\n"
        "engine.generate(['The history of paper'], SamplingParams(max_tokens=8, temperature=0.0))\n"
        "print(sorted(m for m in ('transformers.modeling_utils', 'torch._dynamo', 'torch._inductor') "
        "if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
