"""A config that disagrees with its weights is refused from the headers, naming the weights that differ."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine import ModelLoadError, UnsupportedModelError
from engine.models.gguf_info import read_gguf_info
from engine.models.model_info import read_model_info
from engine.models.sources import ModelSource
from engine.models.weights_check import (
    check_architecture_known,
    check_gguf_matches_metadata,
    check_weights_match_config,
)
from tests.helpers.tiny_gguf import write_raw_gguf
from tests.helpers.tiny_models import ARCHITECTURES, write_tiny_model

F32 = 0  # ggml type id


def _copy(folder, tmp_path, config_changes=None, name="copy"):
    """A copy of a tiny model folder (weights linked, not copied) with ``config_changes`` applied."""
    out = tmp_path / name
    out.mkdir()
    for f in folder.iterdir():
        (out / f.name).symlink_to(f) if f.suffix == ".safetensors" else shutil.copy(f, out / f.name)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, **(config_changes or {})}))
    return out


def _rewrite_weights(folder, change):
    """Replace the folder's weights by ``change(tensors)``."""
    path = folder / "model.safetensors"
    tensors = load_file(path)
    path.unlink()
    save_file(change(tensors), path)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_tested_architecture_matches_its_config(tiny_model_dirs, arch):
    check_weights_match_config(tiny_model_dirs[arch])  # no exception: nothing wrongly refused


@pytest.mark.parametrize("arch", ["qwen2", "phi3"])
def test_tied_embeddings_without_lm_head_and_a_bare_decoder_pass(tmp_path, tokenizer_dir, arch):
    folder = write_tiny_model(arch, tmp_path / arch, tokenizer_dir, vocab_size=300, tie_word_embeddings=True)
    tensors = load_file(folder / "model.safetensors")
    assert "lm_head.weight" not in tensors
    check_weights_match_config(folder)
    # The bare decoder, saved without the 'model.' prefix, is the same model.
    _rewrite_weights(folder, lambda t: {k.removeprefix("model."): v for k, v in t.items()})
    check_weights_match_config(folder)


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"vocab_size": 10**8}, r"embed_tokens.weight is \[49152, 64\] in the weights but config.json implies "
                                r"\[100000000, 64\]"),
        ({"hidden_size": 128}, r"embed_tokens.weight is \[49152, 64\] .* implies \[49152, 128\]"),
        ({"num_hidden_layers": 6}, "num_hidden_layers is 6 but the weights hold 2 layers"),
        ({"num_hidden_layers": 1}, "num_hidden_layers is 1 but the weights hold 2 layers"),
        ({"num_key_value_heads": 4}, r"4 with the wrong shape \(layers.0.self_attn.k_proj.weight is \[32, 64\], "
                                     r"expected \[64, 64\]"),
        # The saved config has head_dim 16, so fewer heads means narrower q and o projections.
        ({"num_attention_heads": 2}, r"4 with the wrong shape \(layers.0.self_attn.q_proj.weight is \[64, 64\], "
                                     r"expected \[32, 64\]; layers.0.self_attn.o_proj"),
        ({"intermediate_size": 100}, r"6 with the wrong shape .*mlp.gate_proj.weight is \[128, 64\], expected "
                                     r"\[100, 64\].* and 2 more"),
        ({"attention_bias": True}, r"8 missing \(layers.0.self_attn.q_proj.bias, "),
        ({"num_attention_heads": 0}, "num_attention_heads is 0; it must be a positive whole number"),
        ({"vocab_size": "lots"}, "vocab_size is 'lots'"),
    ],
)
def test_config_sizes_that_disagree_with_the_weights_are_named(tiny_llama, tmp_path, changes, message):
    with pytest.raises(ModelLoadError, match=message):
        check_weights_match_config(_copy(tiny_llama, tmp_path, changes))


