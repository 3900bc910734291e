"""Weight quantisation applied after loading, by swapping linear layers one at a time.

Two families: bitsandbytes (``int8``, ``nf4``, ``fp4``; embeddings and the output head stay in the compute
dtype) and the packed weight-only modes (``int4``, ``w8``), where on the CPU the output head is packed to 8 bits
too: there it is the largest single matrix a decode step reads (on CUDA it keeps the compute dtype:
:func:`packs_output_head`). On the CPU the packed modes hold GGUF-style Q4_1 /
Q8_0 blocks for the native kernels (:mod:`.block_linear`); on CUDA, or where those kernels could not be built,
torch's own packed int4 / int8 kernels (:mod:`.packed_linear`). Each
full-precision weight is freed as soon as its quantised replacement exists, so loading never holds two
full-precision copies.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

import torch
from torch import nn

from ..config import PACKED_MODES
from . import kernels
from .block_linear import BLOCK, BlockQuantLinear
from .packed_linear import Int4Linear, Int8Linear, can_pack_int4

log = logging.getLogger(__name__)

INT8_OUTLIER_THRESHOLD = 6.0  # LLM.int8(): activations above this go through a float16 side path
INT4_GROUP_SIZE = 32  # quantising float weights at load: the same groups as GGUF's Q4 blocks


def import_bitsandbytes():
    """bitsandbytes, with its warnings about optional kernel packages silenced."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
        import bitsandbytes

    return bitsandbytes


def quantizable_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every linear layer except the output head."""
    head = model.get_output_embeddings()
    found = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if type(child) is nn.Linear and child is not head:
                found.append((parent, name, child))
    return found


def quantize_model(
    model: nn.Module,
    mode: str,
    compute_dtype: torch.dtype,
    device: torch.device,
    progress: Callable[[float], None] | None = None,
) -> int:
    """Replace the linear layers of ``model`` by bitsandbytes layers of ``mode`` on ``device``.

    Returns the number of layers replaced.
    """
    if mode == "none":
        return 0
    if mode in PACKED_MODES:
        return pack_model(model, mode, device, progress)
    bnb = import_bitsandbytes()
    layers = quantizable_linears(model)
    for i, (parent, name, linear) in enumerate(layers):
        setattr(parent, name, _quantized(bnb, linear, mode, compute_dtype, device))
        del linear
        if progress:
            progress((i + 1) / len(layers))
    return len(layers)


def pack_model(
    model: nn.Module, mode: str, device: torch.device, progress: Callable[[float], None] | None = None
) -> int:
    """Replace the linear layers of ``model`` by packed ``mode`` layers on ``device``, the head included.

    Packing happens on ``device`` because the CPU and CUDA kernels lay the codes out differently.
    """
    layers = quantizable_linears(model)
    for i, (parent, name, linear) in enumerate(layers):
        bias = None if linear.bias is None else linear.bias.detach().to(device)
        setattr(parent, name, packed_layer(linear.weight.detach().to(device), mode, device, bias))
        linear.weight = None  # free the float weight now, not when the loop ends
        if progress:
            progress((i + 1) / len(layers))
    pack_output_head(model, device)
    return len(layers)


def quantized_layer(weight: torch.Tensor, bias: torch.Tensor | None, mode: str, compute_dtype: torch.dtype,
                    device: torch.device) -> nn.Module:
    """One linear layer's float ``weight`` [out, in] (and ``bias``) as a ``mode`` layer on ``device``."""
    if mode in PACKED_MODES:
        return packed_layer(weight.to(device), mode, device, None if bias is None else bias.to(device))
    return _quantized(import_bitsandbytes(), _as_linear(weight, bias), mode, compute_dtype, device)


def uses_native_blocks(device: torch.device, in_features: int) -> bool:
    """Whether packed layers on ``device`` with ``in_features`` inputs are native Q4_1 / Q8_0 block layers."""
    return device.type == "cpu" and in_features % BLOCK == 0 and kernels.available()


