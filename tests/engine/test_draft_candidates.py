"""The models offered as drafts: the same tokens as the serving model, and fewer weight bytes as int4."""

import logging

from engine import EngineConfig
from engine.models.draft_candidates import DRAFT_QUANTIZATION, FINGERPRINTS, draft_candidates
from engine.models.fit import estimate
from tests.helpers.tiny_models import write_tiny_model


def test_a_float_model_is_offered_its_own_int4_copy_and_its_smaller_siblings(tiny_model_dirs, tokenizer_dir,
                                                                          other_tokenizer_model, tmp_path):
    target = str(tiny_model_dirs["llama"])
    sibling = str(write_tiny_model("llama", tmp_path / "sibling", tokenizer_dir, num_hidden_layers=1))
    specs = [target, sibling, str(other_tokenizer_model)]
    offered = {c.spec: c for c in draft_candidates(target, "none", specs, device="cpu")}
    assert set(offered) == {target, sibling}  # the other tokenizer's model is never offered
    own = offered[target]
    assert own.quantization == DRAFT_QUANTIZATION
    # the figures are the fit estimate's for the same pair
    fit = estimate(EngineConfig(model=target, quantization="none", device="cpu", draft_model=target,
                                draft_quantization="int4"))
    assert own.weight_bytes == fit.draft_weight_bytes
    plain = estimate(EngineConfig(model=target, quantization="none", device="cpu"))
    assert own.kv_bytes_per_token == fit.kv_bytes_per_token - plain.kv_bytes_per_token
    assert offered[sibling].weight_bytes < own.weight_bytes


def test_no_model_is_offered_that_is_not_smaller_than_the_serving_one(tiny_model_dirs, tokenizer_dir, tmp_path):
    target = str(tiny_model_dirs["llama"])
    larger = str(write_tiny_model("llama", tmp_path / "larger", tokenizer_dir, num_hidden_layers=8))
    assert draft_candidates(target, "int4", [target, larger], device="cpu") == []
    assert [c.spec for c in draft_candidates(larger, "int4", [target, larger], device="cpu")] == [target]


def test_a_model_whose_files_are_gone_is_left_out_with_a_warning(tiny_model_dirs, tmp_path, caplog):
    target = str(tiny_model_dirs["llama"])
    with caplog.at_level(logging.WARNING):
        offered = draft_candidates(target, "none", [str(tmp_path / "gone"), target], device="cpu")
    assert [c.spec for c in offered] == [target]
    assert "is not offered as a draft" in caplog.text


def test_a_tokenizer_is_read_again_only_when_its_files_change(tokenizer_dir, tmp_path, monkeypatch):
    from engine.models import loader

    calls = []
    real = loader.load_tokenizer
    monkeypatch.setattr(loader, "load_tokenizer", lambda source: calls.append(source) or real(source))
    folder = write_tiny_model("llama", tmp_path / "model", tokenizer_dir)
    first = FINGERPRINTS.of(str(folder))
    assert FINGERPRINTS.of(str(folder)) == first and len(calls) == 1
    vocab_file = folder / "tokenizer.json"
    vocab_file.write_text(vocab_file.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    assert FINGERPRINTS.of(str(folder)) == first and len(calls) == 2  # read again; the same tokens