def test_phi3_fused_projections_are_checked(tiny_model_dirs, tmp_path):
    folder = _copy(tiny_model_dirs["phi3"], tmp_path, {"intermediate_size": 96})
    with pytest.raises(ModelLoadError, match=r"mlp.gate_up_proj.weight is \[256, 64\], expected \[192, 64\]"):
        check_weights_match_config(folder)


def test_qwen3_head_dim_is_taken_from_the_config(tiny_model_dirs, tmp_path):
    folder = _copy(tiny_model_dirs["qwen3"], tmp_path, {"head_dim": 16})
    with pytest.raises(ModelLoadError, match=r"q_proj.weight is \[128, 64\], expected \[64, 64\]"):
        check_weights_match_config(folder)


def test_missing_unexpected_and_untied_weights_are_named(tiny_llama, tmp_path):
    missing = _copy(tiny_llama, tmp_path, name="missing")
    _rewrite_weights(missing, lambda t: {k: v for k, v in t.items() if k != "model.layers.1.mlp.down_proj.weight"})
    with pytest.raises(ModelLoadError, match=r"1 missing \(layers.1.mlp.down_proj.weight\)"):
        check_weights_match_config(missing)
    extra = _copy(tiny_llama, tmp_path, name="extra")
    _rewrite_weights(extra, lambda t: {**t, "model.layers.0.mlp.spare.weight": torch.zeros(2, 2)})
    with pytest.raises(ModelLoadError, match=r"1 unexpected \(layers.0.mlp.spare.weight\)"):
        check_weights_match_config(extra)
    no_head = _copy(tiny_llama, tmp_path, name="no-head")  # not tied, so the output layer must be there
    _rewrite_weights(no_head, lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"})
    with pytest.raises(ModelLoadError, match=r"1 missing \(lm_head.weight\)"):
        check_weights_match_config(no_head)
    old = _copy(tiny_llama, tmp_path, name="old")  # old llama conversions saved this buffer; it is harmless
    _rewrite_weights(old, lambda t: {**t, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.zeros(8)})
    check_weights_match_config(old)


def test_unknown_architecture_gets_embedding_and_layer_checks_then_is_refused_by_name(tiny_llama, tmp_path):
    folder = _copy(tiny_llama, tmp_path, {"model_type": "nosuchmodel", "num_hidden_layers": 3})
    with pytest.raises(ModelLoadError, match="num_hidden_layers is 3 but the weights hold 2 layers"):
        check_weights_match_config(folder)
    folder = _copy(tiny_llama, tmp_path, {"model_type": "nosuchmodel", "intermediate_size": 1}, name="other")
    check_weights_match_config(folder)  # projections of an unknown architecture are not guessed at
    with pytest.raises(UnsupportedModelError, match="model_type 'nosuchmodel', an architecture transformers"):
        check_architecture_known(folder)
    check_architecture_known(tiny_llama)


def _gguf(tmp_path, metadata, tensors, name="m.gguf", **kwargs):
    base = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 8,
            "llama.attention.head_count": 2, "llama.attention.head_count_kv": 1, "llama.feed_forward_length": 16,
            "llama.vocab_size": 10}
    path = write_raw_gguf(tmp_path / name, {**base, **metadata}, tensors, data_bytes=8192, **kwargs)
    return read_gguf_info(path)


