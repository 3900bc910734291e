"""The model library and its command line: add, list, info, fit, remove; and eval-quant's measures."""

import json
import math
import re

import pytest
import torch

from engine import Engine, EngineConfig, ModelLoadError
from engine.models.library import ModelLibrary
from engine.tools.cli import main
from engine.tools.evaluation import evaluate, perplexity


@pytest.fixture
def library(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path / "data"))
    return ModelLibrary()


def test_default_model_is_always_listed(library):
    (entry,) = library.entries()
    assert entry.builtin and entry.spec == "default"
    info = entry.info
    assert (info.architecture, info.context_length, info.licence) == ("llama", 8192, "apache-2.0")
    assert 130e6 < info.parameter_count < 140e6 and info.size_on_disk > 90e6


def test_add_describes_the_model_and_persists(library, tiny_model_dirs):
    entry = library.add(str(tiny_model_dirs["qwen3"]))
    assert entry.name == "qwen3" and entry.info.architecture == "qwen3"
    assert entry.info.num_layers == 2 and entry.info.num_kv_heads == 1 and entry.info.head_dim == 32
    engine = Engine(EngineConfig(model=entry.spec, num_kv_blocks=16))
    assert engine.stats().model_name == "qwen3"
    assert entry.info.parameter_count == sum(p.numel() for p in engine.loaded.model.parameters())
    again = ModelLibrary()  # a new instance reads the file
    assert [e.name for e in again.entries()] == ["SmolLM2-135M-Instruct", "qwen3"]
    assert library.add(str(tiny_model_dirs["qwen3"])).name == "qwen3"  # adding twice changes nothing
    assert len(library.entries()) == 2


def test_names_stay_unique_and_remove_forgets(library, tiny_model_dirs, tmp_path):
    import shutil

    copy = tmp_path / "other" / "qwen3"
    shutil.copytree(tiny_model_dirs["qwen3"], copy)
    library.add(str(tiny_model_dirs["qwen3"]))
    assert library.add(str(copy)).name == "qwen3-2"
    library.remove("qwen3")
    assert [e.name for e in library.entries()] == ["SmolLM2-135M-Instruct", "qwen3-2"]
    assert copy.is_dir()  # files are left alone
    with pytest.raises(ModelLoadError, match="can't be removed"):
        library.remove("SmolLM2-135M-Instruct")
    with pytest.raises(ModelLoadError, match="no model named 'nope'"):
        library.get("nope")


def test_bad_model_is_not_added(library, tmp_path):
    (tmp_path / "weights.pt").write_bytes(b"pickle")
    with pytest.raises(ModelLoadError, match="pickle"):
        library.add(str(tmp_path / "weights.pt"))
    assert len(library.entries()) == 1


def test_models_cli(library, tiny_model_dirs, capsys):
    assert main(["models", "add", str(tiny_model_dirs["llama"])]) == 0
    assert "added llama (llama" in capsys.readouterr().out
    assert main(["models", "list"]) == 0
    listing = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct" in listing and "llama" in listing
    assert main(["models", "fit", "llama", "--quant", "nf4", "--json"]) == 0
    fit = json.loads(capsys.readouterr().out)
    assert fit["quantization"] == "nf4" and fit["fits"] and fit["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 4
    assert main(["models", "info", "llama"]) == 0
    assert "fit nf4" in capsys.readouterr().out
    assert main(["models", "remove", "llama"]) == 0
    assert main(["models", "info", "llama"]) == 2


def test_perplexity_matches_a_direct_computation(tiny_llama):
    engine = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=16))
    text = "the river runs to the sea and the sea runs to the sky " * 30
    ids = torch.tensor([engine.tokenizer.encode(text, add_special_tokens=False)])
    model = engine.loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    with torch.inference_mode():
        logits = model(ids).logits[0, :-1]
    model.set_attn_implementation(previous)
    direct = math.exp(torch.nn.functional.cross_entropy(logits, ids[0, 1:]).item())
    assert perplexity(engine, text, window=1024, stride=512) == pytest.approx(direct, rel=1e-4)
    windowed = perplexity(engine, text, window=64, stride=32)  # less context per token, so a different value
    assert windowed != pytest.approx(direct, rel=1e-6) and windowed > 1


