"""Choosing the device, the compute dtype and the quantisation, with the reason in words."""

from __future__ import annotations

import contextlib
import functools
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import torch

from .config import BITSANDBYTES_MODES
from .errors import ModelLoadError
from .models.sizes import MEMORY_SHARE, float_weight_bytes, kv_bytes_per_token

NVIDIA_DRIVER_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU while NVIDIA's Linux driver is loaded


def cpu_name() -> str:
    """The CPU's model name as the OS gives it (benchmarks name the CPU they ran on)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def resolve_device(spec: str) -> tuple[torch.device, str]:
    """The device to run on, and in words why (useful when it is the CPU)."""
    if spec == "cpu":
        return torch.device("cpu"), "the CPU was chosen in the settings"
    if torch.version.cuda is None:
        gpu = nvidia_gpu()
        reason = "torch was built without CUDA" if gpu is None else cpu_build_hint(gpu)
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


def cpu_build_hint(gpu: str) -> str:
    """What the device label says when a CPU-only build runs on a machine with an NVIDIA GPU."""
    if getattr(sys, "frozen", False):
        return (f"no CUDA in this build, but this computer has an {gpu}: "
                "Kvasir's CUDA build (the -cuda download) uses it")
    return f"torch was built without CUDA, but this computer has an {gpu}: 'make install' installs the CUDA torch"


@functools.cache
def nvidia_gpu() -> str | None:
    """The first NVIDIA GPU's name when the machine has one (even if this torch can't use it), else None.

    Read from the driver's /proc files on Linux, else from ``nvidia-smi -L``; once per process."""
    if sys.platform.startswith("linux"):
        for information in sorted(NVIDIA_DRIVER_GPUS.glob("*/information")):
            try:
                for line in information.read_text().splitlines():
                    if line.startswith("Model:"):
                        return line.split(":", 1)[1].strip()
            except OSError:
                continue
    if sys.platform == "darwin" or shutil.which("nvidia-smi") is None:
        return None
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    first = listing.stdout.strip().splitlines()[:1] if listing.returncode == 0 else []
    return first[0].split(":", 1)[1].split("(UUID")[0].strip() if first and ":" in first[0] else None


def cuda_kernel_problem(device: torch.device) -> str | None:
    """None when a small bfloat16 matmul runs on ``device``; else what failed, with the error's own words.

    bitsandbytes is not part of this probe: a bitsandbytes problem turns its modes off (see
    :func:`bitsandbytes_problem`), never the GPU.
    """
    try:
        a = torch.ones(8, 8, device=device, dtype=torch.bfloat16)
        (a @ a).sum().item()
    except Exception as exc:
        return f"a CUDA kernel failed on this GPU ({_in_words(exc)})"
    return None


_bitsandbytes_problems: dict[str, str | None] = {}


def bitsandbytes_problem(device: torch.device) -> str | None:
    """None when bitsandbytes imports and its 4-bit kernels run on ``device``; else why not (checked once)."""
    key = str(device)
    if key not in _bitsandbytes_problems:
        try:
            from .step.quantization import import_bitsandbytes

            functional = import_bitsandbytes().functional
            packed, state = functional.quantize_4bit(torch.ones(64, 64, device=device, dtype=torch.bfloat16))
            functional.dequantize_4bit(packed, state).sum().item()
            _bitsandbytes_problems[key] = None
        except Exception as exc:
            _bitsandbytes_problems[key] = f"bitsandbytes does not run on {key} ({_in_words(exc)})"
    return _bitsandbytes_problems[key]


def _in_words(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{exc.__class__.__name__}: {text[:200]}" if text else exc.__class__.__name__


def resolve_dtype(spec: str, device: torch.device) -> torch.dtype:
    """``auto``: bfloat16 on CUDA, float32 on the CPU."""
    if spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, spec)


def resolve_quantization(spec: str, device: torch.device, source=None, dtype: torch.dtype | None = None) -> str:
    """The quantisation to load with; see :func:`choose_quantization`."""
    return choose_quantization(spec, device, source, dtype)[0]


def choose_quantization(spec: str, device: torch.device, source=None, dtype: torch.dtype | None = None, *,
                        info=None, gguf_type: str | None = None) -> tuple[str, str | None]:
    """The quantisation for ``spec`` on ``device``, and a note for the user when ``auto`` had to settle.

    ``auto`` on CUDA: the compute dtype (bfloat16) when the weights fit with room for a full context of KV
    cache, else nf4; with bitsandbytes unusable, the compute dtype and a note saying why. On the CPU: the
    packed mode that fits a GGUF file's weights, else none. Measured on the default model (Q4_1) on a 2-core
    CPU, one chat decodes several times as fast in ``int4`` (the file's blocks, kept packed) as in ``none``.
    A bitsandbytes mode asked for by name on a GPU where bitsandbytes can't run is refused with the reason.

    A model not on disk yet (a Hub file before download) is described by ``info`` (its ModelInfo) and
    ``gguf_type`` (its GGUF quantisation by name, "Q4_K_M") instead of ``source``.
    """
    if spec != "auto":
        if device.type == "cuda" and spec in BITSANDBYTES_MODES and (problem := bitsandbytes_problem(device)):
            raise ModelLoadError(f"quantization {spec!r} needs bitsandbytes, but {problem}; "
                                 "choose 'none' or 'int4' instead")
        return spec, None
    if device.type == "cuda":
        if info is None and source is not None:
            from .models.model_info import read_model_info

            info = read_model_info(source)
        return _auto_on_cuda(device, info, dtype or torch.bfloat16)
    if gguf_type is not None:
        return packed_mode_for(gguf_type), None
    if source is not None and source.kind == "gguf":
        return _packed_mode_for_gguf(source), None
    return "none", None


def _auto_on_cuda(device: torch.device, info, dtype: torch.dtype) -> tuple[str, str | None]:
    if info is not None and _fits_unquantised(info, dtype, available_memory(device)):
        return "none", None
    if problem := bitsandbytes_problem(device):
        return "none", f"4-bit quantisation is off: {problem}"
    return "nf4", None


def _fits_unquantised(info, dtype: torch.dtype, free_bytes: int) -> bool:
    """Whether the weights in ``dtype`` and a full context of KV cache take at most 90% of ``free_bytes``."""
    needed = float_weight_bytes(info, dtype) + info.context_length * kv_bytes_per_token(info, dtype)
    return needed <= MEMORY_SHARE * free_bytes


def _packed_mode_for_gguf(source) -> str:
    from collections import Counter

    from gguf import GGMLQuantizationType

    from .models.gguf_info import read_gguf_info

    kinds = Counter(kind for _, kind in read_gguf_info(source.path).linear_tensors().values())
    if not kinds:
        return "none"
    return packed_mode_for(GGMLQuantizationType(kinds.most_common(1)[0][0]).name)


def packed_mode_for(gguf_type: str) -> str:
    """The packed mode for GGUF linear weights of ``gguf_type`` ("Q4_K", "Q8_0", "F16", ...): int4 for 4 bits
    or fewer, w8 for 5 to 8 bits, none for float weights."""
    name = gguf_type.upper()
    if name in ("F32", "F16", "BF16"):
        return "none"
    return "w8" if name.startswith(("Q5", "Q6", "Q8")) else "int4"


def available_memory(device: torch.device) -> int:
    """Free bytes on ``device`` (for the CPU: the system memory available without swapping, as psutil reports
    it; on Linux that is /proc/meminfo's MemAvailable)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)
