"""Linear layers that keep GGUF's own Q4_1 / Q8_0 blocks and multiply them on the native CPU kernels.

A GGUF file's Q4_1 and Q8_0 blocks are kept as they are (only their order changes: rows are interleaved eight
at a time, see :func:`interleave`), Q4_0 becomes Q4_1 exactly (``(q - 8) d`` is ``d q + m`` with ``m = -8 d``),
and float weights (safetensors models, other GGUF types) are quantised into the same blocks at load, as
llama.cpp's quantiser does. The arithmetic is llama.cpp's too: see ``kernels/block_quant.cpp``. Where the
kernels can't be built, the packed layers of :mod:`.packed_linear` take their place (see
:func:`engine.step.quantization.packed_layer`).
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch import nn

from . import kernels

BLOCK = 32  # weights per block
GROUP = 8  # rows interleaved together in the kernels' layout
# each kind's scale fields (bytes each) ahead of its codes: q4_1 float16 d and m, q4_1f float32 d and m, q8_0 d
SCALE_FIELDS = {"q4_1": (2, 2), "q4_1f": (4, 4), "q8_0": (2,)}
CODE_BYTES = {"q4_1": 16, "q4_1f": 16, "q8_0": 32}  # a block's codes: 32 nibbles or 32 bytes
BLOCK_BYTES = {kind: sum(fields) + CODE_BYTES[kind] for kind, fields in SCALE_FIELDS.items()}
GGUF_KINDS = {"Q4_0": "q4_1", "Q4_1": "q4_1", "Q4_K": "q4_1f", "Q8_0": "q8_0"}  # what each GGUF type is held as
Q4_K_BYTES = 144  # float16 d, float16 dmin, 12 bytes of 6-bit scales and minimums, 256 codes


class BlockQuantLinear(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` stored as Q4_1 or Q8_0 blocks, rows interleaved eight at a time.

    ``groups`` is :func:`interleave`'s ``[ceil(out_features / 8), in_features / 32 * 8 * bytes]`` uint8 tensor;
    build layers from GGUF-ordered blocks with :meth:`from_blocks`, :meth:`from_gguf` or :meth:`from_float`.
    """

    def __init__(self, kind: str, in_features: int, out_features: int, groups: torch.Tensor,
                 bias: torch.Tensor | None = None) -> None:
        super().__init__()
        if not kernels.available():
            raise RuntimeError(f"block-quantised layers need the native kernels: {kernels.status().detail}")
        _check_kind(kind, in_features)
        shape = (-(-out_features // GROUP), in_features // BLOCK * GROUP * BLOCK_BYTES[kind])
        if groups.dtype != torch.uint8 or tuple(groups.shape) != shape:
            raise ValueError(f"{kind} blocks of shape {tuple(groups.shape)} do not hold "
                             f"{out_features} x {in_features} weights (want {shape})")
        self.kind, self.in_features, self.out_features = kind, in_features, out_features
        self._op = getattr(torch.ops.kvasir_kernels, f"{kind}_linear")
        self.register_buffer("blocks", groups.contiguous())
        self.register_buffer("bias", bias)

    @classmethod
    def from_blocks(cls, kind: str, in_features: int, blocks: torch.Tensor,
                    bias: torch.Tensor | None = None) -> BlockQuantLinear:
        """A layer over ``kind`` blocks in GGUF's order, ``[out_features, in_features / 32 * bytes]`` uint8."""
        _check_kind(kind, in_features)
        row_bytes = in_features // BLOCK * BLOCK_BYTES[kind]
        if blocks.dtype != torch.uint8 or blocks.dim() != 2 or blocks.shape[1] != row_bytes:
            raise ValueError(f"{kind} blocks of shape {tuple(blocks.shape)} do not hold {in_features} features a row")
        return cls(kind, in_features, blocks.shape[0], interleave(blocks, kind), bias)

    @classmethod
    def from_float(cls, weight: torch.Tensor, kind: str, bias: torch.Tensor | None = None) -> BlockQuantLinear:
        """Quantise a float ``weight`` [out, in] into ``kind`` blocks."""
        encoders = {"q4_1": quantize_q4_1, "q8_0": quantize_q8_0}
        if kind not in encoders:
            raise ValueError(f"float weights are quantised to q4_1 or q8_0 blocks, not {kind!r}")
        encode = encoders[kind]
        return cls.from_blocks(kind, weight.shape[1], encode(weight.detach().float().cpu()), bias)

    @classmethod
    def from_gguf(cls, data: np.ndarray, ggml_type: str, row_order: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None) -> BlockQuantLinear:
        """A GGUF tensor's blocks (``[out, in / 32 * type bytes]`` uint8); ``row_order`` permutes output rows."""
        kind = GGUF_KINDS[ggml_type]
        with warnings.catch_warnings():  # a read-only memory map: the blocks are only read, then interleaved
            warnings.simplefilter("ignore", UserWarning)
            raw = torch.from_numpy(np.asarray(data, dtype=np.uint8))
        if ggml_type == "Q4_0":
            raw = q4_0_as_q4_1(raw)
        elif ggml_type == "Q4_K":
            raw = q4_k_as_q4_1f(raw)
        if row_order is not None:  # a row is one output feature with all its blocks: permuting rows is exact
            raw = raw[row_order]
        in_features = raw.shape[1] // BLOCK_BYTES[kind] * BLOCK
        return cls.from_blocks(kind, in_features, raw, bias)

    def forward(self, x: torch.Tensor, fine_activations: bool = False) -> torch.Tensor:
        """``x W^T (+ b)``, each row of ``x`` rounded to 8 bits per 32 values first; with ``fine_activations``, the
        rounding's remainder too, as a second row whose output is added: about 15 bits of rounding."""
        flat = x.reshape(-1, self.in_features).to(torch.float32).contiguous()
        if fine_activations:
            rows = flat.shape[0]
            both = self._op(torch.cat([flat, torch.ops.kvasir_kernels.activation_remainder(flat)]), self.blocks,
                            self.in_features, self.out_features)
            out = both[:rows] + both[rows:]
        else:
            out = self._op(flat, self.blocks, self.in_features, self.out_features)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def dequantize(self) -> torch.Tensor:
        """The float32 weight [out, in] the kernel multiplies by."""
        return torch.ops.kvasir_kernels.dequantize(self.blocks, self.in_features, self.out_features, self.kind)

    def extra_repr(self) -> str:
        return f"{self.kind}, in_features={self.in_features}, out_features={self.out_features}"


def rounds_activations(model: nn.Module) -> bool:
    """Whether ``model``'s linear layers round their activations to 8 bits (it has block layers)."""
    return any(type(module) is BlockQuantLinear for module in model.modules())


def _check_kind(kind: str, in_features: int) -> None:
    if kind not in BLOCK_BYTES or in_features % BLOCK:
        raise ValueError(f"no {kind!r} blocks for {in_features} input features")


class BlockEmbedding(nn.Module):
    """A token embedding looked up in a block layer's rows: a GGUF file's quantised ``token_embd`` kept as it
    is, and, where the model ties them, the very blocks its output head multiplies by."""

    def __init__(self, table: BlockQuantLinear) -> None:
        super().__init__()
        self.table = table
        self.num_embeddings, self.embedding_dim = table.out_features, table.in_features

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        rows = torch.ops.kvasir_kernels.block_rows(self.table.blocks, input_ids.reshape(-1).long().contiguous(),
                                                   self.embedding_dim, self.num_embeddings, self.table.kind)
        return rows.reshape(*input_ids.shape, self.embedding_dim)

    @property
    def weight(self) -> torch.Tensor:
        """The whole table in float32 (made on each call: for inspection, not for the step)."""
        return self.table.dequantize()

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.table.kind} blocks"


def can_fuse(layers: list[nn.Module]) -> bool:
    """Whether ``layers`` are block layers of one kind over the same inputs, all with biases or none, each of
    whole groups of eight rows (so that their groups can sit one after another)."""
    if len(layers) < 2 or any(type(layer) is not BlockQuantLinear for layer in layers):
        return False
    first = layers[0]
    return all(layer.kind == first.kind and layer.in_features == first.in_features
               and layer.out_features % GROUP == 0
               and (layer.bias is None) == (first.bias is None) for layer in layers)


def fuse(layers: list[BlockQuantLinear]) -> BlockQuantLinear:
    """One layer computing ``layers`` side by side (their outputs concatenated); see :func:`can_fuse`.

    The layers' blocks become views of the fused layer's, so nothing is held twice.
    """
    if not can_fuse(layers):
        raise ValueError("these layers can't be fused")
    first = layers[0]
    bias = None if first.bias is None else torch.cat([layer.bias for layer in layers])
    out_features = sum(layer.out_features for layer in layers)
    fused = BlockQuantLinear(first.kind, first.in_features, out_features,
                             torch.cat([layer.blocks for layer in layers]), bias)
    start = 0
    for layer in layers:
        layer.blocks = fused.blocks[start : start + layer.out_features // GROUP]
        start += layer.out_features // GROUP
    return fused


def interleave(blocks: torch.Tensor, kind: str) -> torch.Tensor:
    """GGUF-ordered blocks ``[rows, n * bytes]`` in the kernels' layout, ``[ceil(rows / 8), n * 8 * bytes]``.

    For each group of eight rows and each block position: the eight rows' float16 ``d`` (and ``m`` for Q4_1),
    then their codes four at a time, row after row, so that 32 bytes hold codes ``4k..4k+3`` of all eight rows
    (for Q4_1, whose byte ``j`` holds codes ``j`` and ``j + 16``, codes ``4k..4k+3`` and ``16+4k..16+4k+3``). Rows
    past the last are zero blocks. See ``kernels/block_quant.cpp``.
    """
    rows, width = blocks.shape
    size = BLOCK_BYTES[kind]
    count = width // size
    if rows % GROUP:
        blocks = torch.cat([blocks, blocks.new_zeros(GROUP - rows % GROUP, width)])
    by_position = blocks.reshape(-1, GROUP, count, size).transpose(1, 2)  # [groups, position, row, bytes]
    fields, start = [], 0
    for field_bytes in SCALE_FIELDS[kind]:  # each scale field of the eight rows side by side
        fields.append(by_position[..., start : start + field_bytes].flatten(2))
        start += field_bytes
    codes = by_position[..., start:].reshape(*by_position.shape[:3], -1, 4).transpose(2, 3)
    return torch.cat([*fields, codes.flatten(2)], dim=-1).reshape(blocks.shape[0] // GROUP, -1).contiguous()


def quantize_q4_1(weight: torch.Tensor) -> torch.Tensor:
    """Q4_1 blocks of ``weight`` [out, in]: per 32 weights the minimum ``m`` and step ``d = (max - min) / 15``."""
    rows, cols = weight.shape
    groups = weight.reshape(rows, cols // BLOCK, BLOCK)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    d = ((high - low) / 15).to(torch.float16)
    m = low.to(torch.float16)
    # codes chosen for the float16 d and m the kernel will read
    step = d.float().clamp(min=torch.finfo(torch.float16).tiny)
    codes = ((groups - m.float()[..., None]) / step[..., None]).round().clamp(0, 15).to(torch.uint8)
    nibbles = codes[..., :16] | (codes[..., 16:] << 4)
    return torch.cat([_half_bytes(d), _half_bytes(m), nibbles], dim=-1).reshape(rows, -1)


def quantize_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """Q8_0 blocks of ``weight`` [out, in]: per 32 weights ``d = max |w| / 127`` and codes in [-127, 127]."""
    rows, cols = weight.shape
    groups = weight.reshape(rows, cols // BLOCK, BLOCK)
    d = (groups.abs().amax(dim=-1) / 127).to(torch.float16)
    step = d.float()
    codes = torch.where(step[..., None] > 0, groups / step.clamp(min=1e-30)[..., None], 0.0)
    codes = codes.round().clamp(-127, 127).to(torch.int8).view(torch.uint8)
    return torch.cat([_half_bytes(d), codes], dim=-1).reshape(rows, -1)


def q4_0_as_q4_1(raw: torch.Tensor) -> torch.Tensor:
    """Q4_0 blocks (float16 d, 16 bytes of codes; ``(q - 8) d``) as Q4_1 blocks with ``m = -8 d`` (exact)."""
    rows = raw.shape[0]
    blocks = raw.reshape(rows, -1, 18)
    d = blocks[..., :2].contiguous().view(torch.float16)[..., 0]
    m = (d.float() * -8).to(torch.float16)  # a power-of-two multiple: exact unless it overflows float16
    return torch.cat([blocks[..., :2], _half_bytes(m), blocks[..., 2:]], dim=-1).reshape(rows, -1)


def q4_k_as_q4_1f(raw: torch.Tensor) -> torch.Tensor:
    """Q4_K super-blocks (256 weights: ``d * sc_j * q - dmin * m_j`` in eight sub-blocks of 32) as Q4_1 blocks
    with float32 ``d = d * sc_j`` and ``m = -dmin * m_j`` (exact: a float16 times a 6-bit integer fits float32).

    Q4_K stores each 64 weights as 32 bytes, the first 32 in the low nibbles and the next 32 in the high ones;
    a Q4_1 block keeps weights ``t`` and ``t + 16`` in byte ``t``.
    """
    rows = raw.shape[0]
    supers = raw.reshape(rows, -1, Q4_K_BYTES)
    d = supers[..., 0:2].contiguous().view(torch.float16).float()  # [rows, n, 1]
    dmin = supers[..., 2:4].contiguous().view(torch.float16).float()
    sc, mins = _q4_k_scales(supers[..., 4:16].to(torch.int32))  # [rows, n, 8] each
    packed = supers[..., 16:].reshape(rows, -1, 4, 32)  # [rows, n, 64-weight chunk, byte]
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=3).reshape(rows, -1, 8, 32)  # [rows, n, sub-block, weight]
    nibbles = codes[..., :16] | (codes[..., 16:] << 4)
    scales = (d * sc.float()).contiguous().view(torch.uint8).reshape(rows, -1, 8, 4)
    minimums = (-(dmin * mins.float())).contiguous().view(torch.uint8).reshape(rows, -1, 8, 4)
    return torch.cat([scales, minimums, nibbles], dim=-1).reshape(rows, -1)


def _q4_k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and minimums of a Q4_K super-block from its 12 bytes (ggml's get_scale_min_k4)."""
    low, high, rest = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    sc = torch.cat([low & 63, (rest & 0x0F) | ((low >> 6) << 4)], dim=-1)
    mins = torch.cat([high & 63, (rest >> 4) | ((high >> 6) << 4)], dim=-1)
    return sc, mins


def _half_bytes(values: torch.Tensor) -> torch.Tensor:
    """float16 values [..., n] as their little-endian bytes [..., n, 2] -> flattened to [..., 2] per value."""
    return values.contiguous().view(torch.uint8).reshape(*values.shape, 2)
