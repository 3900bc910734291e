"""Structured output on the real engine: a random-weight model, which would otherwise write junk, kept to
hypothesis-generated JSON schemas (every reply parses and validates), to a regular expression and to a grammar;
constrained and free replies in one batch (the free ones unchanged, token for token); a schema the library cannot
enforce refused by name."""

import json
import re

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine import Engine, EngineConfig, SamplingParams, Structure
from engine.step.grammar import GrammarError

PROMPT = [{"role": "user", "content": "Describe a person."}]


@pytest.fixture(scope="module")
def engine(tiny_llama):
    return Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=256, kv_disk_cache=False, max_num_seqs=32))


# Schemas whose every instance is short: bounded strings, numbers, arrays and nesting, so a reply always ends
# within its token budget however random the model.
LEAVES = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 6)),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span}, st.integers(-50, 50),
              st.integers(0, 500)),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.builds(lambda values: {"enum": values}, st.lists(st.sampled_from(["red", "green", 3, True, None]),
                                                       min_size=1, max_size=4, unique=True)),
)


def objects(children):
    def build(fields, required_count):
        names = list(fields)
        return {"type": "object", "properties": fields, "required": names[:required_count],
                "additionalProperties": False}
    return st.builds(build, st.dictionaries(st.from_regex(r"[a-z]{1,6}", fullmatch=True), children, min_size=1,
                                            max_size=3), st.integers(0, 3))


def arrays(children):
    return st.builds(lambda item, most: {"type": "array", "items": item, "maxItems": most}, children,
                     st.integers(0, 3))


SCHEMAS = st.recursive(LEAVES, lambda children: st.one_of(objects(children), arrays(children)), max_leaves=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(schema=objects(SCHEMAS), temperature=st.sampled_from([0.0, 0.8, 1.5]), seed=st.integers(0, 1000))
def test_every_reply_parses_and_validates_against_its_schema(engine, schema, temperature, seed):
    params = SamplingParams(max_tokens=400, temperature=temperature, seed=seed,
                            structure=Structure("json_schema", schema))
    out = engine.generate([PROMPT], params)[0]
    assert out.finish_reason == "stop", (out.finish_reason, out.error, out.text)
    jsonschema.validate(json.loads(out.text), schema)


def test_constrained_and_free_replies_share_a_step_and_the_free_ones_are_unchanged(engine):
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    alone = engine.generate([PROMPT] * 2, free)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    constrained = SamplingParams(max_tokens=24, temperature=0.0, structure=Structure("json_schema", schema))
    mixed = engine.generate([PROMPT] * 4, [free, constrained, free, constrained])
    assert [o.token_ids for o in (mixed[0], mixed[2])] == [o.token_ids for o in alone]
    for out in (mixed[1], mixed[3]):
        assert json.loads(out.text)["ok"] in (True, False)


def test_a_regular_expression_and_a_grammar(engine):
    regex = SamplingParams(max_tokens=40, temperature=1.0, seed=3, structure=Structure("regex", r"[0-9]{3}-[a-z]{2,4}"))
    grammar = SamplingParams(max_tokens=40, temperature=1.0, seed=4, structure=Structure(
        "grammar", 'start: greeting " " name\ngreeting: "hello" | "bonjour"\nname: /[A-Z][a-z]{1,5}/'))
    by_regex, by_grammar = engine.generate([PROMPT, PROMPT], [regex, grammar])
    assert re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", by_regex.text) and by_regex.finish_reason == "stop"
    assert re.fullmatch(r"(hello|bonjour) [A-Z][a-z]{1,5}", by_grammar.text)


def test_constrained_replies_do_not_draft_and_survive_preemption(tiny_llama):
    small = Engine(EngineConfig(model=str(tiny_llama), num_kv_blocks=24, block_size=16, speculation="ngram",
                                kv_disk_cache=False))
    schema = {"type": "object", "properties": {"items": {"type": "array", "maxItems": 30, "minItems": 30,
                                                         "items": {"enum": ["x", "y"]}}},
              "required": ["items"], "additionalProperties": False}
    long_prompt = small.encode_prompt("item " * 120)[:120]
    params = SamplingParams(max_tokens=200, temperature=0.0, structure=Structure("json_schema", schema))
    outs = small.generate([long_prompt] * 3, params)
    for out in outs:
        assert len(json.loads(out.text)["items"]) == 30 and out.metrics.draft_tokens == 0
    assert small.stats().num_preempted_total > 0 and small.stats().kv_blocks_used == 0


@pytest.mark.parametrize(("structure", "words"), [
    (Structure("json_schema", {"type": "object", "properties": {"a": {"type": "strnig"}}}), "strnig"),
    (Structure("json_schema", {"type": "object", "not": {"required": ["a"]}}), "not"),
    (Structure("regex", "([a-z"), "regular expression"),
    (Structure("grammar", "start: undefined_rule"), "grammar"),
])
def test_what_cannot_be_enforced_is_refused_by_name(engine, structure, words):
    with pytest.raises(GrammarError, match=words):
        engine.add_request(PROMPT, SamplingParams(structure=structure))
    assert not engine.has_unfinished()


def test_a_structure_is_checked_when_it_is_made():
    with pytest.raises(ValueError, match="json_schema structure needs dict"):
        Structure("json_schema", "{}")
    with pytest.raises(ValueError, match="one of json"):
        Structure("xml")
