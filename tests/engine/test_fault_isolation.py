"""Faults injected inside a step, a KV allocation, detokenising and a load end only the requests they touch.

Every test checks the same three things: the affected requests end with ``finish_reason='error'`` and a
message; the others finish exactly as they would have without the fault; the engine then serves a normal
request and holds no KV blocks once idle.
"""

import pytest
import torch

from engine import Engine, EngineConfig, EngineError, SamplingParams
from engine.serving.block_manager import BlockManager
from engine.step.runner import ModelRunner

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = ["the first chat", "a second one, a bit longer than the first", "third"]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=128, max_model_len=512))


@pytest.fixture(scope="module")
def clean(engine):
    """What each prompt gives with no fault."""
    return {p: out.token_ids for p, out in zip(PROMPTS, engine.generate(PROMPTS, GREEDY))}


def run_all(engine, prompts=PROMPTS, sampling=GREEDY):
    ids = {engine.add_request(p, sampling): p for p in prompts}
    finals = {}
    for _ in range(500):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            if out.finished:
                finals[ids[out.request_id]] = out
    assert not engine.has_unfinished(), "the engine did not finish its requests"
    return finals


def assert_healthy(engine, clean):
    (out,) = engine.generate([PROMPTS[0]], GREEDY)
    assert out.finish_reason == "length" and out.token_ids == clean[PROMPTS[0]]
    stats = engine.stats()
    assert stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0


def fail_when(monkeypatch, owner, name, predicate, exc):
    """Patch ``owner.name`` to raise ``exc`` whenever ``predicate(*args)`` holds."""
    original = getattr(owner, name)

    def patched(self, *args, **kwargs):
        if predicate(*args):
            raise exc
        return original(self, *args, **kwargs)

    monkeypatch.setattr(owner, name, patched)


def test_a_forward_fault_fails_only_its_request(engine, clean, monkeypatch):
    victim = PROMPTS[1]
    victim_ids = engine.encode_prompt(victim)
    fail_when(monkeypatch, ModelRunner, "run", lambda chunks: any(c.seq.token_ids[:len(victim_ids)] == victim_ids
                                                                  for c in chunks), RuntimeError("injected"))
    finals = run_all(engine)
    assert finals[victim].finish_reason == "error" and "injected" in finals[victim].error
    for prompt in (PROMPTS[0], PROMPTS[2]):
        assert finals[prompt].finish_reason == "length" and finals[prompt].token_ids == clean[prompt]
    monkeypatch.undo()
    assert_healthy(engine, clean)


def test_out_of_memory_on_a_batch_serves_everyone_one_at_a_time(engine, clean, monkeypatch):
    fail_when(monkeypatch, ModelRunner, "run", lambda chunks: len(chunks) > 1, torch.OutOfMemoryError("simulated"))
    finals = run_all(engine)
    assert {p: out.token_ids for p, out in finals.items()} == clean
    assert all(out.finish_reason == "length" for out in finals.values())


def test_out_of_memory_alone_says_so_in_words(engine, clean, monkeypatch):
    fail_when(monkeypatch, ModelRunner, "run", lambda chunks: True, torch.OutOfMemoryError("CUDA out of memory"))
    (out,) = run_all(engine, [PROMPTS[0]]).values()
    assert out.finish_reason == "error" and "out of memory" in out.error
    monkeypatch.undo()
    assert_healthy(engine, clean)


