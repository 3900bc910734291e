"""Choosing the device, the compute dtype and the quantisation, with the reason in words."""

from __future__ import annotations

import torch

from .errors import ModelLoadError


def resolve_device(spec: str) -> tuple[torch.device, str]:
    """The device to run on, and in words why (useful when it is the CPU)."""
    if spec == "cpu":
        return torch.device("cpu"), "the CPU was chosen in the settings"
    if torch.version.cuda is None:
        reason = "torch was built without CUDA"
    elif not torch.cuda.is_available():
        reason = "no CUDA GPU found"
    else:
        device = torch.device("cuda" if spec == "auto" else spec)
        problem = cuda_kernel_problem(device)
        if problem is None:
            return device, f"CUDA GPU: {torch.cuda.get_device_name(device)}"
        reason = problem
    if spec != "auto":
        raise ModelLoadError(f"device {spec!r} was asked for, but {reason}")
    return torch.device("cpu"), reason


def cuda_kernel_problem(device: torch.device) -> str | None:
    """None when a small matmul and a bitsandbytes 4-bit kernel run on ``device``; else what failed."""
    try:
        a = torch.ones(8, 8, device=device, dtype=torch.bfloat16)
        (a @ a).sum().item()
    except Exception as exc:
        return f"a CUDA kernel failed on this GPU ({exc.__class__.__name__})"
    try:
        from .step.quantization import import_bitsandbytes

        functional = import_bitsandbytes().functional
        packed, state = functional.quantize_4bit(torch.ones(64, 64, device=device, dtype=torch.bfloat16))
        functional.dequantize_4bit(packed, state).sum().item()
    except Exception:
        return "bitsandbytes has no kernels for this GPU"
    return None


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 on the CPU."""
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, spec)


def resolve_quantization(spec: str, device: torch.device) -> str:
    """``auto``: nf4 on CUDA, none on the CPU."""
    if spec == "auto":
        return "nf4" if device.type == "cuda" else "none"
    return spec


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device`` (system memory for the CPU)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
