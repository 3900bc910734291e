"""Do a model's weight files agree with its config? Checked from file headers, before anything is allocated.

transformers trusts config.json: a ``vocab_size`` of 10^8 over a 49,152-row embedding allocates gigabytes
before it notices, and a ``num_hidden_layers`` of 6 over a 2-layer checkpoint loads silently with four layers
of random weights. So the sizes in the config are compared here with the shapes in the safetensors headers
(or, for GGUF, the metadata with the tensor table), and any disagreement is refused in words, naming the
weights. The architectures the engine is tested on (llama, qwen2, qwen3, mistral, phi3) are checked weight by
weight; others by their embedding and their number of layers.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

from ..errors import ModelLoadError, UnsupportedModelError
from .gguf_info import GGUFInfo

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER_BYTES = 100_000_000  # the limit the safetensors library itself enforces
SHOWN = 4  # names quoted in a message; the rest are counted
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
EMBEDDING_NAMES = ("embed_tokens", "wte", "word_embeddings", "embed_in", "tok_embeddings")
HARMLESS_EXTRA = re.compile(r"rotary_emb\.inv_freq$")  # saved by old llama conversions; transformers skips it
ALIASES = {"hidden_size": ("hidden_size", "n_embd", "d_model"),
           "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers")}


def read_json(path: Path) -> dict:
    """A JSON object from ``path``, or a :class:`ModelLoadError` naming the file and what is wrong with it."""
    try:
        data = json.loads(path.read_bytes())
    except OSError as exc:
        raise ModelLoadError(f"{path.name} can't be read: {exc.strerror or exc}") from None
    except (ValueError, RecursionError) as exc:
        raise ModelLoadError(f"{path.name} is not valid JSON ({str(exc)[:80]}); the file is damaged") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path.name} holds a JSON {type(data).__name__}, not an object; the file is damaged")
    return data


def model_config(folder: Path) -> dict:
    """The language model's part of ``folder/config.json`` (``text_config`` for a multimodal model)."""
    config = read_json(folder / "config.json")
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


# -- which files hold the weights, and what their headers say -----------------------------------------------


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files transformers reads: the shards the index names, else model.safetensors."""
    index = folder / INDEX_NAME
    if index.is_file():
        return [folder / name for name in _index_shards(folder, index)]
    single = folder / SINGLE_NAME
    return [single] if single.is_file() else []


def _index_shards(folder: Path, index: Path) -> list[str]:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelLoadError(f"{index.name} has no weight_map naming the shards; the file is damaged")
    shards = sorted(set(weight_map.values()), key=str)
    outside = [str(s) for s in shards if not _plain_relative(s)]
    if outside:
        raise ModelLoadError(f"{index.name} names files outside the model folder, which Kvasir refuses: "
                             f"{_some(outside)}")
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise ModelLoadError(
            f"{folder.name} is missing {len(missing)} of its {len(shards)} weight shards: {_some(missing)}"
        )
    return shards


def _plain_relative(name) -> bool:
    """A file name inside the folder: not absolute, no '..', on any platform (Hub snapshots are symlinks)."""
    if not isinstance(name, str) or not name:
        return False
    posix, windows = PurePosixPath(name), PureWindowsPath(name)
    return not (posix.is_absolute() or windows.is_absolute() or windows.drive or ".." in windows.parts)


def safetensors_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape over ``files``, each file's header checked against its size first."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        for name, (shape, _, _) in safetensors_header(file).items():
            shapes[name] = shape
    return shapes


def safetensors_header(file: Path) -> dict[str, tuple[tuple[int, ...], str, tuple[int, int]]]:
    """Name -> (shape, dtype, byte range) of a safetensors file, refused when the header does not add up."""
    try:
        with open(file, "rb") as f:
            size = file.stat().st_size
            head = f.read(8)
            length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < length <= min(size - 8, MAX_HEADER_BYTES):
                raise _damaged(file, "its header length is impossible for the file's size")
            raw = f.read(length)
    except OSError as exc:
        raise ModelLoadError(f"{file.name} can't be read: {exc.strerror or exc}") from None
    try:
        header = json.loads(raw)
    except (ValueError, RecursionError):
        raise _damaged(file, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _damaged(file, "its header is not a JSON object")
    entries = {name: _entry(file, name, e) for name, e in header.items() if name != "__metadata__"}
    _check_layout(file, entries, size - 8 - length)
    return entries


def _entry(file: Path, name: str, entry) -> tuple[tuple[int, ...], str, tuple[int, int]]:
    if not isinstance(entry, dict):
        raise _damaged(file, f"tensor {name!r} has no description")
    shape, dtype, offsets = entry.get("shape"), entry.get("dtype"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(_whole(d) for d in shape):
        raise _damaged(file, f"tensor {name!r} has no valid shape")
    if dtype not in DTYPE_BYTES:
        raise _damaged(file, f"tensor {name!r} has the unknown dtype {dtype!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_whole(o) for o in offsets)):
        raise _damaged(file, f"tensor {name!r} has no valid data_offsets")
    return tuple(shape), dtype, (offsets[0], offsets[1])


def _check_layout(file: Path, entries: dict, data_size: int) -> None:
    """Every tensor's bytes lie inside the file, match its shape and dtype, and overlap no other tensor's."""
    previous_end, previous = 0, None
    for name, (shape, dtype, (begin, end)) in sorted(entries.items(), key=lambda item: item[1][2]):
        if not begin <= end <= data_size:
            raise _damaged(file, f"tensor {name!r} claims bytes {begin:,}-{end:,} but the data has {data_size:,}")
        if end - begin != _numel(shape) * DTYPE_BYTES[dtype]:
            raise _damaged(file, f"tensor {name!r} is {list(shape)} {dtype} but is given {end - begin:,} bytes")
        if begin < previous_end:
            raise _damaged(file, f"the data of tensors {previous!r} and {name!r} overlap")
        previous_end, previous = end, name


def _damaged(file: Path, reason: str) -> ModelLoadError:
    return ModelLoadError(f"{file.name} is not a valid safetensors file: {reason}")


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _some(names: list[str]) -> str:
    shown = ("; " if any(", " in n for n in names) else ", ").join(names[:SHOWN])
    return shown if len(names) <= SHOWN else f"{shown} and {len(names) - SHOWN} more"


# -- Hugging Face folders -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Dims:
    """The sizes a decoder's weights follow from."""

    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int


