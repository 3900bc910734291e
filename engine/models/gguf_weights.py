"""A model built straight from a GGUF file's blocks, its linear layers packed without a float copy (int4, w8).

The skeleton comes from the config transformers derives from the file, built on the ``meta`` device. Then
each tensor is read from the file (a numpy memmap): the decoder's linear weights become packed layers from
their raw blocks (Q4_0, Q4_1 and Q8_0 as they are, see :mod:`engine.step.block_linear`), and embeddings, norms and
biases are dequantised to the compute dtype. Names and the llama-family q/k head permutation come from
transformers' own GGUF tables, so this reads what ``from_pretrained(gguf_file=...)`` reads.

Types without a direct mapping are dequantised one tensor at a time and re-quantised (to 8 bits for 5 bits
and more, to 4 bits in groups of 32 below), which the load warnings say.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import ModelLoadError
from ..step.block_linear import GGUF_KINDS, BlockEmbedding, BlockQuantLinear
from ..step.packed_linear import GGUF_BLOCK, Int4Linear, Int8Linear, can_pack_int4
from ..step.quantization import pack_output_head, packed_layer, uses_native_blocks
from .gguf_config import read_config
from .gguf_info import read_gguf_info, read_tensors
from .skeleton import empty_model, named_linears, unfilled
from .sources import ModelSource

DIRECT_INT4 = ("Q4_0", "Q4_1")  # GGUF types whose blocks are the int4 kernel's groups
NATIVE_INT4 = tuple(t for t, kind in GGUF_KINDS.items() if kind != "q8_0")  # 4-bit blocks the native kernels keep
FLOAT_TYPES = ("F32", "F16", "BF16")
LOW_BIT_TYPES = ("Q2_K", "Q3_K", "Q4_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M",
                 "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0")  # re-quantised to int4; the rest (5 bits and up) to int8


@dataclass(slots=True)
class PackedLoad:
    """What building from blocks produced: the model and the tensor types that had to be re-quantised."""

    model: nn.Module
    requantized: Counter = field(default_factory=Counter)

    def warnings(self) -> list[str]:
        if not self.requantized:
            return []
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(self.requantized.items()))
        return [f"linear weights stored as {kinds} have no direct packed form and were re-quantised at load"]


def load_packed_gguf(source: ModelSource, mode: str, dtype: torch.dtype, attn: str, device: torch.device,
                     config_folder: Path | None = None) -> PackedLoad:
    """Build ``source`` (a GGUF file) for packed ``mode`` ("int4" or "w8"); linear layers packed on ``device``.

    ``config_folder``: a folder holding the file's config.json as transformers derived it before (see
    :func:`.gguf_cache.header_folder`), which saves reading the file's metadata through transformers again.
    """
    done = PackedLoad(_skeleton(source, dtype, attn, config_folder))
    tensors = read_tensors(source.path)
    architecture = str(read_gguf_info(source.path).metadata.get("general.architecture", ""))
    state, embedding = _fill(done, tensors, architecture, mode, dtype, device)
    done.model.load_state_dict(state, strict=False, assign=True)
    if embedding is None:
        done.model.tie_weights()
    else:
        _embed_from_blocks(done.model, embedding, tied=not any(t.name == "output.weight" for t in tensors))
    pack_output_head(done.model, device)
    _check_complete(done.model, source)
    return done


def _fill(done: PackedLoad, tensors: list, architecture: str, mode: str, dtype: torch.dtype, device: torch.device):
    """Swap in packed layers for the decoder's linear weights; return every other tensor, dequantised, and the
    token embedding tensor where its blocks are kept (see :func:`_keeps_embedding_blocks`), else None."""
    processor = _processor(architecture, done.model.config)
    names = _tensor_names(done.model, architecture)
    linears = named_linears(done.model)
    state, embedding = {}, None
    for tensor in tensors:
        target = names.get(tensor.name)
        if target is None:
            continue  # as in transformers: tensors the model has no place for (rope tables, say)
        module, _, kind = target.rpartition(".")
        if kind == "weight" and module in linears:
            parent, attr, layer = linears.pop(module)
            setattr(parent, attr, _packed_layer(tensor, mode, processor, layer, done.requantized, device))
        elif tensor.name == "token_embd.weight" and _keeps_embedding_blocks(tensor, device):
            embedding = tensor
        else:
            state[target] = _dequantized(tensor, processor, dtype)
    return state, embedding


def _keeps_embedding_blocks(tensor, device: torch.device) -> bool:
    """A quantised token embedding stays in its blocks where the native kernels run (rows are looked up)."""
    hidden = int(tensor.shape[0])  # GGUF lists dims innermost first
    return tensor.tensor_type.name in GGUF_KINDS and uses_native_blocks(device, hidden)


def _embed_from_blocks(model: nn.Module, tensor, tied: bool) -> None:
    """The file's token embedding blocks as the model's embedding, and as its output head when tied."""
    table = BlockQuantLinear.from_gguf(tensor.data, tensor.tensor_type.name)
    model.set_input_embeddings(BlockEmbedding(table))
    if tied:
        model.set_output_embeddings(table)


def _skeleton(source: ModelSource, dtype: torch.dtype, attn: str, config_folder: Path | None) -> nn.Module:
    """The model with its parameters on ``meta`` (buffers such as rotary frequencies are real)."""
    from transformers import AutoConfig

    try:
        if config_folder is not None:
            config = AutoConfig.from_pretrained(config_folder, trust_remote_code=False)
        else:
            config = read_config(source)
        return empty_model(config, dtype, attn)
    except Exception as exc:
        raise ModelLoadError(f"could not build {source.name} from its GGUF config: {exc}") from exc


def _processor(architecture: str, config):
    """transformers' per-architecture GGUF tensor processor (the q/k head permutation of llama files)."""
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config.to_dict())


