"""A model with no weights yet, filled tensor by tensor: what the GGUF and the streamed loaders share.

The skeleton is built from a config on the ``meta`` device (parameters take no memory; buffers such as the
rotary frequencies are real), then each loader swaps in quantised linear layers and assigns the rest.
"""

from __future__ import annotations

import torch
from torch import nn

from ..step.attention import register as register_attention
from ..step.lean_decoder import computes_exactly
from ..step.quantization import quantizable_linears
from .llama_family import LlamaFamilyModel


def empty_model(config, dtype: torch.dtype, attn: str) -> nn.Module:
    """The causal LM of ``config`` with its parameters on ``meta``: the engine's own module tree for the llama
    family, transformers' model class (its attention ``attn``) for the rest."""
    if computes_exactly(config):
        return LlamaFamilyModel(config, dtype)
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    register_attention()
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    return model.eval()


def named_linears(model: nn.Module) -> dict[str, tuple[nn.Module, str, nn.Linear]]:
    """Module name -> (parent, attribute, layer) of every linear layer quantisation replaces."""
    prefix = {id(module): name for name, module in model.named_modules()}
    return {f"{prefix[id(parent)]}.{attr}".lstrip("."): (parent, attr, layer)
            for parent, attr, layer in quantizable_linears(model)}


def unfilled(model: nn.Module) -> list[str]:
    """Parameters and buffers still on ``meta``: a model with any of them would compute garbage."""
    return [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
