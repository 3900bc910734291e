"""The step's hot path waits for the device at most once: reading the sampled tokens.

On the CPU nothing waits, so the test counts the calls that would wait on CUDA (``item``, ``tolist``, ``bool`` /
``int`` / ``float`` of a tensor, ``nonzero``, boolean-mask indexing shows up as ``nonzero``) while the engine steps.
"""

import pytest

from engine import Engine, EngineConfig, SamplingParams
from tests.helpers import eager_graphs
from tests.helpers import sync_counter as syncs


@pytest.fixture
def sync_counter(monkeypatch):
    return syncs.install(monkeypatch)


def _run_counted(engine: Engine, sync_counter) -> list[int]:
    prompts = ["a prompt long enough to be cut into chunks " * 10, "hi", "another one, of middling length"]
    params = [SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.8, top_p=0.9, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=1.0, top_k=5, repetition_penalty=1.2, ignore_eos=True)]
    for prompt, p in zip(prompts, params):
        engine.add_request(engine.encode_prompt(prompt), p)
    per_step = []
    while engine.has_unfinished():
        before = sync_counter["n"]
        engine.step()
        per_step.append(sync_counter["n"] - before)
    return per_step


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_each_step_waits_once(tiny_model_dirs, arch, sync_counter):
    engine = Engine(EngineConfig(model=str(tiny_model_dirs[arch]), quantization="none", num_kv_blocks=64,
                                 max_num_batched_tokens=32))
    per_step = _run_counted(engine, sync_counter)
    assert len(per_step) > 6  # chunked prefill steps, mixed steps and decode steps
    assert set(per_step) <= {0, 1} and 1 in per_step, per_step


def test_graph_decode_steps_wait_once(tiny_model_dirs, sync_counter, monkeypatch):
    """The static-buffer decode path (run eagerly in place of its graph) waits no more than the eager one."""
    record = eager_graphs.install(monkeypatch)
    engine = Engine(EngineConfig(model=str(tiny_model_dirs["llama"]), quantization="none", num_kv_blocks=64,
                                 max_num_batched_tokens=32))
    per_step = _run_counted(engine, sync_counter)
    assert eager_graphs.replays(record) >= 4 and set(per_step) <= {0, 1} and 1 in per_step, per_step