def test_a_kv_allocation_fault_fails_only_its_request(engine, clean, monkeypatch):
    """The second allocation for the victim raises (mid-generation, after it was admitted)."""
    victim_tokens = engine.encode_prompt(PROMPTS[2])
    calls = {"n": 0}

    def victim_grows(block_table, num_tokens):
        if num_tokens > len(victim_tokens) and block_table and calls["n"] == 0 and num_tokens % 16 == 1:
            calls["n"] += 1
            return True
        return False

    fail_when(monkeypatch, BlockManager, "allocate", victim_grows, MemoryError())
    finals = run_all(engine, PROMPTS, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    failed = [p for p, out in finals.items() if out.finish_reason == "error"]
    assert len(failed) == 1 and "KV cache" in finals[failed[0]].error and "out of memory" in finals[failed[0]].error
    assert all(out.finish_reason == "length" and len(out.token_ids) == 40
               for p, out in finals.items() if p not in failed)
    monkeypatch.undo()
    assert_healthy(engine, clean)


def test_a_detokenizer_fault_fails_only_its_request(engine, clean, monkeypatch):
    from engine.step.detokenizer import IncrementalDetokenizer

    original = IncrementalDetokenizer.add
    victim = engine.encode_prompt(PROMPTS[0])[-3:]

    def add(self, token_id):
        if self._ids[:3] == victim:  # the detokenizer keeps the prompt's last tokens as context
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return original(self, token_id)

    monkeypatch.setattr(IncrementalDetokenizer, "add", add)
    finals = run_all(engine)
    assert finals[PROMPTS[0]].finish_reason == "error" and "injected" in finals[PROMPTS[0]].error
    assert finals[PROMPTS[1]].token_ids == clean[PROMPTS[1]]
    monkeypatch.undo()
    assert_healthy(engine, clean)


def test_a_scheduler_fault_ends_live_requests_and_the_engine_starts_afresh(engine, clean, monkeypatch):
    from engine.serving.scheduler import Scheduler

    fail_when(monkeypatch, Scheduler, "schedule", lambda: True, RuntimeError("scheduler bug"))
    ids = [engine.add_request(p, GREEDY) for p in PROMPTS]
    outputs = engine.step()
    assert sorted(o.request_id for o in outputs) == sorted(ids)
    assert all(o.finished and o.finish_reason == "error" and "scheduler bug" in o.error for o in outputs)
    monkeypatch.undo()
    assert_healthy(engine, clean)


def test_a_request_that_fails_to_build_leaves_nothing_behind(engine, clean, monkeypatch):
    """The original hang: the detokenizer raised after the sequence was registered, leaving a phantom."""
    import engine.serving.engine as engine_module

    def broken(*args, **kwargs):
        raise TypeError("injected")

    monkeypatch.setattr(engine_module, "IncrementalDetokenizer", broken)
    with pytest.raises(TypeError, match="injected"):
        engine.add_request("hello", GREEDY)
    monkeypatch.undo()
    engine.abort_all()  # raised KeyError on the phantom before
    assert not engine.has_unfinished()
    assert_healthy(engine, clean)


def test_a_failed_load_during_a_switch_brings_the_previous_model_back(engine, clean, monkeypatch, tiny_model_dirs):
    import engine.serving.engine as engine_module

    def failing_load(config, *args, **kwargs):
        raise RuntimeError("disk read error while loading")

    real_load = engine_module.load_model
    monkeypatch.setattr(engine_module, "load_model",
                        lambda config, *a, **k: failing_load(config) if "qwen3" in config.model else real_load(
                            config, *a, **k))
    with pytest.raises(RuntimeError, match="disk read error"):
        engine.switch_model(EngineConfig(model=str(tiny_model_dirs["qwen3"]), num_kv_blocks=128, max_model_len=512))
    monkeypatch.undo()
    assert engine.has_model and "llama" in engine.config.model
    assert_healthy(engine, clean)


def test_when_the_previous_model_cannot_come_back_the_engine_says_so(tiny_model_dirs, monkeypatch):
    import engine.serving.engine as engine_module

    engine = Engine(EngineConfig(model=str(tiny_model_dirs["phi3"]), num_kv_blocks=32, max_model_len=256))
    monkeypatch.setattr(engine_module, "load_model", lambda *a, **k: (_ for _ in ()).throw(OSError("gone")))
    with pytest.raises(EngineError, match="could not be loaded again"):
        engine.switch_model(EngineConfig(model=str(tiny_model_dirs["llama"]), num_kv_blocks=32))
    assert not engine.has_model
