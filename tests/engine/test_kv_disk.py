"""The prefix cache's disk tier: a chat continued after a restart reads its earlier blocks back, gets the same
tokens, and a block file that is damaged, truncated or foreign is never served."""

import dataclasses
import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, EngineConfig, SamplingParams
from engine.serving.block_manager import ROOT_HASH, chain_hash
from engine.serving.kv_disk import MAGIC, BlockFile, BlockStore

PAYLOAD = 96


def block(tokens=(1, 2, 3, 4), parent=ROOT_HASH, fill=7) -> BlockFile:
    return BlockFile(chain_hash(parent, tuple(tokens)), parent, tuple(tokens), bytes([fill]) * PAYLOAD)


# -- the files ----------------------------------------------------------------------------------------------------


def test_a_block_reads_back_only_as_the_block_it_is(tmp_path):
    store = BlockStore(tmp_path, "space", PAYLOAD, 1 << 20)
    first = block()
    store.write(first)
    assert store.read(first.hash, first.parent, first.token_ids) == first.payload
    assert store.read(first.hash, first.parent, (1, 2, 3, 5)) is None  # other tokens under that name
    assert first.hash not in store and not store.path(first.hash).exists()  # and the file is gone
    reopened = BlockStore(tmp_path, "space", PAYLOAD, 1 << 20)
    assert first.hash not in reopened


