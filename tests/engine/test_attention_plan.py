"""One rule says which attention backend runs and with which KV block size, for the engine and the fit estimate."""

import pytest
import torch

from engine import EngineConfig
from engine.step import attention, flex_attention
from engine.step.attention_plan import backend_block_size, plan_attention

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


@pytest.fixture
def a_hopper_gpu(monkeypatch):
    """flash-attn importable, FlexAttention compilable, compute capability 9.0: what the planner asks of CUDA."""
    monkeypatch.setattr(attention, "flash_attn_available", lambda: True)
    monkeypatch.setattr(flex_attention, "flex_problem", lambda device: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))


def test_flash_attn_runs_256_token_blocks_and_says_so(a_hopper_gpu):
    plan = plan_attention(EngineConfig(), CUDA, 64, torch.bfloat16)
    assert (plan.backend, plan.block_size) == ("flash_attn", 256)
    assert "256-token KV blocks" in plan.reason and "block_size=16 asked" in plan.reason


def test_flex_on_cuda_runs_128_token_blocks_and_says_so(a_hopper_gpu):
    plan = plan_attention(EngineConfig(attention_backend="flex"), CUDA, 64, torch.bfloat16)
    assert (plan.backend, plan.block_size) == ("flex", 128)
    assert "128-token KV blocks" in plan.reason


def test_float32_on_cuda_falls_back_to_the_torch_path_with_the_blocks_asked_for(a_hopper_gpu):
    plan = plan_attention(EngineConfig(block_size=32), CUDA, 64, torch.float32)
    assert (plan.backend, plan.block_size) == ("torch", 32) and "float16 or bfloat16" in plan.reason


def test_the_cpu_keeps_the_blocks_asked_for():
    plan = plan_attention(EngineConfig(block_size=16), CPU, 64, torch.float32)
    assert (plan.backend, plan.block_size) == ("torch", 16) and "KV blocks" not in plan.reason


def test_block_sizes_round_up_to_what_the_kernel_takes():
    assert [backend_block_size("flash_attn", n, CUDA) for n in (16, 256, 300)] == [256, 256, 512]
    assert [backend_block_size("flex", n, CUDA) for n in (16, 128, 200)] == [128, 128, 256]
    assert backend_block_size("flex", 16, CPU) == 16 and backend_block_size("torch", 16, CUDA) == 16
