"""A GGUF file's config and tokenizer read from its header equal what transformers derives (its slow reading is
the oracle), for the bundled model, a converted tiny llama and header-only files of every architecture handled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from transformers import AutoConfig, AutoTokenizer

from engine.models import gguf_config
from engine.models.gguf_info import read_gguf_info
from engine.models.sources import ModelSource, resolve_source
from tests.helpers.tiny_gguf import write_tiny_llama_gguf

TEXT = "Hello world! <|im_start|>user\n  code:\tdef f(x):\n    return x**2  # ünïcödé 日本語 🙂\n\n<|im_end|>"


def _source(path: Path) -> ModelSource:
    return ModelSource(path.stem, path.parent, path.name)


def _assert_same_as_transformers(source: ModelSource) -> None:
    ours, theirs = gguf_config.read_config(source), AutoConfig.from_pretrained(source.folder,
                                                                                gguf_file=source.gguf_file)
    assert type(ours) is type(theirs)
    assert ours.to_dict() == theirs.to_dict()


def _assert_same_tokenizer(source: ModelSource) -> None:
    ours = gguf_config.read_tokenizer(source)
    theirs = AutoTokenizer.from_pretrained(source.folder, gguf_file=source.gguf_file)
    assert type(ours) is type(theirs)
    assert ours.init_kwargs == theirs.init_kwargs
    assert ours.chat_template == theirs.chat_template
    assert ours.all_special_tokens == theirs.all_special_tokens
    ids = ours(TEXT).input_ids
    assert ids == theirs(TEXT).input_ids and len(ids) > 20
    assert ours.decode(ids) == theirs.decode(ids) == TEXT


def test_the_bundled_models_config_and_tokenizer_are_transformers_own():
    source = resolve_source("default")
    _assert_same_as_transformers(source)
    _assert_same_tokenizer(source)


def test_a_converted_tiny_llama_reads_the_same(tiny_llama, tmp_path):
    source = _source(write_tiny_llama_gguf(tiny_llama, tmp_path / "tiny.gguf", linear_type="Q8_0"))
    _assert_same_as_transformers(source)
    _assert_same_tokenizer(source)
    assert gguf_config.read_config(source).num_hidden_layers == AutoConfig.from_pretrained(tiny_llama).num_hidden_layers


def _header_only(path: Path, architecture: str, *, name: str = "tiny", output_head: bool = True,
                 vocab_size: int | None = 96) -> Path:
    """A GGUF file with an architecture's usual header keys and at most one small tensor."""
    import gguf

    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name(name)
    writer.add_block_count(3)
    writer.add_context_length(4096)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(500000.0)
    writer.add_key_length(16)
    writer.add_value_length(16)
    if vocab_size is not None:
        writer.add_vocab_size(vocab_size)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if architecture in ("gemma2", "gemma3"):
        writer.add_sliding_window(512)
    if output_head:
        writer.add_tensor("output.weight", np.zeros((96, 64), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("architecture", sorted(gguf_config.TABLE_ONLY_ARCHITECTURES))
@pytest.mark.parametrize("output_head", [True, False])
def test_every_architecture_read_from_the_header_matches_transformers(architecture, output_head, tmp_path):
    source = _source(_header_only(tmp_path / f"{architecture}.gguf", architecture, output_head=output_head))
    assert gguf_config.config_dict(read_gguf_info(source.path)) is not None  # the fast path, not the fallback
    _assert_same_as_transformers(source)
    assert gguf_config.read_config(source).tie_word_embeddings is not output_head


def test_a_llama_file_named_mistral_becomes_mistral_as_in_transformers(tmp_path):
    source = _source(_header_only(tmp_path / "m.gguf", "llama", name="mistral"))
    assert gguf_config.read_config(source).model_type == "mistral"
    _assert_same_as_transformers(source)


def test_an_architecture_with_rules_of_its_own_goes_through_transformers(tmp_path):
    source = _source(_header_only(tmp_path / "s.gguf", "stablelm"))
    assert gguf_config.config_dict(read_gguf_info(source.path)) is None
    _assert_same_as_transformers(source)
