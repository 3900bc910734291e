"""Fuzz of the request surface: generated prompts and sampling values against the real engine, many at once.

Each request is either refused at once (``ValueError``/``TypeError`` from SamplingParams or add_request, or an
error output) or served to a normal end; the engine then serves a normal request and holds no KV blocks.
"""

import math
import os

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from engine import Engine, EngineConfig, SamplingParams

MAX_MODEL_LEN = 128
FIELDS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "seed", "stop",
          "stop_token_ids", "ignore_eos")
ODD_TEXT = ["", "\u202eRTL override\u202c", "\x00\x01\x1b[31m", "\ufeff", "\ud800 lone", "a\udfffb", "😀" * 40,
            "\u0645\u0631\u062d\u0628\u0627", "\r\n\t" * 20, "x" * 5000]

any_value = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.integers(-3, 40),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 2), st.text(max_size=8),
    st.lists(st.integers(-5, 60000), max_size=3), st.lists(st.text(max_size=4), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
odd_text = st.one_of(
    st.sampled_from(ODD_TEXT),
    st.text(st.one_of(st.characters(), st.characters(categories=["Cs", "Cc", "Cf"])), max_size=60),
)
chat = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool", 3]),
                           "content": st.one_of(odd_text, st.none(), st.integers())}),
    min_size=0, max_size=4,
)
prompt = st.one_of(odd_text, chat, st.lists(st.integers(-5, 60000), max_size=40), st.none(), st.integers(),
                   st.lists(st.one_of(st.integers(), st.text(max_size=3)), max_size=4), st.binary(max_size=10))
plausible_fields = st.fixed_dictionaries({}, optional={
    "max_tokens": st.integers(1, 48), "temperature": st.floats(0, 3), "top_p": st.floats(0.01, 1),
    "top_k": st.integers(0, 60), "min_p": st.floats(0, 1), "repetition_penalty": st.floats(0.5, 2),
    "seed": st.integers(0, 2**63 - 1), "stop": st.lists(odd_text.filter(bool), max_size=3),
    "stop_token_ids": st.lists(st.integers(0, 49151), max_size=3), "ignore_eos": st.booleans(),
})
request = st.tuples(prompt, st.one_of(st.dictionaries(st.sampled_from(FIELDS), any_value, max_size=5),
                                      plausible_fields))


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=48, max_model_len=MAX_MODEL_LEN,
                               max_num_batched_tokens=256))


def submit(engine, prompt_value, fields) -> str | None:
    """Add one fuzzed request; None when it was refused at once, as it should be, with a ValueError/TypeError."""
    try:
        return engine.add_request(prompt_value, SamplingParams(**fields))
    except (ValueError, TypeError) as exc:
        assert str(exc), "a refusal must say why"
        return None


def drain(engine, ids):
    finals = {}
    for _ in range(4 * MAX_MODEL_LEN):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            assert out.request_id in ids, "an output for a request nobody made"
            if out.finished:
                finals[out.request_id] = out
    return finals


FUZZ_SETTINGS = settings(
    max_examples=int(os.environ.get("KVASIR_FUZZ_EXAMPLES", 150)), deadline=None, database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@FUZZ_SETTINGS
@given(st.lists(request, min_size=1, max_size=24))
@example([("x" * 1_000_000, {}), ("hello", {"temperature": math.nan}), ("\ud800", {}), ([], {}),
          ("fine", {"max_tokens": 3, "temperature": 0.0, "stop": ["e"]})])
def test_every_fuzzed_request_is_refused_or_served(engine, requests):
    ids = {rid for rid in (submit(engine, p, f) for p, f in requests) if rid is not None}
    event(f"accepted {min(len(ids), 3)}+ of the batch")
    finals = drain(engine, ids)
    assert set(finals) == ids, "every accepted request must end"
    for out in finals.values():
        assert out.finish_reason in ("stop", "length", "error")
        assert (out.finish_reason == "error") == bool(out.error)
    stats = engine.stats()
    assert stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0


def test_the_engine_still_serves_normally_after_the_fuzz(engine):
    (out,) = engine.generate(["plain and simple"], SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == 6
    assert engine.stats().kv_blocks_used == 0
