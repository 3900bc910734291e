"""The flash-attn path's metadata, run on the CPU through a stand-in with the kernel's signature and checks.

Greedy tokens equal the torch path's in float32, over chunked prefill and prefix-cache hits; the stand-in
refuses what flash-attn refuses, so a wrongly typed or shaped argument fails here rather than on a GPU.
"""


import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from tests.helpers import flash_stand_in

LONG = "a much longer prompt about paged attention and blocks, " * 24


@pytest.fixture
def stand_in(monkeypatch):
    return flash_stand_in.install(monkeypatch)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_flash_path_matches_the_torch_path(tiny_model_dirs, arch, stand_in):
    settings = dict(model=str(tiny_model_dirs[arch]), quantization="none", num_kv_blocks=16,
                    max_num_batched_tokens=64)
    flash = Engine(EngineConfig(**settings))
    assert flash.stats().attention_backend == "flash_attn" and flash.block_size == 256
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = [LONG, LONG + " and one more question", "short"]
    got = [flash.generate([p], params)[0].token_ids for p in prompts]  # one at a time: the second hits the cache
    assert stand_in.calls > 0 and flash.stats().cached_prompt_tokens_total >= 256
    plain = Engine(EngineConfig(**settings, attention_backend="torch", block_size=256))
    want = [plain.generate([p], params)[0].token_ids for p in prompts]
    assert got == want


def test_stand_in_refuses_what_flash_attn_refuses():
    attend = flash_stand_in.make_module().flash_attn_varlen_func
    q = torch.randn(4, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(2, 256, 2, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    table = torch.tensor([[0, 1]], dtype=torch.int32)
    attend(q, cache, cache, cu, torch.tensor([0, 300], dtype=torch.int32), 4, 300, causal=True, block_table=table)
    cases = [
        (dict(q=q.float()), "fp16 and bf16"),
        (dict(block_table=table.long()), "int32"),
        (dict(cu_seqlens_q=cu.long()), "int32"),
        (dict(k=cache[:, :16].contiguous(), v=cache[:, :16].contiguous()), "divisible by 256"),
        (dict(q=torch.randn(4, 3, 64, dtype=torch.bfloat16)), "divide number of heads"),
    ]
    base = dict(q=q, k=cache, v=cache, cu_seqlens_q=cu, cu_seqlens_k=torch.tensor([0, 300], dtype=torch.int32),
                max_seqlen_q=4, max_seqlen_k=300, causal=True, block_table=table)
    for change, said in cases:
        with pytest.raises(RuntimeError, match=said):
            attend(**{**base, **change})
