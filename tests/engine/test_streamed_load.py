"""Safetensors loads that quantise tensor by tensor give the same model as loading whole, then quantising.

The reference is the path the streamed loader replaces: ``from_pretrained`` in the compute dtype, then
:func:`quantize_model`: every stored tensor (codes, scales, biases, norms, embeddings) must be identical, and
so must the logits where the layers are Kvasir's own (bitsandbytes' CPU layers repack their weights on the
first call, which can move the last bits of a result). Sharded checkpoints (a layer's weight and bias in different
shards), tied embeddings, and checkpoints whose names the model does not use (which fall back to transformers)
are covered.
"""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from engine import Engine, EngineConfig, SamplingParams
from engine.models import loader
from engine.models.sources import resolve_source
from engine.models.streamed_weights import load_streamed, streams
from engine.step.quantization import quantize_model
from engine.tools.plain_attention import plain_attention
from tests.helpers.tiny_models import write_tiny_model

PROMPT = torch.tensor([[1, 417, 2091, 88, 5012, 903, 17, 4]])
CPU = torch.device("cpu")


def whole_then_quantised(folder, mode: str) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    quantize_model(model, mode, torch.float32, CPU)
    return model


def streamed(folder, mode: str) -> torch.nn.Module:
    model = load_streamed(resolve_source(str(folder)), mode, torch.float32, "sdpa", CPU)
    assert model is not None
    return model.eval()


def assert_same_model(streamed_model: torch.nn.Module, reference: torch.nn.Module, mode: str) -> None:
    ours, theirs = streamed_model.state_dict(), reference.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name
    if mode in ("int4", "w8", "none"):
        torch.testing.assert_close(logits(streamed_model), logits(reference), rtol=0, atol=0)


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad(), plain_attention(model) as reference:
        return reference(PROMPT).logits


@pytest.fixture(scope="module")
def sharded_qwen2(tmp_path_factory, tokenizer_dir):
    """qwen2 (q/k/v biases) in four shards dealt round-robin, so a layer's weight and bias sit in different
    files, some with the bias read first and some with the weight."""
    folder = tmp_path_factory.mktemp("sharded") / "qwen2"
    write_tiny_model("qwen2", folder, tokenizer_dir, seed=3)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    shards = [f"model-{i + 1:05d}-of-00004.safetensors" for i in range(4)]
    weight_map = {name: shards[i % 4] for i, name in enumerate(sorted(tensors))}
    for shard in shards:
        save_file({n: t for n, t in tensors.items() if weight_map[n] == shard}, folder / shard,
                  metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    order = {shard: i for i, shard in enumerate(shards)}
    q_bias = [n for n in weight_map if n.endswith("proj.bias")]
    first = {order[weight_map[n]] < order[weight_map[n.replace(".bias", ".weight")]] for n in q_bias}
    assert first == {True, False}, "the shards must hold biases both before and after their weights"
    return folder


@pytest.mark.parametrize("mode", ["int4", "w8", "nf4", "int8", "none"])
def test_streamed_equals_loading_whole_then_quantising(tiny_model_dirs, mode):
    folder = tiny_model_dirs["qwen2"]
    assert_same_model(streamed(folder, mode), whole_then_quantised(folder, mode), mode)


@pytest.mark.parametrize("mode", ["int4", "nf4"])
def test_sharded_checkpoint_streams_to_the_same_model(sharded_qwen2, mode):
    assert_same_model(streamed(sharded_qwen2, mode), whole_then_quantised(sharded_qwen2, mode), mode)


def test_tied_embeddings_stream(tmp_path, tokenizer_dir):
    folder = write_tiny_model("llama", tmp_path / "tied", tokenizer_dir, tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(folder / "model.safetensors")
    assert_same_model(streamed(folder, "w8"), whole_then_quantised(folder, "w8"), "w8")


def test_a_bare_decoder_checkpoint_streams_under_the_models_prefix(tmp_path, tokenizer_dir):
    """Names saved without "model." (a base model's checkpoint) land where transformers would put them."""
    folder = write_tiny_model("llama", tmp_path / "bare", tokenizer_dir)
    tensors = load_file(folder / "model.safetensors")
    save_file({name.removeprefix("model."): t for name, t in tensors.items()}, folder / "model.safetensors",
              metadata={"format": "pt"})
    assert_same_model(streamed(folder, "int4"), whole_then_quantised(folder, "int4"), "int4")


def test_models_that_keep_float32_modules_load_through_transformers(tiny_model_dirs, monkeypatch):
    from transformers import Phi3ForCausalLM

    folder = tiny_model_dirs["phi3"]  # the llama family's own tree keeps no module in float32
    monkeypatch.setattr(Phi3ForCausalLM, "_keep_in_fp32_modules", ["lm_head"])
    assert load_streamed(resolve_source(str(folder)), "int4", torch.float32, "sdpa", CPU) is None
    engine = Engine(EngineConfig(model=str(folder), quantization="int4", num_kv_blocks=32))
    with plain_attention(engine.loaded.model) as model:
        assert_same_model(model, whole_then_quantised(folder, "int4"), "int4")


def test_engine_streams_quantised_loads_and_never_holds_the_float_model(tiny_model_dirs, monkeypatch):
    """The engine's int4 load goes tensor by tensor: transformers' whole-model load is never called."""
    def refuse(*args, **kwargs):
        raise AssertionError("from_pretrained loaded the whole model")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", refuse)
    engine = Engine(EngineConfig(model=str(tiny_model_dirs["llama"]), quantization="int4", num_kv_blocks=32))
    out = engine.generate([[1, 2, 3, 4]], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 4


def test_which_loads_stream():
    assert streams("int4", CPU) and streams("nf4", CPU)
    assert not streams("none", CPU)  # a float CPU load maps the files as they are
    assert streams("none", torch.device("cuda"))  # on its way to a GPU, one tensor at a time


def test_load_progress_moves_while_streaming(tiny_model_dirs):
    seen = []
    loader.load_model(EngineConfig(model=str(tiny_model_dirs["llama"]), quantization="w8"), CPU, "sdpa",
                      lambda fraction, phrase: seen.append((fraction, phrase)))
    reading = [f for f, phrase in seen if phrase == "reading the weights into w8"]
    assert len(reading) > 5 and reading == sorted(reading)
    assert [f for f, _ in seen] == sorted(f for f, _ in seen)