def check_weights_match_config(folder: Path) -> None:
    """Refuse a model folder whose config.json disagrees with its weights' shapes, naming the weights."""
    config = model_config(folder)
    shapes = _without_model_prefix(safetensors_shapes(weight_files(folder)))
    embedding = _embedding_name(shapes, folder)
    _check_shape(folder, embedding, shapes[embedding], (_size(config, "vocab_size"), _size(config, "hidden_size")))
    _check_layer_count(folder, config, shapes, embedding)
    if config.get("model_type") in LAYER_TENSORS:
        _compare(folder, _expected_shapes(config), shapes, _optional_names(config))


def _without_model_prefix(shapes: dict) -> dict:
    """Checkpoints store the decoder under 'model.' or, saved from the bare decoder, without it."""
    return {name.removeprefix("model."): shape for name, shape in shapes.items()}


def _size(config: dict, key: str) -> int:
    for alias in ALIASES.get(key, (key,)):
        if alias in config:
            value = config[alias]
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ModelLoadError(f"config.json: {alias} is {value!r}; it must be a positive whole number")
            return value
    raise ModelLoadError(f"config.json has no {key}")


def _embedding_name(shapes: dict, folder: Path) -> str:
    found = sorted(n for n in shapes if n.endswith(".weight") and n.split(".")[-2] in EMBEDDING_NAMES)
    if not found:
        raise ModelLoadError(f"{folder.name}: no token embedding (embed_tokens.weight) in the weights")
    return found[0]


def _check_shape(folder: Path, name: str, actual: tuple, expected: tuple) -> None:
    if tuple(actual) != tuple(expected):
        raise ModelLoadError(
            f"{folder.name}: config.json does not match the weights: {name} is {list(actual)} in the weights "
            f"but config.json implies {list(expected)}"
        )


def _check_layer_count(folder: Path, config: dict, shapes: dict, embedding: str) -> None:
    """The decoder layers are the numbered siblings of the embedding ('layers.N.', 'h.N.')."""
    parts = embedding.split(".")
    parent = ".".join(parts[:-2]) + "." if len(parts) > 2 else ""
    pattern = re.compile(rf"^{re.escape(parent)}(\w+)\.(\d+)\.")
    groups: dict[str, set[int]] = {}
    for name in shapes:
        if match := pattern.match(name):
            groups.setdefault(match[1], set()).add(int(match[2]))
    present = max(groups.values(), key=len, default=set())
    wanted = _size(config, "num_hidden_layers")
    if present != set(range(wanted)):
        held = f"{len(present)} layers" + (f" (numbered {min(present)} to {max(present)})" if present else "")
        raise ModelLoadError(
            f"{folder.name}: config.json says num_hidden_layers is {wanted} but the weights hold {held}"
        )


