"""What eval-quant --kv measured is kept per model file, and kv_cache_dtype='auto' chooses by it."""

import dataclasses

import pytest
import torch

from engine.models import kv_verdicts
from engine.models.kv_verdicts import THRESHOLDS, KVRow
from engine.models.sources import ModelSource

CPU = torch.device("cpu")
FLOAT32 = KVRow("float32", 20.0, 0.0, 1.0, 100.0, 600.0, 1024)


def row(name, kl=0.001, top1=0.995, speed16=600.0):
    return KVRow(name, 20.1, kl, top1, 100.0, speed16, 272)


@pytest.fixture
def source(tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "model.gguf").write_bytes(b"GGUF" + bytes(60))
    return ModelSource("model", tmp_path, "model.gguf")


@pytest.mark.parametrize("candidate, passes, missed", [
    (row("q8_0"), True, ""),
    (row("q8_0", kl=0.0021), False, "KL 0.0021 > 0.002"),
    (row("q8_0", top1=0.985), False, "top-1 98.5% < 99%"),
    (row("q8_0", speed16=600.0 * 0.96), False, "0.96x the float32 cache's speed at 16 chats"),
    (row("q8_0", speed16=600.0 * THRESHOLDS.min_speed_ratio), True, ""),
])
def test_a_format_passes_only_within_every_threshold(candidate, passes, missed):
    assert candidate.passes(FLOAT32) is passes
    assert candidate.why_not(FLOAT32) == missed


def test_auto_takes_what_was_measured_for_this_model_file_and_quantisation(source):
    assert kv_verdicts.kv_format_for("auto", source, "int4", 64, CPU, torch.float32)[0].name == "float32"
    kv_verdicts.record(source, "int4", CPU, [FLOAT32, row("bfloat16"), row("q8_0")])
    fmt, reason = kv_verdicts.kv_format_for("auto", source, "int4", 64, CPU, torch.float32)
    assert fmt.name == "q8_0" and "met the thresholds" in reason
    # another weight quantisation, or the file changed since: nothing measured
    assert kv_verdicts.kv_format_for("auto", source, "none", 64, CPU, torch.float32)[0].name == "float32"
    source.path.write_bytes(b"GGUF" + bytes(80))
    assert kv_verdicts.measured_rows(source, "int4", CPU) is None


def test_a_failing_smaller_format_gives_way_to_the_next_smallest(source):
    kv_verdicts.record(source, "int4", CPU, [FLOAT32, row("q8_0", kl=0.01), row("float16")])
    assert kv_verdicts.kv_format_for("auto", source, "int4", 64, CPU, torch.float32)[0].name == "float16"
    kv_verdicts.record(source, "int4", CPU, [FLOAT32, dataclasses.replace(row("float16"), top1_agreement=0.5)])
    assert kv_verdicts.kv_format_for("auto", source, "int4", 64, CPU, torch.float32)[0].name == "float32"


@pytest.mark.parametrize("damage", ["{not json", "[1, 2]", '{"version": 99, "models": {}}',
                                    '{"version": 1, "models": [1]}',
                                    '{"version": 1, "models": {"%s": {"rows": [{"kv_dtype": 3}]}}}',
                                    '{"version": 1, "models": {"%s": {"rows": [{"kv_dtype": "q8_0", "perplexity": 1, '
                                    '"kl_divergence": null, "top1_agreement": 1, "decode_tokens_per_s_1": 1, '
                                    '"decode_tokens_per_s_16": 1, "bytes_per_token": 1}]}}}',
                                    '{"version": 1, "models": {"%s": [1, 2]}}'])
def test_a_damaged_measurements_file_is_ignored_and_replaced_on_the_next_record(source, damage):
    path = kv_verdicts._path()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = kv_verdicts.model_key(source, "int4", CPU)
    path.write_text(damage.replace("%s", key.replace("\\", "\\\\")) if "%s" in damage else damage)
    assert kv_verdicts.kv_format_for("auto", source, "int4", 64, CPU, torch.float32)[0].name == "float32"
    kv_verdicts.record(source, "int4", CPU, [FLOAT32, row("q8_0")])
    assert kv_verdicts.measured_rows(source, "int4", CPU) == [FLOAT32, row("q8_0")]
