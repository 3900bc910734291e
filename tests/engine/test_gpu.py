"""CUDA checks (skipped without a GPU): parity on the device, the flash-attn backend against torch's, and CUDA-graph
decode steps against eager ones."""

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.step.attention import flash_attn_available
from engine.tools.gpu_check import first_token_logits
from tests.helpers.oracle import load_reference

pytestmark = pytest.mark.gpu

PROMPTS = ["hello there", "a much longer prompt about paged attention and blocks " * 4, "short"]


def test_cuda_float32_parity_with_generate(tiny_llama):
    engine = Engine(EngineConfig(model=str(tiny_llama), device="cuda", dtype="float32", quantization="none",
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
    """bfloat16 greedy tokens may part after a dozen steps, so the logits are compared, with a tolerance:
    a 300-token prompt in 64-token chunks, then a prompt whose first 256 tokens are a prefix-cache hit."""
    long = "a much longer prompt about paged attention and blocks " * 30
    prompts = [long, long + " and one more question", "short"]
    settings = dict(model=str(tiny_llama), device="cuda", dtype="bfloat16", quantization="none",
                    num_kv_blocks=64, block_size=256, max_num_batched_tokens=64)
    flash = Engine(EngineConfig(**settings))
    plain = Engine(EngineConfig(**settings, attention_backend="torch"))
    assert flash.stats().attention_backend == "flash_attn", flash.stats().attention_reason
    got, want = first_token_logits(flash, prompts), first_token_logits(plain, prompts)
    assert flash.stats().cached_prompt_tokens_total >= 256
    for g, w in zip(got, want):
        assert torch.nn.functional.cosine_similarity(g, w, dim=0) > 0.999
        assert float((g - w).abs().max()) <= 0.05 * float(w.abs().max())
        assert int(g.argmax()) == int(w.argmax())


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_cuda_graph_decode_equals_eager_decode(tiny_model_dirs, arch):
    """Real captures: 3 and 5 chats (padded to 4 and 8) whose replies cross block-table width buckets."""
    prompts = PROMPTS + ["four", "and a fifth, which wants to know about graphs"]
    settings = dict(model=str(tiny_model_dirs[arch]), device="cuda", dtype="float32", quantization="none",
                    attention_backend="torch", num_kv_blocks=64)
    graphs, eager = Engine(EngineConfig(**settings)), Engine(EngineConfig(**settings, cuda_graphs=False))
    params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (40, 12, 30, 7, 21)]
    for batch in (prompts[:3], prompts):
        got = [o.token_ids for o in graphs.generate(batch, params[: len(batch)])]
        assert got == [o.token_ids for o in eager.generate(batch, params[: len(batch)])]
    stats = graphs.stats()
    assert stats.cuda_graphs >= 3 and stats.cuda_graphs_reason == "" and stats.cuda_graph_memory_bytes > 0
    assert eager.stats().cuda_graphs == 0 and "turned off" in eager.stats().cuda_graphs_reason
