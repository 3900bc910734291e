"""A lean forward pass for the llama family (llama, mistral, qwen2, qwen3) over a loaded transformers model.

transformers' modules spend most of a one-token step in Python: keyword plumbing, decorators, output
bookkeeping, about twenty dispatched calls per layer. This runs the same arithmetic, in the same order (so
greedy output stays identical to ``generate``), calling the model's own submodules (linear layers of any kind:
float, bitsandbytes or packed, and the rotary embedding) with nothing in between. Other architectures keep the
transformers path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .attention import StepMetadata, paged_attention
from .graph_attention import GraphDecodeMetadata

LEAN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


@dataclass(slots=True)
class _LayerIndex:
    """What the paged attention function reads from the module it is handed: the layer's index."""

    layer_idx: int


def computes_exactly(config) -> bool:
    """Whether the lean decoder computes the architecture of ``config``: the family, with the gated SiLU MLP."""
    return config.model_type in LEAN_MODEL_TYPES and getattr(config, "hidden_act", "silu") == "silu"


def lean_decoder_for(model: torch.nn.Module) -> LeanDecoder | None:
    """A :class:`LeanDecoder` over ``model`` when its architecture is one it computes exactly, else None."""
    if not computes_exactly(model.config):
        return None
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "rotary_emb") or not hasattr(model, "lm_head"):
        return None
    return LeanDecoder(model)


class LeanDecoder:
    """Runs ``model`` on one packed row of tokens with paged attention; returns the logits of chosen rows."""

    def __init__(self, model: torch.nn.Module) -> None:
        inner = model.model
        self.embed_tokens = inner.embed_tokens
        self.rotary_emb = inner.rotary_emb
        self.norm = inner.norm
        self.lm_head = model.lm_head
        self.layers = [_LeanLayer(layer, index) for index, layer in enumerate(inner.layers)]

    def __call__(self, input_ids: torch.Tensor, meta: StepMetadata | GraphDecodeMetadata,
                 sample_index: torch.Tensor) -> torch.Tensor:
        """``input_ids``: ``[T]``; returns ``[len(sample_index), vocab]`` logits. ``meta`` is the eager step's
        metadata or a graph-safe decode step's (:mod:`.graph_attention`)."""
        hidden = self.embed_tokens(input_ids[None])  # [1, T, hidden]
        cos, sin = self.rotary_emb(hidden, meta.positions[None])
        rotary = (cos.unsqueeze(1), sin.unsqueeze(1))  # broadcast over heads: [1, 1, T, D]
        for layer in self.layers:
            hidden = layer(hidden, rotary, meta)
        hidden = self.norm(hidden[:, sample_index])
        return self.lm_head(hidden)[0]


class _LeanLayer:
    """One decoder layer: attention and MLP, each behind an RMSNorm and a residual, as transformers computes it."""

    def __init__(self, layer: torch.nn.Module, index: int) -> None:
        attention = layer.self_attn
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (
            attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj
        )
        self.q_norm = getattr(attention, "q_norm", None)  # qwen3 normalises each head's queries and keys
        self.k_norm = getattr(attention, "k_norm", None)
        self.head_dim, self.scaling = attention.head_dim, attention.scaling
        self.gate_proj, self.up_proj, self.down_proj = layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj
        self.act = layer.mlp.act_fn
        self.index = _LayerIndex(index)

    def __call__(self, hidden: torch.Tensor, rotary, meta: StepMetadata | GraphDecodeMetadata) -> torch.Tensor:
        hidden = hidden + self._attention(self.input_norm(hidden), rotary, meta)
        normed = self.post_norm(hidden)
        return hidden + self.down_proj(self.act(self.gate_proj(normed)) * self.up_proj(normed))

    def _attention(self, hidden: torch.Tensor, rotary, meta: StepMetadata | GraphDecodeMetadata) -> torch.Tensor:
        shape = (*hidden.shape[:-1], -1, self.head_dim)  # [1, T, heads, D]
        query, key = self.q_proj(hidden).view(shape), self.k_proj(hidden).view(shape)
        if self.q_norm is not None:
            query, key = self.q_norm(query), self.k_norm(key)
        value = self.v_proj(hidden).view(shape).transpose(1, 2)
        query, key = _rotate(query.transpose(1, 2), key.transpose(1, 2), *rotary)
        if isinstance(meta, GraphDecodeMetadata):
            out = meta.attend(self.index.layer_idx, query, key, value, self.scaling)
        else:
            out, _ = paged_attention(self.index, query, key, value, None, scaling=self.scaling, kvasir=meta)
        return self.o_proj(out.reshape(*hidden.shape[:-1], -1))


def _rotate(query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary position embedding, the same arithmetic as transformers' ``apply_rotary_pos_emb``."""
    return query * cos + _rotate_half(query) * sin, key * cos + _rotate_half(key) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
