"""The converted-GGUF cache looks after its disk and never fails the load that fills it."""

import logging
import os
import time
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch

from engine.models import gguf_cache
from engine.models.sources import ModelSource

KIB = 1024


class FakeModel(torch.nn.Module):
    """Stands in for a loaded model: ``save_pretrained`` writes a file the size of its weights, or fails."""

    def __init__(self, weights: int = 64 * KIB, error: Exception | None = None) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(weights // 4))
        self.config = SimpleNamespace()
        self.error = error

    def save_pretrained(self, folder, safe_serialization=True):
        (folder / "model.safetensors").write_bytes(bytes(self.weight.numel() * 4))
        if self.error:
            raise self.error


class FakeTokenizer:
    def save_pretrained(self, folder):
        (folder / "tokenizer.json").write_text("{}")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(gguf_cache.MAX_BYTES_ENV, raising=False)
    return tmp_path / "cache" / "gguf"


def _source(tmp_path, name="m.gguf") -> ModelSource:
    (tmp_path / name).write_bytes(b"GGUF" + name.encode())
    return ModelSource(name.removesuffix(".gguf"), tmp_path, name)


def test_store_then_lookup_finds_the_copy_and_marks_it_used(cache, tmp_path):
    source = _source(tmp_path)
    assert gguf_cache.lookup(source) is None
    folder = gguf_cache.store(source, FakeModel(), FakeTokenizer())
    assert folder.parent == cache and (folder / "model.safetensors").stat().st_size == 64 * KIB
    marker = folder / gguf_cache.COMPLETE_MARKER
    assert marker.read_text() == str((tmp_path / "m.gguf").resolve())
    os.utime(marker, (1, 1))
    assert gguf_cache.lookup(source) == folder
    assert marker.stat().st_mtime > time.time() - 60  # looked up just now


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), RuntimeError("safetensors failed")])
def test_a_failed_write_leaves_nothing_and_does_not_raise(cache, tmp_path, error, caplog):
    source = _source(tmp_path)
    with caplog.at_level(logging.WARNING, logger="engine.models.gguf_cache"):
        assert gguf_cache.store(source, FakeModel(error=error), FakeTokenizer()) is None
    assert list(cache.iterdir()) == []  # no staging folder, no half copy
    assert gguf_cache.lookup(source) is None
    assert str(error) in caplog.text


def test_stale_staging_folders_are_removed_on_the_next_store(cache, tmp_path):
    cache.mkdir(parents=True)
    stale, fresh = cache / ".staging-old", cache / ".staging-busy"
    for folder in (stale, fresh):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * 3600,) * 2)
    gguf_cache.store(_source(tmp_path), FakeModel(), FakeTokenizer())
    assert not stale.exists()
    assert fresh.exists()  # may belong to a write still running in another process


def test_no_copy_when_it_would_leave_less_than_a_gib_free(cache, tmp_path, monkeypatch, caplog):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(gguf_cache.shutil, "disk_usage", lambda path: usage(10**12, 0, 1024**3 + 32 * KIB))
    with caplog.at_level(logging.INFO, logger="engine.models.gguf_cache"):
        assert gguf_cache.store(_source(tmp_path), FakeModel(64 * KIB), FakeTokenizer()) is None
    assert "bytes are free on the disk" in caplog.text
    assert [p for p in cache.iterdir()] == []
    monkeypatch.setattr(gguf_cache.shutil, "disk_usage", lambda path: usage(10**12, 0, 1024**3 + 128 * KIB))
    assert gguf_cache.store(_source(tmp_path), FakeModel(64 * KIB), FakeTokenizer()) is not None


def test_a_new_copy_of_a_file_replaces_the_older_copies(cache, tmp_path):
    source, other = _source(tmp_path), _source(tmp_path, "other.gguf")
    first = gguf_cache.store(source, FakeModel(), FakeTokenizer())
    kept = gguf_cache.store(other, FakeModel(), FakeTokenizer())
    (tmp_path / "m.gguf").write_bytes(b"GGUF changed")  # a new version of the file: a new key
    second = gguf_cache.store(source, FakeModel(), FakeTokenizer())
    assert second != first and not first.exists()
    assert sorted(cache.iterdir()) == sorted([second, kept])


def test_least_recently_used_copies_are_evicted_over_the_cap(cache, tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_cache.MAX_BYTES_ENV, str(200 * KIB))  # room for three copies of about 64 KiB
    sources = [_source(tmp_path, f"{n}.gguf") for n in "abcd"]
    folders = [gguf_cache.store(s, FakeModel(), FakeTokenizer()) for s in sources[:3]]
    for i, folder in enumerate(folders):  # stored a, b, c in that order; then a is used again
        os.utime(folder / gguf_cache.COMPLETE_MARKER, (1000 + i,) * 2)
    assert gguf_cache.lookup(sources[0]) == folders[0]
    newest = gguf_cache.store(sources[3], FakeModel(), FakeTokenizer())
    assert sorted(cache.iterdir()) == sorted([folders[0], folders[2], newest])  # b was the least recent


def test_a_copy_larger_than_the_cap_is_not_made(cache, tmp_path, monkeypatch):
    monkeypatch.setenv(gguf_cache.MAX_BYTES_ENV, str(32 * KIB))
    assert gguf_cache.store(_source(tmp_path), FakeModel(64 * KIB), FakeTokenizer()) is None
    monkeypatch.setenv(gguf_cache.MAX_BYTES_ENV, "lots")
    assert gguf_cache.max_bytes() == gguf_cache.DEFAULT_MAX_BYTES == 4 * 1024**3


def test_a_bfloat16_load_keeps_a_copy_of_its_own_and_reads_it_next_time(tiny_llama, tmp_path, monkeypatch):
    """GPU loads (bfloat16) convert a GGUF file once too, not on every start; the float32 copy is separate."""
    from engine import Engine, EngineConfig, SamplingParams
    from engine.models.sources import resolve_source
    from tests.helpers.tiny_gguf import write_tiny_llama_gguf

    monkeypatch.setenv(gguf_cache.CACHE_ENV, str(tmp_path / "cache"))
    path = write_tiny_llama_gguf(tiny_llama, tmp_path / "tiny.gguf")
    source = resolve_source(str(path))
    config = EngineConfig(model=str(path), dtype="bfloat16", quantization="none", num_kv_blocks=16)
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    first = Engine(config)
    copy = gguf_cache.lookup(source, torch.bfloat16)
    assert copy is not None and gguf_cache.lookup(source) is None
    assert first.loaded.loaded_from == path
    second = Engine(config)
    assert second.loaded.loaded_from == copy
    assert second.generate([[1, 7, 30]], greedy)[0].token_ids == first.generate([[1, 7, 30]], greedy)[0].token_ids
