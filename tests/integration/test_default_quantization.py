"""The default model in every quantisation: the fit estimate matches what loading measures, and it answers."""

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.models.fit import estimate

pytestmark = pytest.mark.slow
MODES = ("none", "int4", "w8", "int8", "nf4", "fp4")


@pytest.fixture(scope="module")
def measured():
    """Load the default model once per mode (switching one engine) and keep its stats."""
    engine, stats, replies = None, {}, {}
    for mode in MODES:
        config = EngineConfig(model="default", quantization=mode, device="cpu", num_kv_blocks=64)
        if engine is None:
            engine = Engine(config)
        else:
            engine.switch_model(config)
        stats[mode] = engine.stats()
        replies[mode] = engine.generate([[{"role": "user", "content": "What is the capital of Germany?"}]],
                                        SamplingParams(max_tokens=12, temperature=0.0))[0].text
    return stats, replies


@pytest.mark.parametrize("mode", MODES)
def test_fit_estimate_within_ten_percent_of_measured(measured, mode):
    stats, _ = measured
    fit = estimate(EngineConfig(model="default", quantization=mode, device="cpu"))
    assert abs(fit.weight_bytes - stats[mode].model_memory_bytes) <= 0.10 * stats[mode].model_memory_bytes
    kv_per_token = stats[mode].kv_cache_memory_bytes / (stats[mode].kv_blocks_total * stats[mode].block_size)
    assert fit.kv_bytes_per_token == kv_per_token


def test_memory_falls_with_quantisation_and_load_never_doubles_the_weights(measured):
    stats, _ = measured
    memory = {mode: s.model_memory_bytes for mode, s in stats.items()}
    assert memory["nf4"] < memory["int8"] < memory["none"]
    assert memory["int4"] < memory["w8"] < memory["none"] / 2  # the Q4_1 blocks kept packed
    full_precision = memory["none"]
    for mode in MODES:
        assert 0 < stats[mode].peak_load_bytes < 2 * full_precision, mode


def test_every_mode_still_answers(measured):
    _, replies = measured
    for mode, text in replies.items():
        assert text.strip(), mode
    # a question this small model answers with a wide margin (for France, "The" and "L'" are 0.1 logits apart
    # on the file's own weights, so which one wins depends on rounding, in llama.cpp too)
    for mode in ("none", "int8", "int4", "w8"):
        assert "Berlin" in replies[mode], mode


def test_int4_is_the_cpu_default_for_the_q4_default_model(measured):
    stats, replies = measured
    assert estimate(EngineConfig(model="default", device="cpu")).quantization == "int4"
    assert stats["int4"].quantization == "int4"
