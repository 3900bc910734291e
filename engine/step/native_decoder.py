"""The CPU step for llama-family models whose linear layers are native Q4_1 / Q8_0 block layers.

At one token per sequence a step is mostly small operations. A decode step (every sequence one new token)
runs all layers in one native call (``kernels/decode_step.cpp``); other steps run each layer in eleven calls:
the fused QKV and gate-up projections (one block matrix each, see :func:`.block_linear.fuse`), RMSNorm with
the residual add, rotary embedding in place, the gated activation and paged decode attention from
``kernels/layer_ops.cpp``, with prefill chunks attending sequence by sequence through torch's SDPA
(:func:`.attention.attend_sequences`). The arithmetic is transformers' (the same formulas), computed in a
different order, so it is tested against the lean decoder's logits with a tolerance rather than token for
token. Float models run through the lean decoder, whose decode rows on the CPU take the same attention kernel
(:func:`.attention.uses_native_decode`).
"""

from __future__ import annotations

import torch

from . import kernels
from .attention import StepMetadata, attend_natively
from .block_linear import GROUP, BlockQuantLinear, can_fuse, fuse
from .lean_decoder import lean_decoder_for


def native_decoder_for(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> NativeDecoder | None:
    """A :class:`NativeDecoder` over ``model`` where every piece has a native kernel, else None."""
    if device.type != "cpu" or dtype != torch.float32 or lean_decoder_for(model) is None or not kernels.available():
        return None
    layers = model.model.layers
    if any(getattr(layer.self_attn, "q_norm", None) is not None for layer in layers):
        return None  # per-head query and key norms (qwen3): the lean decoder computes those
    if type(model.lm_head) is not BlockQuantLinear or not all(_fusable(layer) for layer in layers):
        return None
    return NativeDecoder(model)


def _fusable(layer: torch.nn.Module) -> bool:
    attention, mlp = layer.self_attn, layer.mlp
    whole_groups = all(type(p) is BlockQuantLinear and p.out_features % GROUP == 0
                       for p in (attention.o_proj, mlp.down_proj))  # decode_step.cpp reads widths from groups
    return (can_fuse([attention.q_proj, attention.k_proj, attention.v_proj]) and can_fuse([mlp.gate_proj, mlp.up_proj])
            and whole_groups)


class NativeDecoder:
    """Runs the model on one packed row of tokens; returns the logits of the rows in ``sample_index``."""

    def __init__(self, model: torch.nn.Module) -> None:
        inner = model.model
        self.embed_tokens, self.rotary_emb, self.lm_head = inner.embed_tokens, inner.rotary_emb, model.lm_head
        self.final_norm = _norm(inner.norm)
        self.layers = [_NativeLayer(layer, index) for index, layer in enumerate(inner.layers)]
        self._step_weights = [tensor for layer in self.layers for tensor in layer.step_weights()]
        self._step_kinds = [kind for layer in self.layers for kind in layer.step_kinds()]
        first = self.layers[0]
        self._step_shape = (first.heads, first.kv_heads, first.input_norm[1], first.scaling)
        # one call per decode step needs one shape, epsilon and scale for every layer (true of every llama file)
        shapes = {(layer.heads, layer.kv_heads, layer.input_norm[1], layer.post_norm[1], layer.scaling)
                  for layer in self.layers}
        self._one_call = len(shapes) == 1 and first.input_norm[1] == first.post_norm[1]
        # round the linear layers' activations to about 15 bits instead of 8 (each row's 8-bit codes, then their
        # remainder's: BlockQuantLinear.forward): a draft model's, for a float serving model (see draft_model.py)
        self.fine_activations = False

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, meta: StepMetadata, sample_index: torch.Tensor) -> torch.Tensor:
        ops = torch.ops.kvasir_kernels
        residual = self.embed_tokens(input_ids).contiguous()  # [T, hidden]
        cos, sin = self.rotary_emb(residual[None], meta.positions[None])
        cos, sin = cos[0].contiguous(), sin[0].contiguous()  # [T, head_dim]
        decode, fine = meta.decode, self.fine_activations
        if self._one_call and meta.prefill is None and decode is not None and decode.is_whole_step:
            tables = decode.kv_blocks.view(decode.kv_lengths.numel(), -1)
            cache = meta.kv_cache
            ops.decode_layers_(residual, cos, sin, meta.slot_mapping, tables, decode.kv_lengths, cache.keys,
                               cache.values, cache.key_scales, cache.value_scales, self._step_weights,
                               self._step_kinds, *self._step_shape, fine)
            return self.lm_head(ops.rms_norm(residual.index_select(0, sample_index), *self.final_norm), fine)
        normed = ops.rms_norm(residual, *self.layers[0].input_norm)
        last = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            normed = ops.add_rms_norm_(residual, layer.attention(normed, cos, sin, meta, fine), *layer.post_norm)
            mlp = layer.down_proj(ops.silu_mul(layer.gate_up(normed, fine)), fine)
            if index < last:
                normed = ops.add_rms_norm_(residual, mlp, *self.layers[index + 1].input_norm)
            else:
                residual += mlp
        return self.lm_head(ops.rms_norm(residual.index_select(0, sample_index), *self.final_norm), fine)