def _tensor_names(model: nn.Module, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, from gguf's table (the one transformers reads).

    transformers' own ``get_gguf_hf_weights_map`` rebuilds this table for every submodule (seconds); one
    pass over the model's top-level names is what causal LMs need.
    """
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, name in MODEL_ARCH_NAMES.items() if name == architecture), None)
    if arch is None:
        raise ModelLoadError(f"gguf does not know the architecture {architecture!r}")
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = {}
    for name in model.state_dict():
        module, _, suffix = name.rpartition(".")
        gguf_name = table.get_name(module)
        if gguf_name is not None:
            names[f"{gguf_name}.{suffix}"] = name
    return names


def _packed_layer(tensor, mode: str, processor, layer: nn.Linear, requantized: Counter, device) -> nn.Module:
    """The packed replacement of ``layer`` from ``tensor``'s blocks; rows reordered as transformers would."""
    kind = tensor.tensor_type.name
    rows = _row_order(processor, tensor.name, layer.out_features)
    packed = _from_blocks(tensor, kind, mode, rows, layer, requantized, device)
    if layer.bias is not None:
        packed.bias = layer.bias.data  # a meta placeholder, filled from the file's bias tensor with the rest
    return packed


def _from_blocks(tensor, kind: str, mode: str, rows, layer: nn.Linear, requantized: Counter, device) -> nn.Module:
    """The file's blocks as they are where a kernel reads them, else dequantised and packed again.

    Native block layers (the CPU) take Q4_0 / Q4_1 / Q4_K in int4 mode and Q8_0 in both; torch's packed kernels
    take Q4_0 / Q4_1 as int4 (packed on ``device`` itself: the CPU and CUDA layouts differ) and Q8_0 as int8 rows.
    """
    if uses_native_blocks(device, layer.in_features):
        if kind == "Q8_0" or (mode == "int4" and kind in NATIVE_INT4):
            return BlockQuantLinear.from_gguf(tensor.data, kind, rows)
    elif mode == "int4" and kind in DIRECT_INT4 and can_pack_int4(layer.in_features, layer.out_features, GGUF_BLOCK):
        return Int4Linear.from_gguf_blocks(tensor.data, kind, rows, device=device)
    elif kind == "Q8_0":
        return Int8Linear.from_gguf_blocks(tensor.data, rows).to(device)
    weight = _dequantized(tensor, None, torch.float32)
    weight = weight if rows is None else weight[rows]
    if kind not in FLOAT_TYPES and kind not in DIRECT_INT4:
        requantized[kind] += 1
    four_bit = kind in LOW_BIT_TYPES or kind in FLOAT_TYPES or kind in DIRECT_INT4
    return packed_layer(weight.to(device), "int4" if mode == "int4" and four_bit else "w8", device)


def _row_order(processor, name: str, rows: int) -> torch.Tensor | None:
    """The row permutation transformers applies to ``name`` (None when it keeps the order).

    Found by passing the row indices through the processor: it only moves whole rows of q/k weights.
    """
    index = np.arange(rows, dtype=np.int64)[:, None]
    moved = np.asarray(processor.process(weights=index, name=name).weights).reshape(-1)
    if moved.shape != (rows,) or not np.array_equal(np.sort(moved), index[:, 0]):
        raise ModelLoadError(f"{name}: transformers reshapes this tensor; packed loading can't follow it")
    return None if np.array_equal(moved, index[:, 0]) else torch.from_numpy(moved)


def _dequantized(tensor, processor, dtype: torch.dtype) -> torch.Tensor:
    """One tensor in ``dtype``, through transformers' processor when given (as ``from_pretrained`` does)."""
    from gguf import dequantize

    weights = dequantize(tensor.data, tensor.tensor_type)
    if processor is not None:
        weights = processor.process(weights=weights, name=tensor.name).weights
    return torch.from_numpy(np.array(weights, dtype=np.float32)).to(dtype)


def _check_complete(model: nn.Module, source: ModelSource) -> None:
    """Every parameter and buffer was filled from the file; a missing one would compute garbage."""
    missing = unfilled(model)
    if missing:
        raise ModelLoadError(f"{source.name}: the GGUF file has no tensor for {', '.join(missing[:5])}")
