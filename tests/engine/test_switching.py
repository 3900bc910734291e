"""Switching models and quantisation at run time: running requests end, memory comes back, failures keep serving."""

import gc

import pytest

from engine import AsyncEngine, Engine, EngineConfig, ModelLoadError, SamplingParams
from engine.models.memory import resident_bytes, return_freed_memory
from engine.serving.engine import SWITCHED_MESSAGE
from tests.helpers.tiny_models import write_tiny_model

LONG = SamplingParams(max_tokens=200, ignore_eos=True)
SHORT = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def medium_llama(tmp_path_factory, tokenizer_dir):
    """Big enough (about 100 MB in float32) that a leaked copy would show in the process's memory."""
    return write_tiny_model("llama", tmp_path_factory.mktemp("medium") / "llama", tokenizer_dir,
                            hidden_size=256, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=8,
                            num_key_value_heads=4)


def test_running_requests_end_with_abort_and_new_ones_work(tiny_model_dirs):
    engine = Engine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    rid = engine.add_request("keep talking", LONG)
    engine.step()
    phases = []
    engine.switch_model(EngineConfig(model=str(tiny_model_dirs["qwen3"]), num_kv_blocks=64),
                        progress=lambda f, phrase: phases.append((f, phrase)))
    (out,) = engine.step()
    assert out.request_id == rid and out.finish_reason == "abort" and out.error == SWITCHED_MESSAGE
    assert engine.stats().model_name == "qwen3" and engine.stats().kv_blocks_used == 0
    assert phases[0][0] == 0.0 and phases[-1] == (1.0, "ready")
    assert [f for f, _ in phases] == sorted(f for f, _ in phases)
    assert len(engine.generate(["and now?"], SHORT)[0].token_ids) == 8


def test_three_switches_leave_no_memory_growth_and_no_leaked_blocks(medium_llama):
    engine = Engine(EngineConfig(model=str(medium_llama), num_kv_blocks=256))
    for mode in ("nf4", "int8", "none"):  # first use of each mode loads its libraries once
        engine.switch_model(EngineConfig(model=str(medium_llama), quantization=mode, num_kv_blocks=256))
        engine.generate(["warm up"], SHORT)
    gc.collect()
    return_freed_memory()
    baseline = resident_bytes()
    for mode in ("nf4", "int8", "none"):
        engine.add_request("interrupted", LONG)
        engine.step()
        engine.switch_model(EngineConfig(model=str(medium_llama), quantization=mode, num_kv_blocks=256))
        engine.step()
        assert engine.stats().quantization == mode
        assert engine.generate(["still here?"], SHORT)[0].finish_reason == "length"
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and stats.num_running == 0
    gc.collect()
    return_freed_memory()
    assert resident_bytes() <= baseline * 1.05


def test_bad_file_is_refused_and_the_old_model_keeps_serving(tiny_model_dirs, tmp_path):
    engine = Engine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    before = engine.generate(["same answer"], SHORT)[0].token_ids
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 10)
    with pytest.raises(ModelLoadError, match="truncated"):
        engine.switch_model(EngineConfig(model=str(broken)))
    assert engine.stats().model_name == "llama"
    assert engine.generate(["same answer"], SHORT)[0].token_ids == before


def test_configuration_that_does_not_fit_is_refused_with_the_estimate(tiny_model_dirs, monkeypatch):
    engine = Engine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    import engine.models.fit as fit

    monkeypatch.setattr(fit, "available_memory", lambda device: 1024)
    with pytest.raises(ModelLoadError, match="does not fit in memory: .*weights .* GiB"):
        engine.switch_model(EngineConfig(model=str(tiny_model_dirs["qwen2"]), num_kv_blocks=64))
    assert engine.stats().model_name == "llama"
    assert engine.generate(["fine"], SHORT)[0].finish_reason == "length"


def test_late_load_failure_reloads_the_previous_model(tiny_model_dirs, monkeypatch):
    engine = Engine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    import engine.serving.engine as engine_module

    real_load = engine_module.load_model

    def failing_load(config, *args, **kwargs):
        if "qwen2" in config.model:
            raise ModelLoadError("simulated failure while reading the weights")
        return real_load(config, *args, **kwargs)

    monkeypatch.setattr(engine_module, "load_model", failing_load)
    with pytest.raises(ModelLoadError, match="simulated failure"):
        engine.switch_model(EngineConfig(model=str(tiny_model_dirs["qwen2"]), num_kv_blocks=64))
    assert engine.stats().model_name == "llama"
    assert engine.generate(["fine"], SHORT)[0].finish_reason == "length"


def test_async_engine_switches_between_steps(tiny_model_dirs):
    import asyncio

    engine = AsyncEngine(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=64))
    try:
        async def main():
            await engine.switch_model(EngineConfig(model=str(tiny_model_dirs["mistral"]), num_kv_blocks=64))
            return [o async for o in engine.stream("after the switch", SHORT)][-1]

        last = asyncio.run(main())
        assert last.finish_reason == "length" and engine.stats().model_name == "mistral"
    finally:
        engine.shutdown()