_KIND_CODES = {"q4_1": 0, "q8_0": 1, "q4_1f": 2}  # decode_step.cpp's block kinds


def _or(tensor: torch.Tensor | None, default: torch.Tensor) -> torch.Tensor:
    return default if tensor is None else tensor.detach().float().contiguous()


def _norm(module: torch.nn.Module) -> tuple[torch.Tensor, float]:
    """An RMSNorm module's weight (float32, contiguous) and epsilon."""
    return module.weight.detach().float().contiguous(), float(module.variance_epsilon)


class _NativeLayer:
    def __init__(self, layer: torch.nn.Module, index: int) -> None:
        attention, mlp = layer.self_attn, layer.mlp
        self.index = index
        self.input_norm, self.post_norm = _norm(layer.input_layernorm), _norm(layer.post_attention_layernorm)
        self.qkv = fuse([attention.q_proj, attention.k_proj, attention.v_proj])
        self.gate_up = fuse([mlp.gate_proj, mlp.up_proj])
        self.o_proj, self.down_proj = attention.o_proj, mlp.down_proj
        self.head_dim, self.scaling = attention.head_dim, attention.scaling
        self.heads = attention.q_proj.out_features // self.head_dim
        self.kv_heads = attention.k_proj.out_features // self.head_dim

    def step_weights(self) -> list[torch.Tensor]:
        """This layer's part of ``decode_layers_``'s weight list (empty tensors for missing biases)."""
        none = torch.empty(0)
        return [self.input_norm[0], self.qkv.blocks, _or(self.qkv.bias, none), self.o_proj.blocks,
                _or(self.o_proj.bias, none), self.post_norm[0], self.gate_up.blocks, _or(self.gate_up.bias, none),
                self.down_proj.blocks, _or(self.down_proj.bias, none)]

    def step_kinds(self) -> list[int]:
        return [_KIND_CODES[p.kind] for p in (self.qkv, self.o_proj, self.gate_up, self.down_proj)]

    def attention(self, normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: StepMetadata,
                  fine: bool = False):
        qkv = self.qkv(normed, fine)  # [T, (heads + 2 kv_heads) * head_dim]
        torch.ops.kvasir_kernels.rotary_qk_(qkv, self.heads, self.kv_heads, cos, sin)
        tokens, q_width, kv_width = qkv.shape[0], self.heads * self.head_dim, self.kv_heads * self.head_dim
        cache = meta.kv_cache
        key = qkv[:, q_width : q_width + kv_width].view(tokens, self.kv_heads, self.head_dim)
        value = qkv[:, q_width + kv_width :].view(tokens, self.kv_heads, self.head_dim)
        cache.write(self.index, meta.slot_mapping, key, value)
        query = qkv[:, :q_width].view(tokens, self.heads, self.head_dim)
        out = attend_natively(query, cache, self.index, meta.decode, meta.prefill, self.scaling)
        return self.o_proj(out.view(tokens, q_width), fine)

