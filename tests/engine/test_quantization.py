"""Each quantisation mode on the CPU: bitsandbytes layers, greedy parity with generate, memory that falls."""

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.models.fit import estimate
from engine.step.quantization import import_bitsandbytes
from tests.helpers.oracle import reference_greedy

bnb = import_bitsandbytes()
LAYER_TYPE = {"none": torch.nn.Linear, "int8": bnb.nn.Linear8bitLt, "nf4": bnb.nn.Linear4bit, "fp4": bnb.nn.Linear4bit}


@pytest.fixture(scope="module")
def engines(tiny_model_dirs):
    folder = tiny_model_dirs["qwen2"]  # has q/k/v biases too
    return {mode: Engine(EngineConfig(model=str(folder), quantization=mode, num_kv_blocks=128)) for mode in LAYER_TYPE}


@pytest.mark.parametrize("mode", list(LAYER_TYPE))
def test_linear_layers_are_swapped_and_the_rest_is_kept(engines, mode):
    model = engines[mode].loaded.model
    attn = model.model.layers[0].self_attn
    assert type(attn.q_proj) is LAYER_TYPE[mode] and type(model.model.layers[1].mlp.down_proj) is LAYER_TYPE[mode]
    assert type(model.lm_head) is torch.nn.Linear and model.lm_head.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32
    if mode == "nf4" or mode == "fp4":
        assert attn.q_proj.weight.quant_type == mode and attn.q_proj.weight.dtype == torch.uint8
    assert engines[mode].stats().quantization == mode


@pytest.mark.parametrize("mode", ["int8", "nf4", "fp4"])
def test_greedy_parity_with_generate_on_the_same_quantised_modules(engines, mode):
    engine = engines[mode]
    prompts = [engine.encode_prompt([{"role": "user", "content": text}])
               for text in ("one two three", "a much longer message about rivers and mountains " * 3, "hi")]
    outputs = engine.generate(prompts, SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))
    model = engine.loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        for prompt, out in zip(prompts, outputs):
            assert out.token_ids == reference_greedy(model, prompt, 24)
    finally:
        model.set_attn_implementation(previous)


def test_quantised_output_differs_from_full_precision_but_stays_close(engines):
    """The swap really happened (outputs change), yet the model still computes nearly the same thing."""
    prompt = [[{"role": "user", "content": "compare the modes"}]]
    logits = {}
    for mode, engine in engines.items():
        ids = torch.tensor([engine.encode_prompt(prompt[0])])
        with torch.inference_mode():
            model = engine.loaded.model
            previous = model.config._attn_implementation
            model.set_attn_implementation("sdpa")
            logits[mode] = model(ids).logits[0, -1]
            model.set_attn_implementation(previous)
    for mode in ("int8", "nf4", "fp4"):
        assert not torch.equal(logits[mode], logits["none"])
        cos = torch.nn.functional.cosine_similarity(logits[mode], logits["none"], dim=0)
        assert cos > 0.95


def test_weight_memory_falls_nf4_below_int8_below_float32(engines, tiny_model_dirs):
    memory = {mode: engine.stats().model_memory_bytes for mode, engine in engines.items()}
    assert memory["nf4"] < memory["int8"] < memory["none"]
    assert memory["nf4"] == memory["fp4"]
    folder = str(tiny_model_dirs["qwen2"])
    for mode, measured in memory.items():
        predicted = estimate(EngineConfig(model=folder, quantization=mode)).weight_bytes
        assert abs(predicted - measured) <= 0.1 * measured, mode


def test_peak_load_memory_is_reported(engines):
    assert all(engine.stats().peak_load_bytes >= 0 for engine in engines.values())
    assert engines["none"].stats().peak_load_bytes > 0
