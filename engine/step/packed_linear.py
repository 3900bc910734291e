"""Weight-only quantised linear layers on torch's own packed kernels: int4 in groups, int8 per row.

``Int4Linear`` holds 4-bit codes ``q`` (0..15) in groups of ``group_size`` weights along the input, with a
scale and a zero per group and output row: ``w = (q - 8) * scale + zero``. It runs torch's int4 weight-only
kernel (the one gpt-fast and torchao use), which reads the packed codes directly, so a decode step reads a
quarter of the bytes of bfloat16 weights. ``Int8Linear`` holds int8 codes with one scale per output row:
``w = q * scale``.

Both kernels take bfloat16 activations and scales on the CPU (their float32 variants are several times
slower), so ``forward`` casts to bfloat16 and hands back the caller's dtype.

GGUF's Q4_0 and Q4_1 blocks are exactly such groups of 32, so :meth:`Int4Linear.from_gguf_blocks` maps them
without re-quantising: Q4_1 ``d * q + m`` is scale ``d``, zero ``m + 8 d``; Q4_0 ``(q - 8) * d`` is scale
``d``, zero 0. The scales are rounded from float16 to bfloat16 on the way (the kernel's format).

The CUDA kernels pack differently (``_pack_int4_cuda``), in the widest layout each shape takes
(:func:`cuda_inner_k_tiles`); that branch follows torch's documented schema and is checked exactly on a GPU
by ``engine/tools/gpu_check.py``, since this project's test machines have none.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

KERNEL_DTYPE = torch.bfloat16  # what the packed kernels compute in
CPU_INNER_K_TILES = 2  # the CPU kernel's packing layout parameter (2, 4 or 8)
CUDA_INNER_K_TILES = (8, 4, 2)  # the CUDA kernel's, widest first: 8 reads 16 bytes at a time, 2 only 4
GGUF_BLOCK = 32  # weights per block in Q4_0, Q4_1 and Q8_0
GGUF_Q4_BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20}  # float16 d, [float16 m,] 16 bytes of nibbles
INT4_GROUP_SIZES = (32, 64, 128, 256)


def can_pack_int4(in_features: int, out_features: int, group_size: int) -> bool:
    """Whether the int4 kernel takes these shapes (it packs rows by 16 and groups along the input)."""
    return group_size in INT4_GROUP_SIZES and in_features % group_size == 0 and out_features % 16 == 0


class Int4Linear(nn.Module):
    """A linear layer with 4-bit weights in groups along the input, on torch's packed int4 kernel."""

    def __init__(self, in_features: int, out_features: int, group_size: int, packed: torch.Tensor,
                 scales_and_zeros: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.register_buffer("packed", packed)
        self.register_buffer("scales_and_zeros", scales_and_zeros)  # [in / group, out, 2] bfloat16
        self.register_buffer("bias", bias)

    @classmethod
    def from_codes(cls, codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, group_size: int,
                   bias: torch.Tensor | None = None, device: torch.device | str = "cpu",
                   inner_k_tiles: int | None = None) -> Int4Linear:
        """Pack ``codes`` [out, in] (0..15) with ``scales`` and ``zeros`` [out, in / group] for ``device``
        (``inner_k_tiles``: the CUDA layout, by default the widest the shape takes)."""
        out_features, in_features = codes.shape
        packed = _pack_int4(codes.to(torch.int32), torch.device(device), inner_k_tiles)
        scales_and_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous()
        scales_and_zeros = scales_and_zeros.to(device=device, dtype=KERNEL_DTYPE)
        return cls(in_features, out_features, group_size, packed, scales_and_zeros, _to(bias, device))

    @classmethod
    def from_float(cls, linear: nn.Linear, group_size: int = 32) -> Int4Linear:
        """Quantise ``linear``'s weight: asymmetric min/max per group, on the weight's device."""
        codes, scales, zeros = quantize_int4(linear.weight.detach(), group_size)
        bias = None if linear.bias is None else linear.bias.detach()
        return cls.from_codes(codes, scales, zeros, group_size, bias, linear.weight.device)

    @classmethod
    def from_gguf_blocks(cls, blocks: np.ndarray, ggml_type: str, row_order: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None, device: torch.device | str = "cpu") -> Int4Linear:
        """Map Q4_0 / Q4_1 blocks ([out, in / 32 * block bytes] uint8) as they are; ``row_order`` permutes rows."""
        codes, scales, zeros = decode_q4_blocks(blocks, ggml_type)
        if row_order is not None:  # rows are output features and groups run along them: permuting is exact
            codes, scales, zeros = codes[row_order], scales[row_order], zeros[row_order]
        return cls.from_codes(codes, scales, zeros, GGUF_BLOCK, bias, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(KERNEL_DTYPE)
        if self.packed.is_cuda:
            out = torch.ops.aten._weight_int4pack_mm(flat, self.packed, self.group_size, self.scales_and_zeros)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, self.group_size, self.scales_and_zeros)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The weight [out, in] the kernel computes with (bfloat16), read back through the kernel itself."""
        eye = torch.eye(self.in_features, dtype=KERNEL_DTYPE, device=self.packed.device)
        bias, self.bias = self.bias, None
        try:
            return self.forward(eye).t().contiguous()
        finally:
            self.bias = bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, group_size={self.group_size}"


class Int8Linear(nn.Module):
    """A linear layer with int8 weights and one scale per output row, on torch's int8 weight-only kernel."""

    def __init__(self, weight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight)  # [out, in] int8
        self.register_buffer("scales", scales.to(KERNEL_DTYPE))  # [out]
        self.register_buffer("bias", bias)

    @classmethod
    def from_float(cls, linear: nn.Linear) -> Int8Linear:
        """Quantise ``linear``'s weight symmetrically per output row."""
        codes, scales = quantize_int8(linear.weight.detach())
        return cls(codes, scales, None if linear.bias is None else linear.bias.detach())

    @classmethod
    def from_gguf_blocks(cls, blocks: np.ndarray, row_order: torch.Tensor | None = None,
                         bias: torch.Tensor | None = None) -> Int8Linear:
        """Q8_0 blocks re-quantised per row: Q8_0 has a scale per 32 weights, this kernel one per row."""
        codes, scales = quantize_int8(decode_q8_blocks(blocks))
        if row_order is not None:
            codes, scales = codes[row_order], scales[row_order]
        return cls(codes, scales, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features).to(KERNEL_DTYPE)
        if self.weight.is_cuda:  # no int8 weight-only kernel there: dequantise on the fly
            out = nn.functional.linear(flat, self.weight.to(KERNEL_DTYPE)) * self.scales
        else:
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight, self.scales)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The weight [out, in] the kernel computes with, in float32."""
        return self.weight.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes [out, in] (0..15), scales and zeros [out, in / group] so ``(q - 8) * scale + zero`` ~ ``weight``."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, cols // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    # round scale and zero to the kernel's dtype first, so the codes are chosen for the values it will use
    scales = ((high - low) / 15).clamp(min=1e-6).to(KERNEL_DTYPE).float()
    zeros = (low + 8 * scales).to(KERNEL_DTYPE).float()
    codes = ((groups - zeros[..., None]) / scales[..., None] + 8).round().clamp(0, 15)
    return codes.to(torch.int32).reshape(rows, cols), scales, zeros


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes [out, in] (int8) and one scale per row [out] so ``q * scale`` ~ ``weight``."""
    weight = weight.float()
    scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-8).to(KERNEL_DTYPE).float()
    codes = (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8)
    return codes, scales


