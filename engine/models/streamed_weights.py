"""Loading a safetensors model tensor by tensor, each linear layer quantised and placed as it arrives.

``from_pretrained`` builds the whole model in the compute dtype in host memory before it can be quantised or
moved: a 70B model in nf4 would need ~140 GB of RAM on its way to a GPU that holds it in 40, and an int4 model
on the CPU would peak at four times its packed size. Here the skeleton is built on ``meta``
(:mod:`.skeleton`), then each tensor is read from its shard, cast to the compute dtype, quantised if it is a
linear weight, and put on the device at once. Host memory holds one tensor beyond what stays.

Checkpoints whose tensor names are the model's own parameter names (or lack only the base model's prefix)
are streamed; others (renamed keys, modules kept in float32) go through transformers, whole, as before.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

from ..config import PACKED_MODES
from ..errors import ModelLoadError
from ..step.quantization import pack_output_head, quantized_layer
from .memory import return_freed_memory
from .skeleton import empty_model, named_linears, unfilled
from .sources import ModelSource
from .weights_check import HARMLESS_EXTRA, safetensors_header, weight_files

TRIM_EVERY = 16  # tensors read between hand-backs of freed memory
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}

def streams(quantization: str, device: torch.device) -> bool:
    """Whether a safetensors load for ``quantization`` on ``device`` goes tensor by tensor: whenever the
    weights change form (quantised) or place (a GPU) on the way; a plain CPU load maps the files as they are."""
    return quantization != "none" or device.type != "cpu"


def load_streamed(source: ModelSource, quantization: str, dtype: torch.dtype, attn: str, device: torch.device,
                  progress: Callable[[float], None] | None = None) -> nn.Module | None:
    """``source`` built tensor by tensor on ``device``; None when its names are not the model's own."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(source.folder, trust_remote_code=False)
        model = empty_model(config, dtype, attn)
    except Exception as exc:
        raise ModelLoadError(f"could not build {source.name} from its config: {exc}") from exc
    files = weight_files(source.folder)
    stored = {name: kind for file in files for name, (_, kind, _) in safetensors_header(file).items()}
    targets = _targets(model, stored)
    if targets is None:
        return None
    try:
        _fill(model, files, targets, quantization, dtype, device, progress)
    except (RuntimeError, ValueError, OSError) as exc:
        raise ModelLoadError(f"could not load the weights of {source.name}: {exc}") from exc
    model.tie_weights()
    if quantization in PACKED_MODES:
        pack_output_head(model, device)
    missing = unfilled(model)
    if missing:
        raise ModelLoadError(f"{source.name}: the weights have no tensor for {', '.join(missing[:5])}")
    return model


def _targets(model: nn.Module, stored: dict[str, str]) -> dict[str, str] | None:
    """Stored name -> the model's parameter name: the same, or with the base model's prefix ("model.") that
    checkpoints of a bare decoder leave out. None when a name has no place, a dtype has no torch type here,
    or a module must stay float32. Tensors transformers skips too (old rotary tables) are left out."""
    if getattr(model, "_keep_in_fp32_modules", None):
        return None
    if any(kind not in SAFETENSORS_DTYPES for kind in stored.values()):
        return None
    own = set(model.state_dict())
    prefix = f"{model.base_model_prefix}." if getattr(model, "base_model_prefix", "") else ""
    targets = {}
    for name in stored:
        if HARMLESS_EXTRA.search(name):
            continue
        target = name if name in own else prefix + name
        if target not in own:
            return None
        targets[name] = target
    return targets


def _fill(model: nn.Module, files, targets: dict[str, str], quantization: str, dtype: torch.dtype,
          device: torch.device, progress: Callable[[float], None] | None) -> None:
    """Read every tensor once; linear layers become ``quantization`` layers as soon as their weight (and bias)
    are in; everything else is assigned in ``dtype`` on ``device``."""
    linears = named_linears(model) if quantization != "none" else {}
    waiting: dict[str, dict[str, torch.Tensor]] = {}  # a linear layer's weight or bias read before the other
    state: dict[str, torch.Tensor] = {}
    done = 0
    for file in files:
        for stored, tensor in read_safetensors(file):
            name = targets.get(stored)
            if name is None:
                continue
            tensor = tensor.to(dtype)
            module, _, kind = name.rpartition(".")
            if module in linears and kind in ("weight", "bias"):
                waiting.setdefault(module, {})[kind] = tensor
                _replace_when_complete(linears, waiting, module, quantization, dtype, device)
            else:
                state[name] = tensor.to(device)
            del tensor
            done += 1
            if done % TRIM_EVERY == 0:
                return_freed_memory()  # freed float tensors back to the system, not kept by the allocator
            if progress:
                progress(done / len(targets))
    model.load_state_dict(state, strict=False, assign=True)
    return_freed_memory()


def read_safetensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of ``file`` (in file order), read into memory of its own.

    Plain reads rather than a memory map: a mapped file's pages count as the process's resident memory until
    it is closed, so a mapped checkpoint would look (and, under pressure, act) as large as the whole file.
    """
    entries = sorted(safetensors_header(file).items(), key=lambda item: item[1][2][0])
    with open(file, "rb", buffering=0) as f:
        start = 8 + struct.unpack("<Q", f.read(8))[0]
        for name, (shape, kind, (begin, end)) in entries:
            tensor = torch.empty(shape, dtype=SAFETENSORS_DTYPES[kind])
            view = memoryview(tensor.view(-1).view(torch.uint8).numpy()) if tensor.numel() else memoryview(b"")
            f.seek(start + begin)
            if f.readinto(view) != end - begin:
                raise OSError(f"{file.name} ends inside tensor {name!r}")
            yield name, tensor


def _replace_when_complete(linears, waiting, module: str, quantization: str, dtype: torch.dtype,
                           device: torch.device) -> None:
    parent, attribute, layer = linears[module]
    parts = waiting[module]
    if "weight" not in parts or (layer.bias is not None and "bias" not in parts):
        return
    setattr(parent, attribute, quantized_layer(parts["weight"], parts.get("bias"), quantization, dtype, device))
    del linears[module], waiting[module]