def _llama_tensors(blocks=2, embd=(8, 10), q=(8, 8)):
    """The tensor table of a 2-block llama with hidden 8, 2 heads of 4, 1 KV head, ff 16 (data not needed)."""
    shapes = {"token_embd.weight": embd}
    for i in range(blocks):
        shapes.update({f"blk.{i}.attn_q.weight": q, f"blk.{i}.attn_k.weight": (8, 4), f"blk.{i}.attn_v.weight": (8, 4),
                       f"blk.{i}.attn_output.weight": (8, 8), f"blk.{i}.ffn_gate.weight": (8, 16),
                       f"blk.{i}.ffn_up.weight": (8, 16), f"blk.{i}.ffn_down.weight": (16, 8)})
    table, offset = [], 0
    for name, (a, b) in shapes.items():  # float32 data laid end to end, each at a 32-byte boundary
        table.append((name, (a, b), F32, offset))
        offset += -(-a * b * 4 // 32) * 32
    return table


def test_gguf_metadata_is_checked_against_the_tensor_table(tmp_path):
    check_gguf_matches_metadata(_gguf(tmp_path, {}, _llama_tensors()))
    cases = [
        ({"llama.block_count": 6}, _llama_tensors(), "its metadata says 6 blocks but its tensors hold 2"),
        ({"llama.vocab_size": 10**8}, _llama_tensors(), r"token_embd.weight is \[8, 10\], expected \[8, 100000000\]"),
        ({"llama.embedding_length": 16}, _llama_tensors(), r"token_embd.weight is \[8, 10\], expected \[16, 10\]"),
        ({}, _llama_tensors(q=(8, 6)), r"2 with the wrong shape \(blk.0.attn_q.weight is \[8, 6\], expected \[8, 8\]"),
        ({}, _llama_tensors()[:-1], r"1 missing \(blk.1.ffn_down.weight\)"),
        ({"llama.attention.head_count": 0}, _llama_tensors(), "llama.attention.head_count is 0"),
        ({"llama.block_count": "two"}, _llama_tensors(), "llama.block_count is 'two'"),
    ]
    for i, (metadata, tensors, message) in enumerate(cases):
        with pytest.raises(ModelLoadError, match=message):
            check_gguf_matches_metadata(_gguf(tmp_path, metadata, tensors, name=f"{i}.gguf"))


def test_model_info_refuses_zero_heads_instead_of_dividing(tmp_path, tiny_llama):
    info = _gguf(tmp_path, {"llama.attention.head_count": 0}, _llama_tensors())
    with pytest.raises(ModelLoadError, match="m.gguf: llama.attention.head_count is 0"):
        read_model_info(ModelSource("m", tmp_path, "m.gguf"))
    assert info.token_count is None
    folder = _copy(tiny_llama, tmp_path, {"num_attention_heads": 0})
    with pytest.raises(ModelLoadError, match="num_attention_heads is 0"):
        read_model_info(ModelSource("copy", folder))


def test_model_info_counts_only_the_weights_transformers_reads(tiny_llama, tmp_path):
    folder = _copy(tiny_llama, tmp_path)
    (folder / "consolidated.safetensors").symlink_to(tiny_llama / "model.safetensors")  # a second format's copy
    info = read_model_info(ModelSource("copy", folder))
    assert info.parameter_count == read_model_info(ModelSource("llama", tiny_llama)).parameter_count
    assert info.parameter_count == sum(t.numel() for t in load_file(tiny_llama / "model.safetensors").values())


def test_phi3_gguf_with_fused_projections_is_checked(tmp_path):
    metadata = {"general.architecture": "phi3", **{k.replace("llama.", "phi3."): v for k, v in
                                                   [("llama.block_count", 1), ("llama.embedding_length", 8),
                                                    ("llama.attention.head_count", 2),
                                                    ("llama.attention.head_count_kv", 2),
                                                    ("llama.feed_forward_length", 16), ("llama.vocab_size", 10)]}}
    shapes = {"token_embd.weight": (8, 10), "blk.0.attn_qkv.weight": (8, 24), "blk.0.attn_output.weight": (8, 8),
              "blk.0.ffn_up.weight": (8, 32), "blk.0.ffn_down.weight": (16, 8)}
    table = [(name, dims, F32, 1024 * i) for i, (name, dims) in enumerate(shapes.items())]
    check_gguf_matches_metadata(read_gguf_info(write_raw_gguf(tmp_path / "p.gguf", metadata, table, data_bytes=8192)))
    metadata["phi3.feed_forward_length"] = 12
    path = write_raw_gguf(tmp_path / "q.gguf", metadata, table, data_bytes=8192)
    with pytest.raises(ModelLoadError, match=r"blk.0.ffn_up.weight is \[8, 32\], expected \[8, 24\]"):
        check_gguf_matches_metadata(read_gguf_info(path))
