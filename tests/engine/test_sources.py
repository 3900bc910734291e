"""Every model source a user has loads and chats; each bad one is refused with its own message."""

import json
import shutil

import pytest

from engine import Engine, EngineConfig, ModelLoadError, SamplingParams
from engine.models.sources import resolve_source
from tests.helpers.tiny_gguf import write_tiny_llama_gguf

GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
CHAT = [[{"role": "user", "content": "hello there, how are you?"}]]


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama, tmp_path_factory):
    return write_tiny_llama_gguf(tiny_llama, tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")


def test_gguf_written_from_a_folder_chats_exactly_like_the_folder(tiny_gguf, tiny_llama):
    from_gguf = Engine(EngineConfig(model=str(tiny_gguf), num_kv_blocks=64))
    from_folder = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64))
    assert from_gguf.loaded.source.kind == "gguf" and from_gguf.stats().model_name == "tiny-llama"
    assert from_gguf.encode_prompt(CHAT[0]) == from_folder.encode_prompt(CHAT[0])  # template from the file
    assert from_gguf.generate(CHAT, GREEDY)[0].token_ids == from_folder.generate(CHAT, GREEDY)[0].token_ids


def test_hub_repo_id_is_found_in_the_local_cache(tiny_llama, tmp_path, monkeypatch):
    snapshot = tmp_path / "models--kvasir-tests--tiny-llama" / "snapshots" / "0123abc"
    shutil.copytree(tiny_llama, snapshot)
    (tmp_path / "models--kvasir-tests--tiny-llama" / "refs").mkdir()
    (tmp_path / "models--kvasir-tests--tiny-llama" / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = resolve_source("kvasir-tests/tiny-llama")
    assert source.folder == snapshot and source.name == "tiny-llama" and source.origin == "kvasir-tests/tiny-llama"
    engine = Engine(EngineConfig(model="kvasir-tests/tiny-llama", num_kv_blocks=64))
    assert len(engine.generate(CHAT, GREEDY)[0].token_ids) == 16


def test_hub_repo_id_missing_from_the_cache_says_how_to_add_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelLoadError, match="not in the local Hugging Face cache.*models add"):
        resolve_source("kvasir-tests/not-here")


def test_download_offline_says_the_hub_cannot_be_reached(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="could not download .*can't be reached"):
        resolve_source("kvasir-tests/not-here", download=True)


def test_pickle_checkpoint_is_refused(tmp_path, tiny_llama):
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(tiny_llama / "config.json", folder)
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(ModelLoadError, match="pickle checkpoint, which can run arbitrary code"):
        resolve_source(str(folder))
    with pytest.raises(ModelLoadError, match="pickle checkpoint"):
        resolve_source(str(folder / "pytorch_model.bin"))


def test_truncated_gguf_is_refused(tiny_gguf, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_gguf.read_bytes()[:-1000])
    with pytest.raises(ModelLoadError, match="is truncated"):
        resolve_source(str(cut))
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(tiny_gguf.read_bytes()[:200])
    with pytest.raises(ModelLoadError, match="truncated"):
        resolve_source(str(header_only))
    not_gguf = tmp_path / "fake.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 a zip file")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        resolve_source(str(not_gguf))


def test_folder_with_missing_shards_is_refused(tmp_path, tiny_llama):
    folder = tmp_path / "sharded"
    shutil.copytree(tiny_llama, folder)
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                             "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ModelLoadError, match="missing 1 of its 2 weight shards: model-00002-of-00002"):
        resolve_source(str(folder))


def test_model_without_chat_template_gets_a_fallback_and_a_warning(tiny_llama, tmp_path):
    folder = tmp_path / "no-template"
    shutil.copytree(tiny_llama, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    engine = Engine(EngineConfig(model=str(folder), num_kv_blocks=64))
    assert any("no chat template" in w for w in engine.stats().warnings)
    text = engine.tokenizer.decode(engine.encode_prompt([{"role": "user", "content": "Hi"}]))
    assert text.endswith("User: Hi\n\nAssistant:")


def test_gguf_is_converted_once_then_loaded_from_the_copy(tiny_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path / "cache"))
    first = Engine(EngineConfig(model=str(tiny_gguf), num_kv_blocks=64))
    assert first.loaded.loaded_from == tiny_gguf
    second = Engine(EngineConfig(model=str(tiny_gguf), num_kv_blocks=64))
    assert second.loaded.loaded_from.parent == tmp_path / "cache" / "gguf"
    assert second.stats().model_name == "tiny-llama" and second.loaded.source.kind == "gguf"
    assert second.encode_prompt(CHAT[0]) == first.encode_prompt(CHAT[0])
    assert second.generate(CHAT, GREEDY)[0].token_ids == first.generate(CHAT, GREEDY)[0].token_ids
    tiny_gguf.touch()  # a changed file is converted afresh
    third = Engine(EngineConfig(model=str(tiny_gguf), num_kv_blocks=64))
    assert third.loaded.loaded_from == tiny_gguf


def test_a_hub_like_name_that_is_not_a_repo_id_is_refused_in_words(tmp_path, monkeypatch):
    from engine.models.sources import hub_snapshot

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError, match=r"no model at 'a/\.\.'"):
        resolve_source("a/..")
    with pytest.raises(ModelLoadError, match=r"'a/\.\.' is not a valid Hugging Face repo id"):
        hub_snapshot("a/..", download=False)
