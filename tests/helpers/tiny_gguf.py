"""Write a tiny llama model as a GGUF file with the ``gguf`` package, the way llama.cpp's converter does."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

LAYER_NAMES = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}


def _permute_for_rope(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp stores q/k rows interleaved for its rotary kernel; transformers undoes this on load."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(
        weight.shape
    )


def write_tiny_llama_gguf(model_dir: Path, path: Path, chat_template: str | None = "default",
                          linear_type: str = "F32", embedding_type: str = "F32") -> Path:
    """Convert the tiny llama folder ``model_dir`` (float32 safetensors) into the GGUF file ``path``.

    ``linear_type``: how the decoder's linear weights are stored ("F32", or a block type such as "Q4_1",
    "Q4_0", "Q8_0", quantised by the ``gguf`` package the way llama.cpp's quantiser writes them);
    ``embedding_type``: the same for ``token_embd``.
    """
    import gguf

    config = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(model_dir / "model.safetensors")
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama")
    writer.add_license("apache-2.0")
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_vocab_size(config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(writer, model_dir, chat_template)
    for name, tensor in tensors.items():
        gguf_name = _gguf_name(name)
        stored = embedding_type if gguf_name == "token_embd.weight" else linear_type
        _add_tensor(writer, gguf_name, _gguf_array(name, tensor, config), stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tensor(writer, name: str, array: np.ndarray, linear_type: str) -> None:
    import gguf

    is_matrix = (name.startswith("blk.") or name == "token_embd.weight") and array.ndim == 2
    if not is_matrix or linear_type == "F32":
        writer.add_tensor(name, array)
        return
    kind = gguf.GGMLQuantizationType[linear_type]
    blocks = quantize_q4_k(array) if linear_type == "Q4_K" else gguf.quants.quantize(array, kind)
    writer.add_tensor(name, blocks, raw_dtype=kind)


def quantize_q4_k(weight: np.ndarray) -> np.ndarray:
    """Q4_K super-blocks of ``weight`` [rows, cols % 256 == 0] (the gguf package reads them, but can't write them).

    Per 32 weights ``w ~ d * sc * q - dmin * m`` with 6-bit ``sc`` and ``m``; a plain min/max fit, enough for
    tests: the point is a file in the format, decoded exactly as ggml decodes it.
    """
    rows, cols = weight.shape
    groups = weight.astype(np.float32).reshape(rows, cols // 256, 8, 32)
    low = np.minimum(groups.min(-1), 0.0)  # Q4_K's minimum is subtracted: m >= 0
    step = (groups.max(-1) - low) / 15
    d = (step.max(-1, keepdims=True) / 63).astype(np.float16)
    dmin = (-low.min(-1, keepdims=True) / 63).astype(np.float16)
    sc = np.clip(np.round(step / np.maximum(d.astype(np.float32), 1e-30)), 1, 63).astype(np.uint8)
    m = np.clip(np.round(-low / np.maximum(dmin.astype(np.float32), 1e-30)), 0, 63).astype(np.uint8)
    scale = d.astype(np.float32) * sc
    codes = np.round((groups + (dmin.astype(np.float32) * m)[..., None]) / np.maximum(scale, 1e-30)[..., None])
    codes = np.clip(codes, 0, 15).astype(np.uint8).reshape(rows, cols // 256, 4, 2, 32)
    qs = (codes[:, :, :, 0] | (codes[:, :, :, 1] << 4)).reshape(rows, cols // 256, 128)
    packed = np.concatenate([  # ggml's 12-byte layout of eight 6-bit scales and minimums
        (sc[..., :4] & 63) | ((sc[..., 4:] >> 4) << 6),
        (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6),
        (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4),
    ], axis=-1).astype(np.uint8)
    return np.concatenate([d.view(np.uint8).reshape(rows, -1, 2), dmin.view(np.uint8).reshape(rows, -1, 2), packed, qs],
                          axis=-1).reshape(rows, -1)


def _gguf_name(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    if name == "lm_head.weight":
        return "output.weight"
    _, _, index, *rest = name.split(".")
    module, kind = ".".join(rest[:-1]), rest[-1]
    return f"blk.{index}.{LAYER_NAMES[module]}.{kind}"


def _gguf_array(name: str, tensor: torch.Tensor, config: dict) -> np.ndarray:
    if name.endswith("q_proj.weight"):
        tensor = _permute_for_rope(tensor, config["num_attention_heads"])
    elif name.endswith("k_proj.weight"):
        tensor = _permute_for_rope(tensor, config["num_key_value_heads"])
    return tensor.float().numpy()


def _add_tokenizer(writer, model_dir: Path, chat_template: str | None) -> None:
    spec = json.loads((model_dir / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    specials = {t["id"] for t in spec.get("added_tokens", [])}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in specials else 1 for i in range(len(tokens))])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)
    if chat_template == "default":
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        chat_template = config.get("chat_template") or (model_dir / "chat_template.jinja").read_text()
    if chat_template:
        writer.add_chat_template(chat_template)


def write_raw_gguf(path: Path, metadata: dict[str, int | str], tensors: list[tuple[str, tuple[int, ...], int, int]],
                   *, n_tensors: int | None = None, n_kv: int | None = None, data_bytes: int = 0) -> Path:
    """A GGUF file written byte by byte, so its header can say anything (a damaged or hostile file).

    ``metadata``: str values are written as strings, int values as uint32, bytes as they are (a value's type and
    payload, :func:`nested_array_value`). ``tensors``: (name, dims innermost
    first, ggml type id, offset into the data). ``n_tensors`` / ``n_kv`` override the counts in the header.
    """
    out = bytearray(b"GGUF" + struct.pack("<I", 3))
    out += struct.pack("<QQ", len(tensors) if n_tensors is None else n_tensors, len(metadata) if n_kv is None else n_kv)
    for key, value in metadata.items():
        out += _raw_string(key)
        if isinstance(value, bytes):
            out += value
        else:
            out += struct.pack("<I", 8) + _raw_string(value) if isinstance(value, str) else struct.pack("<II", 4, value)
    for name, dims, kind, offset in tensors:
        out += _raw_string(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        out += struct.pack("<IQ", kind, offset)
    out += bytes(-len(out) % 32 + data_bytes)
    path.write_bytes(bytes(out))
    return path


def _raw_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def nested_array_value(depth: int) -> bytes:
    """A metadata value that is an array holding an array ... ``depth`` deep, the innermost empty (uint32)."""
    array, uint32 = 9, 4
    return struct.pack("<I", array) + struct.pack("<IQ", array, 1) * (depth - 1) + struct.pack("<IQ", uint32, 0)