def _dims(config: dict) -> Dims:
    hidden, heads = _size(config, "hidden_size"), _size(config, "num_attention_heads")
    kv_heads = _size(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else heads
    head_dim = _size(config, "head_dim") if config.get("head_dim") is not None else hidden // heads
    return Dims(_size(config, "vocab_size"), hidden, _size(config, "num_hidden_layers"), heads, kv_heads,
                head_dim, _size(config, "intermediate_size"))


def _llama_layer(d: Dims, config: dict) -> dict[str, tuple[int, ...]]:
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    shapes = {"self_attn.q_proj.weight": (q, d.hidden), "self_attn.k_proj.weight": (kv, d.hidden),
              "self_attn.v_proj.weight": (kv, d.hidden), "self_attn.o_proj.weight": (d.hidden, q),
              "mlp.gate_proj.weight": (d.intermediate, d.hidden), "mlp.up_proj.weight": (d.intermediate, d.hidden),
              "mlp.down_proj.weight": (d.hidden, d.intermediate)}
    if config.get("model_type") == "qwen2" or config.get("attention_bias"):
        shapes.update({"self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)})
    if config.get("model_type") != "qwen2" and config.get("attention_bias"):
        shapes["self_attn.o_proj.bias"] = (d.hidden,)
    if config.get("mlp_bias"):
        shapes.update({"mlp.gate_proj.bias": (d.intermediate,), "mlp.up_proj.bias": (d.intermediate,),
                       "mlp.down_proj.bias": (d.hidden,)})
    if config.get("model_type") == "qwen3":
        shapes.update({"self_attn.q_norm.weight": (d.head_dim,), "self_attn.k_norm.weight": (d.head_dim,)})
    return shapes


def _phi3_layer(d: Dims, config: dict) -> dict[str, tuple[int, ...]]:
    """phi3 fuses q, k and v into one projection, and gate and up into another."""
    q, kv = d.heads * d.head_dim, d.kv_heads * d.head_dim
    return {"self_attn.qkv_proj.weight": (q + 2 * kv, d.hidden), "self_attn.o_proj.weight": (d.hidden, q),
            "mlp.gate_up_proj.weight": (2 * d.intermediate, d.hidden),
            "mlp.down_proj.weight": (d.hidden, d.intermediate)}


LAYER_TENSORS = {"llama": _llama_layer, "mistral": _llama_layer, "qwen2": _llama_layer, "qwen3": _llama_layer,
                 "phi3": _phi3_layer}


def _expected_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every weight of a known architecture and its shape, named as in the checkpoint without 'model.'."""
    d = _dims(config)
    layer = LAYER_TENSORS[config["model_type"]](d, config)
    layer.update({"input_layernorm.weight": (d.hidden,), "post_attention_layernorm.weight": (d.hidden,)})
    shapes = {"embed_tokens.weight": (d.vocab, d.hidden), "norm.weight": (d.hidden,),
              "lm_head.weight": (d.vocab, d.hidden)}
    for i in range(d.layers):  # already checked against the weights, so this is bounded by the header's size
        shapes.update({f"layers.{i}.{name}": shape for name, shape in layer.items()})
    return shapes


def _optional_names(config: dict) -> set[str]:
    """A model with tied embeddings reuses embed_tokens as its output layer, so lm_head may be absent."""
    return {"lm_head.weight"} if config.get("tie_word_embeddings", False) else set()


def _compare(folder: Path, expected: dict, actual: dict, optional: set[str]) -> None:
    missing = [n for n in expected if n not in actual and n not in optional]
    unexpected = [n for n in actual if n not in expected and not HARMLESS_EXTRA.search(n)]
    wrong = [f"{n} is {list(actual[n])}, expected {list(s)}" for n, s in expected.items()
             if n in actual and tuple(actual[n]) != s]
    faults = [f"{len(names)} {what} ({_some(names)})" for what, names in
              (("missing", missing), ("unexpected", unexpected), ("with the wrong shape", wrong)) if names]
    if faults:
        raise ModelLoadError(f"{folder.name}: the weights do not match config.json: {'; '.join(faults)}")


def check_architecture_known(folder: Path) -> None:
    """Refuse a config.json whose model_type this transformers does not implement (imports transformers)."""
    from transformers import __version__
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = read_json(folder / "config.json").get("model_type")
    if isinstance(model_type, str) and model_type not in CONFIG_MAPPING:
        raise UnsupportedModelError(
            f"{folder.name}: config.json says model_type {model_type!r}, an architecture transformers "
            f"{__version__} does not know"
        )


# -- GGUF files -----------------------------------------------------------------------------------------------


def check_gguf_matches_metadata(info: GGUFInfo) -> None:
    """Refuse a GGUF file whose metadata disagrees with its tensor table (layer count, embedding, projections)."""
    name = info.path.name
    blocks = {int(m[1]) for t in info.tensors if (m := re.match(r"blk\.(\d+)\.", t))}
    wanted = info.positive_int(".block_count")
    if blocks != set(range(wanted)):
        raise ModelLoadError(f"{name}: its metadata says {wanted} blocks but its tensors hold {len(blocks)}")
    hidden = info.positive_int(".embedding_length")
    vocab = info.arch_value(".vocab_size") or info.token_count
    for tensor in ("token_embd.weight", "output.weight"):
        if tensor in info.tensors:
            _check_gguf_shape(info, tensor, (hidden, vocab) if vocab else None, hidden)
    if "token_embd.weight" not in info.tensors:
        raise ModelLoadError(f"{name} has no token_embd.weight tensor")
    if info.architecture in GGUF_BLOCK_TENSORS and not info.arch_value(".expert_count"):  # MoE blocks differ
        _check_gguf_blocks(info, hidden, wanted)


def _check_gguf_shape(info: GGUFInfo, tensor: str, expected: tuple | None, hidden: int) -> None:
    shape = info.tensors[tensor][0]
    if (expected is not None and shape != expected) or (not shape or shape[0] != hidden):
        wanted = list(expected) if expected else f"[{hidden}, ...]"
        raise ModelLoadError(
            f"{info.path.name}: its metadata does not match its tensors: {tensor} is {list(shape)}, "
            f"expected {wanted} (GGUF lists the innermost dimension first)"
        )


def _gguf_llama_block(info: GGUFInfo, hidden: int) -> dict[str, tuple[int, ...]]:
    heads = info.positive_int(".attention.head_count")
    kv_heads = info.positive_int(".attention.head_count_kv", heads)
    head_dim = info.positive_int(".attention.key_length", hidden // heads or None)
    ff = info.positive_int(".feed_forward_length")
    q, kv = heads * head_dim, kv_heads * head_dim
    if info.architecture == "phi3" and "blk.0.attn_qkv.weight" in info.tensors:  # phi3 may fuse q, k and v
        return {"attn_qkv.weight": (hidden, q + 2 * kv), "attn_output.weight": (q, hidden),
                "ffn_up.weight": (hidden, 2 * ff), "ffn_down.weight": (ff, hidden)}
    if info.architecture == "phi3":
        return {"attn_q.weight": (hidden, q), "attn_k.weight": (hidden, kv), "attn_v.weight": (hidden, kv),
                "attn_output.weight": (q, hidden), "ffn_up.weight": (hidden, 2 * ff), "ffn_down.weight": (ff, hidden)}
    return {"attn_q.weight": (hidden, q), "attn_k.weight": (hidden, kv), "attn_v.weight": (hidden, kv),
            "attn_output.weight": (q, hidden), "ffn_gate.weight": (hidden, ff), "ffn_up.weight": (hidden, ff),
            "ffn_down.weight": (ff, hidden)}


GGUF_BLOCK_TENSORS = {"llama": _gguf_llama_block, "qwen2": _gguf_llama_block, "qwen3": _gguf_llama_block,
                      "phi3": _gguf_llama_block}


def _check_gguf_blocks(info: GGUFInfo, hidden: int, blocks: int) -> None:
    block = GGUF_BLOCK_TENSORS[info.architecture](info, hidden)
    missing, wrong = [], []
    for i in range(blocks):
        for suffix, shape in block.items():
            found = info.tensors.get(f"blk.{i}.{suffix}")
            if found is None:
                missing.append(f"blk.{i}.{suffix}")
            elif found[0] != shape:
                wrong.append(f"blk.{i}.{suffix} is {list(found[0])}, expected {list(shape)}")
    faults = [f"{len(n)} {what} ({_some(n)})" for what, n in (("missing", missing), ("with the wrong shape", wrong))
              if n]
    if faults:
        raise ModelLoadError(f"{info.path.name}: its tensors do not match its metadata: {'; '.join(faults)}")