CORRUPTIONS = st.one_of(
    st.tuples(st.just("truncate"), st.integers(0, 10_000)),
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(0, 7)),
    st.tuples(st.just("header"), st.sampled_from(["namespace", "hash", "parent", "tokens", "payload_bytes", "crc32"])),
    st.tuples(st.just("junk"), st.binary(min_size=0, max_size=300)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(corruption=CORRUPTIONS, tokens=st.lists(st.integers(0, 50_000), min_size=4, max_size=4),
       fill=st.integers(0, 255))
def test_a_damaged_truncated_or_foreign_file_is_never_served(tmp_path_factory, corruption, tokens, fill):
    store = BlockStore(tmp_path_factory.mktemp("blocks"), "space", PAYLOAD, 1 << 20)
    written = block(tokens, fill=fill)
    store.write(written)
    path = store.path(written.hash)
    data = path.read_bytes()
    damaged = _damage(data, corruption)
    if damaged == data:
        return  # a corruption that changed nothing
    path.write_bytes(damaged)
    assert store.read(written.hash, written.parent, written.token_ids) is None
    assert not path.exists()


def _damage(data: bytes, corruption) -> bytes:
    kind = corruption[0]
    if kind == "truncate":
        return data[: corruption[1] % len(data)]
    if kind == "flip":
        at = corruption[1] % len(data)
        return data[:at] + bytes([data[at] ^ (1 << corruption[2])]) + data[at + 1:]
    if kind == "junk":
        return corruption[1]
    (length,) = struct.unpack_from("<I", data, len(MAGIC))
    start = len(MAGIC) + 4
    header = json.loads(data[start:start + length])
    field = corruption[1]
    header[field] = {"namespace": "another model", "hash": "00" * 16, "parent": "11" * 16, "tokens": [9, 9, 9, 9],
                     "payload_bytes": PAYLOAD + 1, "crc32": header["crc32"] ^ 1}[field]
    text = json.dumps(header).encode()
    return MAGIC + struct.pack("<I", len(text)) + text + data[start + length:]


def test_the_folder_keeps_under_its_cap_dropping_the_least_recently_used_ends_of_chains(tmp_path):
    probe = BlockStore(tmp_path / "probe", "space", PAYLOAD, 1 << 20)
    probe.write(block())
    size = probe.total_bytes  # every file here has the same size
    store = BlockStore(tmp_path / "blocks", "space", PAYLOAD, int(3.5 * size))
    root = block((1, 1, 1, 1))  # a shared start: found in memory later, so never read (or touched) again
    child = block((2, 2, 2, 2), parent=root.hash, fill=2)
    other, newest = block((3, 3, 3, 3), fill=3), block((4, 4, 4, 4), fill=4)
    for age, each in enumerate((root, other, child), start=1):
        store.write(each)
        os.utime(store.path(each.hash), ns=(10**9 * age, 10**9 * age))
    store.write(newest)  # four files pass the cap: the oldest that no other file continues goes, not the root
    assert [x.hash in store for x in (root, child, other, newest)] == [True, True, False, True]
    store.write(block((5, 5, 5, 5), fill=5))  # again: the chain loses its end, and keeps its start
    assert [x.hash in store for x in (root, child, newest)] == [True, False, True]
    reopened = BlockStore(tmp_path / "blocks", "space", PAYLOAD, int(3.5 * size))  # the names hold the chains
    assert reopened.total_bytes == store.total_bytes == 3 * size


# -- the engine ---------------------------------------------------------------------------------------------------


@pytest.fixture
def disk_home(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "kv-blocks"


def chat(engine, words=120):
    text = " ".join(f"word{i % 37}" for i in range(words))
    return [{"role": "system", "content": "You answer in one line."}, {"role": "user", "content": text}]


PARAMS = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


@pytest.mark.parametrize("kv", ["float32", "q8_0"])
def test_a_chat_continued_after_a_restart_is_read_from_disk_and_gives_the_same_tokens(tiny_model_dirs, disk_home,
                                                                                         kv):
    config = EngineConfig(model=str(tiny_model_dirs["qwen3"]), num_kv_blocks=128, kv_cache_dtype=kv)
    first = Engine(config)
    messages = chat(first)
    before = first.generate([messages], PARAMS)[0]
    first.close()  # what the app's engine thread does at its end: the pending blocks are written
    assert first.stats().disk_cache is None  # closed: no tier any more
    follow_up = [*messages, {"role": "assistant", "content": before.text}, {"role": "user", "content": "again"}]
    cold = Engine(dataclasses.replace(config, kv_disk_cache=False)).generate([follow_up], PARAMS)[0]
    restarted = Engine(config)
    again = restarted.generate([follow_up], PARAMS)[0]
    block = restarted.block_size
    earlier = before.metrics.prompt_tokens + PARAMS.max_tokens - 1  # the first turn's tokens now in the cache
    assert again.metrics.cached_prompt_tokens >= earlier // block * block
    assert restarted.stats().disk_cache.hit_tokens_total == again.metrics.cached_prompt_tokens
    assert again.token_ids == cold.token_ids
    assert restarted.generate([messages], PARAMS)[0].token_ids == before.token_ids


def test_blocks_of_another_kv_format_are_never_read(tiny_model_dirs, disk_home):
    model = str(tiny_model_dirs["qwen3"])
    writer = Engine(EngineConfig(model=model, num_kv_blocks=64, kv_cache_dtype="q8_0"))
    messages = chat(writer)
    writer.generate([messages], PARAMS)
    writer.close()
    [q8_folder] = list(disk_home.iterdir())
    reader = Engine(EngineConfig(model=model, num_kv_blocks=64, kv_cache_dtype="float32"))
    reader.generate([[{"role": "user", "content": "warm up"}]], SamplingParams(max_tokens=2))
    reader.disk.flush()
    [float_folder] = [f for f in disk_home.iterdir() if f != q8_folder]
    for file in q8_folder.iterdir():  # a foreign file under the name the float32 cache looks for
        (float_folder / file.name).write_bytes(file.read_bytes())
    reader.disk.store.__init__(float_folder, reader.disk.store.space, reader.disk.store.payload_bytes,
                               reader.disk.store.max_bytes)
    out = reader.generate([messages], PARAMS)[0]
    assert out.metrics.cached_prompt_tokens == 0 and reader.stats().disk_cache.hit_tokens_total == 0


def test_off_writes_nothing_and_clear_deletes_the_models_blocks(tiny_model_dirs, disk_home):
    model = str(tiny_model_dirs["qwen3"])
    off = Engine(EngineConfig(model=model, num_kv_blocks=64, kv_disk_cache=False))
    off.generate([chat(off)], PARAMS)
    off.close()
    assert not disk_home.exists() and off.stats().disk_cache is None and off.clear_disk_cache() == 0
    on = Engine(EngineConfig(model=model, num_kv_blocks=64))
    on.generate([chat(on)], PARAMS)
    on.disk.flush()
    written = on.stats().disk_cache
    assert written.blocks_written_total > 0 and written.bytes_on_disk > 0
    assert on.clear_disk_cache() == written.bytes_on_disk
    assert on.stats().disk_cache.bytes_on_disk == 0 and not any(disk_home.rglob("*.kvb"))


def test_switching_models_frees_the_cache_the_disk_tier_wrote_from(tiny_model_dirs, disk_home):
    import gc
    import weakref

    engine = Engine(EngineConfig(model=str(tiny_model_dirs["qwen3"]), num_kv_blocks=64))
    engine.generate([chat(engine)], PARAMS)
    old = weakref.ref(engine.kv_cache)
    engine.switch_model(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    gc.collect()
    assert old() is None


def test_a_block_that_cannot_be_read_is_computed_and_the_step_goes_on(tiny_model_dirs, disk_home, monkeypatch):
    config = EngineConfig(model=str(tiny_model_dirs["qwen3"]), num_kv_blocks=64)
    first = Engine(config)
    messages = chat(first)
    want = first.generate([messages], PARAMS)[0].token_ids
    first.close()
    restarted = Engine(config)

    def refuse(*args):
        raise PermissionError("the cache folder became unreadable")

    monkeypatch.setattr(restarted.disk.store, "read", refuse)
    out = restarted.generate([messages], PARAMS)[0]
    assert out.finish_reason == "length" and out.token_ids == want and out.metrics.cached_prompt_tokens == 0


def test_a_prefix_read_beside_streaming_replies_comes_a_share_per_step(tiny_model_dirs, disk_home, monkeypatch):
    """While a reply is being written, a newcomer's prefix is read from disk two blocks per step (the limit made
    small here): the streaming reply gets its token in every one of those steps, and the newcomer still gets its
    whole prefix from disk and the same tokens."""
    from engine.serving import kv_disk

    config = EngineConfig(model=str(tiny_model_dirs["qwen3"]), num_kv_blocks=128)
    first = Engine(config)
    messages = chat(first, words=200)
    want = first.generate([messages], PARAMS)[0]
    first.close()
    engine = Engine(config)
    monkeypatch.setattr(kv_disk, "BYTES_PER_PACED_STEP", 2 * engine.disk.store.payload_bytes)
    streaming = engine.add_request("a reply that goes on", SamplingParams(max_tokens=200, ignore_eos=True))
    engine.step()  # its prompt: it decodes from now on
    newcomer = engine.add_request(messages, PARAMS)
    steps_waiting = 0
    while True:
        outputs = {out.request_id: out for out in engine.step()}
        assert streaming in outputs and len(outputs[streaming].delta_token_ids) == 1  # never held up
        if newcomer in outputs:
            break
        steps_waiting += 1
    blocks = (want.metrics.prompt_tokens - 1) // engine.block_size  # the last prompt token is always computed
    assert steps_waiting >= blocks // 2 - 1  # two blocks a step
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id == newcomer and out.finished:
                final = out
        engine.abort(streaming)
    assert final.token_ids == want.token_ids and final.metrics.cached_prompt_tokens == blocks * engine.block_size