def decode_q4_blocks(blocks: np.ndarray, ggml_type: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Codes [out, in] (0..15), scales and zeros [out, in / 32] (float32) of Q4_0 / Q4_1 blocks, unchanged."""
    rows = blocks.shape[0]
    raw = _as_tensor(blocks).reshape(rows, -1, GGUF_Q4_BLOCK_BYTES[ggml_type])
    d = raw[..., 0:2].contiguous().view(torch.float16)[..., 0].float()
    if ggml_type == "Q4_1":
        m = raw[..., 2:4].contiguous().view(torch.float16)[..., 0].float()
        zeros = m + 8 * d  # d * q + m == (q - 8) * d + (m + 8 d)
    else:
        zeros = torch.zeros_like(d)
    nibbles = raw[..., -16:]
    codes = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=-1)  # low nibbles are weights 0..15, high 16..31
    return codes.reshape(rows, -1).to(torch.int32), d, zeros


def decode_q8_blocks(blocks: np.ndarray) -> torch.Tensor:
    """The float32 weight [out, in] of Q8_0 blocks (float16 d, then 32 int8 codes: ``q * d``)."""
    rows = blocks.shape[0]
    raw = _as_tensor(blocks).reshape(rows, -1, 2 + GGUF_BLOCK)
    d = raw[..., 0:2].contiguous().view(torch.float16).float()
    codes = raw[..., 2:].contiguous().view(torch.int8).float()
    return (codes * d).reshape(rows, -1)


def _as_tensor(blocks: np.ndarray) -> torch.Tensor:
    """A uint8 tensor of one tensor's blocks; a copy, since the file's memmap is read-only."""
    return torch.from_numpy(np.array(blocks, dtype=np.uint8))


def cuda_inner_k_tiles(in_features: int) -> int:
    """The widest layout the CUDA kernel takes for ``in_features`` inputs: ``t`` tiles need a multiple of
    ``16 t`` (so 8 where ``in_features % 128 == 0``, as gpt-fast and torchao pack)."""
    return next(tiles for tiles in CUDA_INNER_K_TILES if in_features % (16 * tiles) == 0)


def _pack_int4(codes: torch.Tensor, device: torch.device, inner_k_tiles: int | None = None) -> torch.Tensor:
    """Codes packed for ``device``'s kernel; ``inner_k_tiles`` (CUDA only) overrides the layout picked by shape.
    The kernel reads the layout from the packed tensor's shape, so nothing else needs to know it."""
    if device.type == "cuda":
        return _pack_int4_cuda(codes.to(device), inner_k_tiles or cuda_inner_k_tiles(codes.shape[1]))
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, CPU_INNER_K_TILES)


def _pack_int4_cuda(codes: torch.Tensor, inner_k_tiles: int) -> torch.Tensor:
    """CUDA's packing takes two codes a byte, even columns in the high nibble (torch >= 2.5). Checked on a GPU
    by ``engine/tools/gpu_check.py`` (``layer_outputs``), against the codes' own weight."""
    as_bytes = (codes[:, ::2] << 4 | codes[:, 1::2]).to(torch.uint8)
    return torch.ops.aten._convert_weight_to_int4pack(as_bytes, inner_k_tiles)


def _to(tensor: torch.Tensor | None, device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)
