"""The llama family (llama, mistral, qwen2, qwen3) as a plain module tree, without transformers' modeling code.

The engine computes these models with its own forward passes (:mod:`..step.lean_decoder` and
:mod:`..step.native_decoder`), which read the modules' weights and a few attributes and call nothing else.
transformers' model classes would bring in its whole modeling stack at import: torch's compiler, sympy and
torch.distributed, about 80 MiB of resident memory and a second of start-up that a serving engine never uses.
So the tree here has transformers' module names, shapes and dtypes (weights load under the same names, from
GGUF files and safetensors alike) and the same norm and rotary arithmetic, and nothing of its forward pass.
The tools that run transformers' own forward pass over the engine's weights build one over these very modules
(:func:`transformers_view`).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS, dynamic_rope_update

from ..serving.kv_cache import config_head_dim
from ..step.lean_decoder import computes_exactly


def _biases(config) -> tuple[bool, bool, bool]:
    """Whether the q/k/v projections, the output projection and the MLP have biases, as each architecture says."""
    if config.model_type == "qwen2":
        return True, False, False
    if config.model_type == "mistral":
        return False, False, False
    attention = bool(getattr(config, "attention_bias", False))
    mlp = bool(getattr(config, "mlp_bias", False)) if config.model_type == "llama" else False
    return attention, attention, mlp


class RMSNorm(nn.Module):
    """Root-mean-square norm, computed in float32 and scaled in the input's dtype, as transformers does."""

    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size, dtype=dtype, device="meta"))
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden.to(input_dtype)


class RotaryEmbedding(nn.Module):
    """cos and sin of each position's rotation, from transformers' own frequency functions (every rope type it
    knows: default, linear, dynamic, yarn, llama3, longrope), in its arithmetic."""

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.max_seq_len_cached = self.original_max_seq_len = config.max_position_embeddings
        self.rope_type = config.rope_parameters["rope_type"]
        init = _default_frequencies if self.rope_type == "default" else ROPE_INIT_FUNCTIONS[self.rope_type]
        inv_freq, self.attention_scaling = init(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("original_inv_freq", inv_freq.clone(), persistent=False)

    @torch.no_grad()
    @dynamic_rope_update  # recomputes the frequencies of dynamic rope types as positions grow
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.attention_scaling
        sin = emb.sin() * self.attention_scaling
        return cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)


def _default_frequencies(config, *_, **__) -> tuple[torch.Tensor, float]:
    base = config.rope_parameters["rope_theta"]
    dim = config_head_dim(config)
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0


def _linear(inputs: int, outputs: int, bias: bool, dtype: torch.dtype) -> nn.Linear:
    return nn.Linear(inputs, outputs, bias=bias, device="meta", dtype=dtype)


class Attention(nn.Module):
    def __init__(self, config, dtype: torch.dtype) -> None:
        super().__init__()
        qkv_bias, output_bias, _ = _biases(config)
        self.head_dim = config_head_dim(config)
        self.scaling = self.head_dim**-0.5
        hidden, heads, kv_heads = config.hidden_size, config.num_attention_heads, config.num_key_value_heads
        self.q_proj = _linear(hidden, heads * self.head_dim, qkv_bias, dtype)
        self.k_proj = _linear(hidden, kv_heads * self.head_dim, qkv_bias, dtype)
        self.v_proj = _linear(hidden, kv_heads * self.head_dim, qkv_bias, dtype)
        self.o_proj = _linear(heads * self.head_dim, hidden, output_bias, dtype)
        if config.model_type == "qwen3":  # each head's queries and keys normalised
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps, dtype)


class MLP(nn.Module):
    def __init__(self, config, dtype: torch.dtype) -> None:
        super().__init__()
        bias = _biases(config)[2]
        self.gate_proj = _linear(config.hidden_size, config.intermediate_size, bias, dtype)
        self.up_proj = _linear(config.hidden_size, config.intermediate_size, bias, dtype)
        self.down_proj = _linear(config.intermediate_size, config.hidden_size, bias, dtype)
        self.act_fn = nn.SiLU()


class DecoderLayer(nn.Module):
    def __init__(self, config, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = Attention(config, dtype)
        self.mlp = MLP(config, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)


class Decoder(nn.Module):
    def __init__(self, config, dtype: torch.dtype) -> None:
        super().__init__()
        table = torch.empty(config.vocab_size, config.hidden_size, device="meta", dtype=dtype)
        self.embed_tokens = nn.Embedding(*table.shape, _weight=table)  # no initialisation: it imports dynamo
        self.layers = nn.ModuleList(DecoderLayer(config, dtype) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, dtype)
        self.rotary_emb = RotaryEmbedding(config)


class LlamaFamilyModel(nn.Module):
    """A causal LM of the family with its parameters on ``meta``, for a loader to fill (see :mod:`.skeleton`)."""

    base_model_prefix = "model"

    def __init__(self, config, dtype: torch.dtype) -> None:
        super().__init__()
        from transformers import GenerationConfig

        if not computes_exactly(config):
            raise ValueError(f"{config.model_type} with {getattr(config, 'hidden_act', '?')} is not of the family")
        self.config = config
        self.generation_config = GenerationConfig.from_model_config(config)
        self.model = Decoder(config, dtype)
        self.lm_head = _linear(config.hidden_size, config.vocab_size, False, dtype)

    def tie_weights(self) -> None:
        """The output head shares the token embedding's weight where the config says the two are tied."""
        if getattr(self.config, "tie_word_embeddings", False) and isinstance(self.lm_head, nn.Linear):
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def set_input_embeddings(self, module: nn.Module) -> None:
        self.model.embed_tokens = module

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def set_output_embeddings(self, module: nn.Module) -> None:
        self.lm_head = module

    def forward(self, *args, **kwargs):
        raise TypeError("the engine runs this model through its own decoders; transformers_view() gives one "
                        "with transformers' forward pass")


def transformers_view(model: nn.Module) -> nn.Module:
    """transformers' own model class over ``model``'s modules (the same weights, nothing copied): the oracle the
    tools compare against. A transformers model is returned as it is."""
    if not isinstance(model, LlamaFamilyModel):
        return model
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        view = AutoModelForCausalLM.from_config(model.config, dtype=next(model.parameters()).dtype)
    _lend(model, view, "")
    view.generation_config = model.generation_config
    return view.to(next(model.parameters()).device).eval()


_STRUCTURE = (LlamaFamilyModel, Decoder, DecoderLayer, Attention, MLP, nn.ModuleList)


def _lend(module: nn.Module, view: nn.Module, prefix: str) -> None:
    """Put ``module``'s layers into ``view`` at the same names: linear layers and embeddings of any kind whole,
    the norms' weights; the tree's own containers are walked, the rotary frequencies are transformers' own."""
    for name, child in module.named_children():
        path = prefix + name
        if isinstance(child, _STRUCTURE):
            _lend(child, view, path + ".")
        elif isinstance(child, RMSNorm):
            view.get_submodule(path).weight = child.weight
        elif not isinstance(child, (RotaryEmbedding, nn.SiLU)):
            view.set_submodule(path, child)
