"""Choosing device, quantisation and attention backend on CUDA, checked on the CPU by standing in for the probes.

A bitsandbytes problem turns its modes off (with the reason), never the GPU; ``auto`` runs unquantised where the
model fits; flash-attn is chosen only where its kernel can run the model.
"""

import pytest
import torch

from engine import devices
from engine.errors import ModelLoadError
from engine.models.sources import resolve_source
from engine.step.attention import flash_attn_problem

CUDA = torch.device("cuda")
BROKEN = "bitsandbytes does not run on cuda (ImportError: libbitsandbytes_cuda128.so: cannot open shared object)"


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA device whose kernels run, without touching CUDA: only the probes are replaced."""
    monkeypatch.setattr(devices.torch.version, "cuda", "12.8")
    monkeypatch.setattr(devices.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(devices.torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    monkeypatch.setattr(devices, "cuda_kernel_problem", lambda device: None)
    return monkeypatch


def test_a_broken_bitsandbytes_never_costs_the_gpu(gpu):
    def probe(device):
        raise AssertionError("choosing the device must not probe bitsandbytes")

    gpu.setattr(devices, "bitsandbytes_problem", probe)
    assert devices.resolve_device("auto") == (CUDA, "CUDA GPU: Test GPU")
    assert devices.resolve_device("cuda")[0] == CUDA
    assert devices.choose_quantization("none", CUDA) == ("none", None)
    assert devices.choose_quantization("int4", CUDA) == ("int4", None)  # torch's kernel, no bitsandbytes


def test_a_broken_bitsandbytes_turns_4_bit_off_with_its_reason(gpu, tiny_llama):
    gpu.setattr(devices, "bitsandbytes_problem", lambda device: BROKEN)
    gpu.setattr(devices, "available_memory", lambda device: 1 << 20)  # bfloat16 does not fit
    source = resolve_source(str(tiny_llama))
    mode, note = devices.choose_quantization("auto", CUDA, source)
    assert mode == "none" and "4-bit quantisation is off" in note and "cannot open shared object" in note
    for asked in ("nf4", "fp4", "int8"):
        with pytest.raises(ModelLoadError, match=f"quantization '{asked}' needs bitsandbytes, but .*ImportError"):
            devices.choose_quantization(asked, CUDA, source)


def test_auto_on_cuda_runs_unquantised_where_the_model_fits(gpu, tiny_llama):
    gpu.setattr(devices, "bitsandbytes_problem", lambda device: None)
    source = resolve_source(str(tiny_llama))
    gpu.setattr(devices, "available_memory", lambda device: 80 << 30)
    assert devices.choose_quantization("auto", CUDA, source) == ("none", None)
    gpu.setattr(devices, "available_memory", lambda device: 1 << 20)
    assert devices.choose_quantization("auto", CUDA, source) == ("nf4", None)


def test_bitsandbytes_problems_keep_the_error_and_are_probed_once(monkeypatch):
    import engine.step.quantization as quantization

    calls = []

    def missing():
        calls.append(1)
        raise ImportError("No module named 'bitsandbytes'")

    monkeypatch.setattr(quantization, "import_bitsandbytes", missing)
    monkeypatch.setattr(devices, "_bitsandbytes_problems", {})
    device = torch.device("cuda:3")
    first = devices.bitsandbytes_problem(device)
    assert first == "bitsandbytes does not run on cuda:3 (ImportError: No module named 'bitsandbytes')"
    assert devices.bitsandbytes_problem(device) == first and len(calls) == 1


def test_a_failing_cuda_kernel_is_reported_in_its_own_words(monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("CUDA error: no kernel image is available for execution on the device\nmore")

    monkeypatch.setattr(devices.torch, "ones", fails)
    problem = devices.cuda_kernel_problem(CUDA)
    assert problem == ("a CUDA kernel failed on this GPU (RuntimeError: CUDA error: no kernel image is available "
                       "for execution on the device)")


@pytest.mark.parametrize("dtype, capability, head_dim, problem", [
    (torch.bfloat16, (9, 0), 128, None),
    (torch.float16, (8, 0), 256, None),
    (torch.float32, (9, 0), 64, "float16 or bfloat16, not float32"),
    (torch.bfloat16, (7, 5), 64, "compute capability 8.0 or newer; this GPU has 7.5"),
    (torch.bfloat16, (9, 0), 288, "head sizes up to 256 in multiples of 8; this model's is 288"),
    (torch.bfloat16, (9, 0), 100, "this model's is 100"),
])
def test_flash_attn_is_chosen_only_where_its_kernel_runs(dtype, capability, head_dim, problem):
    found = flash_attn_problem(dtype, capability, head_dim)
    assert found == problem if problem is None else problem in found