def packed_layer(weight: torch.Tensor, mode: str, device: torch.device, bias: torch.Tensor | None = None) -> nn.Module:
    """A float ``weight`` [out, in] as a packed ``mode`` layer: 4-bit for ``int4``, 8-bit for ``w8``."""
    out_features, in_features = weight.shape
    if uses_native_blocks(device, in_features):
        return BlockQuantLinear.from_float(weight, "q4_1" if mode == "int4" else "q8_0", bias)
    if mode == "int4" and can_pack_int4(in_features, out_features, INT4_GROUP_SIZE):
        return Int4Linear.from_float(_as_linear(weight, bias), INT4_GROUP_SIZE)
    return Int8Linear.from_float(_as_linear(weight, bias))  # w8, or shapes the int4 kernel does not take


def packs_output_head(device: torch.device) -> bool:
    """Whether the packed modes give the output head an 8-bit copy on ``device``.

    On the CPU yes: the head is the largest matrix a decode step reads, and the native kernels read Q8_0 blocks
    in place. On CUDA no: torch has no fast int8 weight-only kernel there, so an 8-bit head (``Int8Linear``)
    would be dequantised whole at every call, about twice the traffic of all the int4 layers of the default
    model; it keeps the compute dtype.
    """
    return device.type != "cuda"


def pack_output_head(model: nn.Module, device: torch.device) -> None:
    """The output head in 8 bits (Q8_0 blocks, or int8 per row) where :func:`packs_output_head` says so, also
    when it is tied to the embeddings.

    A tied head gets its own 8-bit copy: the embedding keeps the compute dtype, since a lookup reads one row.
    """
    head = model.get_output_embeddings()
    if type(head) is nn.Linear and packs_output_head(device):
        bias = None if head.bias is None else head.bias.detach()
        model.set_output_embeddings(packed_layer(head.weight.detach(), "w8", device, bias))


def _as_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    layer.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        layer.bias = nn.Parameter(bias, requires_grad=False)
    return layer


def _quantized(bnb, linear: nn.Linear, mode: str, compute_dtype: torch.dtype, device: torch.device) -> nn.Module:
    has_bias = linear.bias is not None
    weight = linear.weight.data
    linear.weight = None  # drop the module's reference so the float copy can go as soon as it is quantised
    if mode == "int8":
        layer = bnb.nn.Linear8bitLt(
            linear.in_features, linear.out_features, bias=has_bias, has_fp16_weights=False,
            threshold=INT8_OUTLIER_THRESHOLD, device="meta",
        )
        layer.weight = bnb.nn.Int8Params(weight.to(torch.float16), requires_grad=False, has_fp16_weights=False)
    else:
        layer = bnb.nn.Linear4bit(
            linear.in_features, linear.out_features, bias=has_bias, compute_dtype=compute_dtype,
            compress_statistics=True, quant_type=mode, device="meta",
        )
        layer.weight = bnb.nn.Params4bit(
            weight, requires_grad=False, quant_type=mode, compress_statistics=True, module=layer
        )
    if has_bias:
        layer.bias = nn.Parameter(linear.bias.data.to(compute_dtype), requires_grad=False)
    return layer.to(device)


def module_bytes(model: nn.Module) -> int:
    """Bytes held by the model's parameters, buffers and bitsandbytes quantisation states."""
    seen: set[int] = set()
    total = 0

    def count(tensor: torch.Tensor | None) -> None:
        nonlocal total
        if tensor is None or tensor.device.type == "meta":
            return
        key = tensor.untyped_storage().data_ptr()
        if key in seen:
            return
        seen.add(key)
        total += tensor.untyped_storage().nbytes()

    for tensor in list(model.parameters()) + list(model.buffers()):
        count(tensor)
        state = getattr(tensor, "quant_state", None)
        for extra in _quant_state_tensors(state):
            count(extra)
        for attr in ("SCB", "CB"):
            count(getattr(tensor, attr, None))
    return total


def _quant_state_tensors(state) -> list[torch.Tensor]:
    if state is None:
        return []
    tensors = [getattr(state, "absmax", None), getattr(state, "code", None), getattr(state, "offset", None)]
    tensors += _quant_state_tensors(getattr(state, "state2", None))
    return [t for t in tensors if isinstance(t, torch.Tensor)]