def test_eval_quant_measures_each_mode(tiny_model_dirs):
    results = evaluate(str(tiny_model_dirs["llama"]), "cpu", ("none", "nf4"), progress=lambda m: None)
    assert [r.mode for r in results] == ["none", "nf4"]
    assert results[1].weight_bytes < results[0].weight_bytes
    assert all(r.perplexity > 1 and r.decode_tokens_per_s > 0 for r in results)
    assert results[0].perplexity != results[1].perplexity


def _index_with(library, **changes) -> dict:
    """A valid one-model index, with ``changes`` made to the model's ``info``."""
    info = {"name": "m", "architecture": "llama", "parameter_count": 10, "linear_parameter_count": 8,
            "linear_rows": 4, "context_length": 64, "num_layers": 2, "num_kv_heads": 1, "head_dim": 4,
            "size_on_disk": 100, "source": "/m", "kind": "hf", "licence": None}
    info.update(changes)
    return {"version": 1, "models": [{"spec": "/m", "info": {k: v for k, v in info.items() if v != "DROP"},
                                      "added": 1.0}]}


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{not json", "it is not valid JSON"),
        ("", "it is not valid JSON"),
        ("[1, 2]", "it is not a JSON object"),
        ('{"models": []}', "its version is None"),
        ('{"version": 1, "models": {}}', "'models' is not a list"),
        ('{"version": 1, "models": [7]}', "model 0 is not an object"),
        ('{"version": 1, "models": [{"spec": "/m", "added": 1.0}]}', r"model 0 lacks the field\(s\) info"),
        (dict(future_field=1), r"model 0 \(/m\): its info has the unknown field\(s\) future_field"),
        (dict(head_dim="DROP"), r"model 0 \(/m\): its info lacks the field\(s\) head_dim"),
        (dict(num_layers="2"), r"model 0 \(/m\): its info has num_layers = '2', which is not a whole number"),
        (dict(num_layers=True), r"model 0 \(/m\): its info has num_layers = True, which is not a whole number"),
    ],
)
def test_a_damaged_index_is_refused_in_words_and_never_overwritten(library, tiny_llama, content, reason):
    from engine.errors import LibraryError

    library.root.mkdir(parents=True)
    text = content if isinstance(content, str) else json.dumps(_index_with(library, **content))
    library.index.write_text(text)
    said = f"the model library {re.escape(str(library.index))} is damaged: {reason}"
    for attempt in (library.entries, lambda: library.add(str(tiny_llama)), lambda: library.remove("m")):
        with pytest.raises(LibraryError, match=said):
            attempt()
    assert library.index.read_text() == text


def test_move_aside_keeps_the_damaged_index_and_starts_clean(library, tiny_llama):
    from engine.errors import LibraryError

    library.root.mkdir(parents=True)
    library.index.write_text("{damaged")
    with pytest.raises(LibraryError):
        library.entries()
    kept = library.move_aside()
    assert kept.parent == library.root and kept.name.startswith("library.json.damaged-")
    assert kept.read_text() == "{damaged" and not library.index.exists()
    assert [e.name for e in library.entries()] == ["SmolLM2-135M-Instruct"]
    library.add(str(tiny_llama))
    assert [e.name for e in ModelLibrary().entries()] == ["SmolLM2-135M-Instruct", "llama"]
    library.index.write_text("{damaged again")
    assert library.move_aside() != kept and kept.read_text() == "{damaged"  # an earlier one is not replaced


def test_an_index_from_a_newer_kvasir_is_refused_and_kept(library):
    from engine.errors import LibraryError

    library.root.mkdir(parents=True)
    library.index.write_text('{"version": 2, "models": []}')
    with pytest.raises(LibraryError, match="written by a newer Kvasir"):
        library.entries()
    assert library.index.read_text() == '{"version": 2, "models": []}'


def test_an_index_too_large_to_be_one_is_refused_before_it_is_read(library, monkeypatch):
    from engine.errors import LibraryError

    library.root.mkdir(parents=True)
    with library.index.open("wb") as index:
        index.truncate(1024**3)  # 1 GiB, sparse: no disk used, and never read
    monkeypatch.setattr(type(library.index), "read_bytes", lambda self: pytest.fail("the whole index was read"))
    with pytest.raises(LibraryError, match=r"is damaged: it is 1,024 MiB, and an index is never more than 16 MiB"):
        library.entries()
