"""CUDA checks (skipped without a GPU): parity on the device, and the flash-attn backend against torch's."""

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.step.attention import flash_attn_available
from tests.helpers.oracle import load_reference

pytestmark = pytest.mark.gpu

PROMPTS = ["hello there", "a much longer prompt about paged attention and blocks " * 4, "short"]


def test_cuda_float32_parity_with_generate(tiny_llama):
    engine = Engine(EngineConfig(model=str(tiny_llama), device="cuda", dtype="float32",
                                 attention_backend="torch", num_kv_blocks=256))
    reference = load_reference(tiny_llama).to("cuda")
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    for prompt, out in zip(PROMPTS, engine.generate(PROMPTS, params)):
        ids = engine.encode_prompt(prompt)
        want = reference.generate(torch.tensor([ids], device="cuda"), max_new_tokens=32, do_sample=False,
                                  min_new_tokens=32, pad_token_id=0)[0, len(ids):].tolist()
        assert out.token_ids == want


@pytest.mark.skipif(not flash_attn_available(), reason="flash-attn is not installed")
def test_flash_attn_backend_agrees_with_torch_backend(tiny_llama):
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    flash = Engine(EngineConfig(model=str(tiny_llama), device="cuda", dtype="bfloat16", num_kv_blocks=64))
    plain = Engine(EngineConfig(model=str(tiny_llama), device="cuda", dtype="bfloat16",
                                attention_backend="torch", num_kv_blocks=64, block_size=256))
    assert flash.stats().attention_backend == "flash_attn" and flash.block_size % 256 == 0
    got = [o.token_ids[:8] for o in flash.generate(PROMPTS, params)]
    want = [o.token_ids[:8] for o in plain.generate(PROMPTS, params)]
    assert got == want
