"""How the KV cache stores a key or value: its formats, what a token costs in each, and the one rule for each
format's writing and reading.

- ``float32``, ``bfloat16``, ``float16``: the values rounded to that type (round to nearest even).
- ``q8_0``: as llama.cpp's ``q8_0``: every 32 consecutive values of a head share one float16 scale
  ``d = max|x| / 127`` and are stored as the int8 ``round(x / d)``; read back as ``q * d``. 34 bytes per 32
  values against 128 in float32. The native CPU kernels (``kernels/layer_ops.cpp``) write and read the same
  bytes by the same arithmetic.
- ``fp8``: float8 e4m3 (one tensor-wide scale of 1, as vLLM's default), values clamped to its range (448); on
  CUDA only, where it is a native type.

``auto`` is resolved by :func:`choose_kv_format` from what was measured for the model (``eval-quant``'s KV
rows, kept by :mod:`engine.models.kv_verdicts`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import KV_CACHE_DTYPES

Q8_GROUP = 32  # values that share one q8_0 scale
Q8_MAX = 127
FP8_MAX = 448.0  # float8 e4m3's largest finite value


@dataclass(frozen=True, slots=True)
class KVFormat:
    """One way of storing the cache: the element type of the value tensors and whether q8_0 scales go beside."""

    name: str
    storage: torch.dtype
    scaled: bool = False  # one float16 scale per Q8_GROUP values (q8_0)

    def bytes_per_values(self, count: int) -> int:
        """Bytes that ``count`` values of one head take (``count`` a multiple of Q8_GROUP when scaled)."""
        element = torch.empty((), dtype=self.storage).element_size()
        return count * element + (count // Q8_GROUP * 2 if self.scaled else 0)

    def problem(self, head_dim: int, device: torch.device) -> str | None:
        """Why this format can't hold a model of ``head_dim`` on ``device`` (None when it can)."""
        if self.scaled and head_dim % Q8_GROUP:
            return f"q8_0 stores {Q8_GROUP}-value groups; this model's head size is {head_dim}"
        if self.name == "fp8" and device.type != "cuda":
            return "fp8 is a native type on CUDA only; on the CPU q8_0 is the 8-bit cache"
        return None


FORMATS = {
    "float32": KVFormat("float32", torch.float32),
    "bfloat16": KVFormat("bfloat16", torch.bfloat16),
    "float16": KVFormat("float16", torch.float16),
    "q8_0": KVFormat("q8_0", torch.int8, scaled=True),
    "fp8": KVFormat("fp8", torch.float8_e4m3fn),
}
SMALLEST_FIRST = ("q8_0", "fp8", "bfloat16", "float16", "float32")  # the order auto tries them in


def format_for(name: str, compute_dtype: torch.dtype) -> KVFormat:
    """The format named ``name`` (``auto`` here means the compute dtype: no rounding at all)."""
    if name == "auto":
        return FORMATS[str(compute_dtype).removeprefix("torch.")]
    if name not in FORMATS:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, not {name!r}")
    return FORMATS[name]


def choose_kv_format(wanted: str, compute_dtype: torch.dtype, head_dim: int, device: torch.device,
                     passing: frozenset[str] | None) -> tuple[KVFormat, str]:
    """The format for ``wanted`` and why (the stats' line). ``passing``: the formats whose measured quality and
    speed on this model met the thresholds (:mod:`engine.models.kv_verdicts`), None when nothing was measured.

    ``auto`` takes the smallest passing format this model and device can hold, else the compute dtype. A format
    asked for by name that can't run here raises ``ValueError`` with the reason.
    """
    if wanted != "auto":
        chosen = format_for(wanted, compute_dtype)
        problem = chosen.problem(head_dim, device)
        if problem:
            raise ValueError(f"kv_cache_dtype={wanted!r}: {problem}")
        return chosen, "chosen in the settings"
    exact = format_for("auto", compute_dtype)
    if passing is None:
        return exact, "auto: the compute dtype (no measurement of this model's KV formats yet: eval-quant --kv)"
    for name in SMALLEST_FIRST:
        candidate = FORMATS[name]
        if name in passing and candidate.problem(head_dim, device) is None:
            if candidate.bytes_per_values(256) < exact.bytes_per_values(256):
                return candidate, f"auto: the smallest format that met the thresholds on this model ({name})"
    return exact, "auto: no smaller format met the thresholds on this model"


def draft_kv_format(serving: KVFormat, serving_head_dim: int, draft_head_dim: int,
                    compute_dtype: torch.dtype) -> KVFormat:
    """A draft model's KV format (engine/serving/draft_model.py). How its keys and values are rounded moves only
    how many of its drafts are accepted, never a token of the reply, so it is at most 16 bits: the serving model's
    format where the head sizes agree (its rules were checked for that size), else the compute dtype, and float16
    where that is wider (the CPU kernels read it in place, and a draft pass over a long context is as fast as its
    cache is read: 16 bits halve that)."""
    chosen = serving if draft_head_dim == serving_head_dim else format_for("auto", compute_dtype)
    narrow = FORMATS["float16"]
    return narrow if chosen.bytes_per_values(Q8_GROUP) > narrow.bytes_per_values(Q8_GROUP) else chosen


# -- writing and reading -----------------------------------------------------------------------------


def quantize_q8_0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` ``[..., D]`` as q8_0: int8 ``[..., D]`` and float16 scales ``[..., D / 32]``."""
    groups = x.float().unflatten(-1, (-1, Q8_GROUP))
    scale = groups.abs().amax(-1, keepdim=True) / Q8_MAX
    inverse = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    # a group too small for float32's 1 / scale (inf; its float16 scale is 0 anyway) stores zeros, as in C++
    quants = torch.round(groups * inverse).nan_to_num_(0.0).clamp_(-Q8_MAX, Q8_MAX).to(torch.int8)
    return quants.flatten(-2), scale.squeeze(-1).to(torch.float16)


def dequantize_q8_0(quants: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values ``quants`` ``[..., D]`` with ``scales`` ``[..., D / 32]`` stand for, in ``dtype``."""
    groups = quants.unflatten(-1, (-1, Q8_GROUP)).to(torch.float32) * scales.to(torch.float32).unsqueeze(-1)
    return groups.flatten(-2).to(dtype)


def encode(fmt: KVFormat, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x`` as ``fmt`` stores it: the values and, for q8_0, the scales."""
    if fmt.scaled:
        return quantize_q8_0(x)
    if fmt.name == "fp8":
        return x.float().clamp(-FP8_MAX, FP8_MAX).to(fmt.storage), None
    return x.to(fmt.storage), None


def decode(fmt: KVFormat, stored: torch.Tensor, scales: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """Stored values back in ``dtype`` (no copy where they are already in it)."""
    if fmt.scaled:
        return dequantize_q8_0(stored, scales, dtype)
    return stored.to(dtype)
