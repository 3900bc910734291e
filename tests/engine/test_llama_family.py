"""The engine's own module tree for the llama family holds transformers' weights under transformers' names and
computes what transformers' modules compute: the same logits through the lean decoder, the same rotations for
every rope type, and transformers' own forward pass over it (the tools' oracle)."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from engine import Engine, EngineConfig
from engine.models.llama_family import LlamaFamilyModel, RMSNorm, RotaryEmbedding, transformers_view
from engine.models.skeleton import empty_model, unfilled
from engine.step.attention import SequenceSlice, build_metadata
from engine.step.float_linear import use_few_rows_kernel
from engine.step.lean_decoder import LeanDecoder
from tests.helpers.tiny_models import ARCHITECTURES, COMMON

FAMILY = ["llama", "qwen2", "qwen3", "mistral"]


def _randomised(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter random, norms and biases included, so a weight in the wrong place changes the logits."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            scale = 1.0 if "embed" in name else 0.3 if param.dim() == 1 else 0.08
            base = 1.0 if "norm" in name else 0.0
            param.copy_(base + scale * torch.randn(param.shape, generator=generator))
    return model


def _config(arch: str, **overrides):
    return AutoConfig.for_model(arch, **{**COMMON, **ARCHITECTURES[arch], **overrides})


def _ours_over(reference: torch.nn.Module) -> LlamaFamilyModel:
    ours = LlamaFamilyModel(reference.config, torch.float32)
    ours.load_state_dict(reference.state_dict(), strict=True, assign=True)
    use_few_rows_kernel(ours, torch.device("cpu"))  # the same linear arithmetic as the loaded reference
    return ours


@pytest.mark.parametrize("arch", FAMILY)
def test_the_tree_has_transformers_names_shapes_and_dtypes(arch):
    config = _config(arch, attention_bias=True, mlp_bias=True)  # the architectures' own rules pick the biases
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    ours = LlamaFamilyModel(config, torch.bfloat16)
    theirs = {name: (tuple(t.shape), t.dtype) for name, t in reference.state_dict().items()}
    mine = {name: (tuple(t.shape), t.dtype) for name, t in ours.state_dict().items()}
    assert mine == theirs
    assert unfilled(ours) == [name for name in mine]  # every weight waits for a loader; buffers are real
    assert torch.equal(ours.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)


def test_empty_model_builds_the_family_here_and_transformers_for_the_rest():
    assert type(empty_model(_config("qwen3"), torch.float32, "sdpa")) is LlamaFamilyModel
    assert type(empty_model(_config("phi3"), torch.float32, "sdpa")).__name__ == "Phi3ForCausalLM"
    assert type(empty_model(_config("llama", hidden_act="gelu"), torch.float32, "sdpa")).__name__ == \
        "LlamaForCausalLM"


@pytest.mark.parametrize("arch", FAMILY)
@torch.inference_mode()
def test_the_lean_decoder_computes_the_same_logits_over_either_tree(tiny_model_dirs, arch):
    engine = Engine(EngineConfig(model=str(tiny_model_dirs[arch]), quantization="none", num_kv_blocks=16,
                                 dtype="float32"))
    reference = _randomised(engine.loaded.model, seed=len(arch))
    ours = _ours_over(reference)
    ids = torch.tensor(engine.encode_prompt("the module tree must not change a single logit"))
    rows = torch.tensor([0, len(ids) // 2, len(ids) - 1])

    def logits(model):
        meta = build_metadata(engine.kv_cache, [SequenceSlice(0, 0, len(ids), [3, 4])], engine.device, "torch",
                              torch.float32)
        return LeanDecoder(model)(ids, meta, rows)

    expected = logits(reference)
    assert torch.equal(logits(ours), expected)
    torch.testing.assert_close(engine.runner._transformers_forward(
        ids, build_metadata(engine.kv_cache, [SequenceSlice(0, 0, len(ids), [3, 4])], engine.device, "torch",
                            torch.float32), rows), expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("rope", [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 256},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
])
def test_every_rope_type_rotates_as_transformers_does(rope):
    config = _config("llama", rope_parameters={"rope_theta": 10000.0, **rope})
    reference = AutoModelForCausalLM.from_config(config).model.rotary_emb
    ours = RotaryEmbedding(config)
    x = torch.randn(1, 5, 64)
    for positions in (torch.arange(40)[None], torch.arange(3000, 3040)[None], torch.arange(7)[None]):
        for mine, theirs in zip(ours(x, positions), reference(x, positions), strict=True):
            assert torch.equal(mine, theirs)  # dynamic: grown past 2048 positions, then back


def test_rms_norm_matches_in_low_precision():
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    reference = LlamaRMSNorm(48, eps=1e-5).to(torch.bfloat16)
    ours = RMSNorm(48, 1e-5, torch.bfloat16)
    ours.weight = torch.nn.Parameter(torch.randn(48, dtype=torch.bfloat16))
    reference.weight = ours.weight
    x = torch.randn(3, 48, dtype=torch.bfloat16) * 40
    assert torch.equal(ours(x), reference(x))


@torch.inference_mode()
def test_transformers_view_runs_transformers_forward_over_the_same_weights():
    reference = _randomised(AutoModelForCausalLM.from_config(_config("qwen3", tie_word_embeddings=True)), 7)
    reference.tie_weights()
    use_few_rows_kernel(reference, torch.device("cpu"))  # as the loader does, and as _ours_over does to ours
    ours = _ours_over(reference)
    ours.tie_weights()
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    view = transformers_view(ours)
    assert view.lm_head is ours.lm_head and view.model.layers[1].mlp.up_proj is ours.model.layers[1].mlp.up_proj
    ids = torch.tensor([[5, 99, 1000, 7, 42]])
    assert torch.equal(view(ids).logits, reference(ids).logits)
    with pytest.raises(TypeError, match="transformers_view"):
        ours(ids)
