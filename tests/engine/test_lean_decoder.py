"""The lean forward pass computes what transformers' own modules compute, for every architecture it takes."""

import pytest
import torch

from engine import Engine, EngineConfig
from engine.step.attention import SequenceSlice, build_metadata


@pytest.fixture(scope="module")
def engines(tiny_model_dirs):
    return {arch: Engine(EngineConfig(model=str(folder), num_kv_blocks=16, dtype="float32"))
            for arch, folder in tiny_model_dirs.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
@torch.inference_mode()
def test_lean_logits_equal_the_transformers_modules(engines, arch):
    engine = engines[arch]
    runner = engine.runner
    assert runner.lean is not None
    ids = torch.tensor(engine.encode_prompt("the lean path must agree with the modules, token by token"))
    meta = build_metadata(runner.kv_cache, [SequenceSlice(0, 0, len(ids), [3, 4])], runner.device, "torch",
                          torch.float32)
    rows = torch.tensor([0, len(ids) // 2, len(ids) - 1])
    lean = runner.lean(ids, meta, rows)
    modules = runner._transformers_forward(ids, meta, rows)
    assert lean.shape == (3, engine.loaded.model.config.vocab_size)
    torch.testing.assert_close(lean, modules, rtol=0, atol=1e-5)


def test_other_architectures_keep_the_transformers_path(engines):
    assert engines["phi3"].runner.lean is None  # fused projections: not the llama layout
