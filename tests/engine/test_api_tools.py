"""Tool calls and structured output through the endpoint with the official ``openai`` client, on a random-weight
model that writes junk unless held to a form: forced calls parsed into tool_calls (whole and streamed), the
calls and their answers sent back, replies held to a JSON schema (the client's own ``parse`` with a pydantic
model too), and what cannot be enforced a 400."""

from __future__ import annotations

import json

import jsonschema
import openai
import pydantic
import pytest

from engine import EngineConfig
from tests.helpers.api_serving import serving

pytestmark = pytest.mark.timeout(120)
WEATHER = {"type": "function", "function": {
    "name": "weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris this week?"}]


@pytest.fixture(scope="module")
def client(tiny_llama):
    with serving(EngineConfig(model=str(tiny_llama), num_kv_blocks=128, kv_disk_cache=False)) as (_, client):
        yield client


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def arguments_of(call, tool):
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    return arguments


def test_a_forced_call_comes_back_as_a_tool_call(client, model):
    reply = client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER, TIME], max_tokens=80,
                                           tool_choice={"type": "function", "function": {"name": "weather"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "weather" and call.id.startswith("call_")
    arguments_of(call, WEATHER)


def test_required_calls_one_of_the_tools_and_streams_it_as_a_delta(client, model):
    chunks = list(client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER, TIME],
                                                 tool_choice="required", max_tokens=80, temperature=1.0, seed=5,
                                                 stream=True))
    deltas = [c.choices[0].delta.tool_calls for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert len(deltas) == 1 and len(deltas[0]) == 1
    call = deltas[0][0]
    assert call.index == 0 and call.function.name in ("weather", "time")
    arguments_of(call, WEATHER if call.function.name == "weather" else TIME)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)


def test_the_call_and_its_answer_go_back_to_the_model(client, model):
    first = client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER], max_tokens=80,
                                           tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    answered = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    second = client.chat.completions.create(model=model, messages=answered, tools=[WEATHER], max_tokens=4)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + 10  # the call and the answer are in the prompt
    assert second.usage.prompt_tokens_details.cached_tokens >= 128  # the tools and the question came from the cache


def test_a_reply_held_to_a_json_schema(client, model):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"], "additionalProperties": False}
    for seed in range(3):
        reply = client.chat.completions.create(
            model=model, messages=QUESTION, max_tokens=60, temperature=1.0, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
        assert reply.choices[0].finish_reason == "stop"


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=8)
    adult: bool


def test_the_clients_own_parse_with_a_pydantic_model(client, model):
    reply = client.chat.completions.parse(model=model, messages=QUESTION, max_tokens=60, response_format=Person)
    person = reply.choices[0].message.parsed
    assert isinstance(person, Person) and len(person.name) <= 8


def test_what_cannot_be_enforced_is_a_400_naming_the_field(client, model):
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=model, messages=QUESTION, max_tokens=8, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "not": {}}}})
    assert bad.value.body["param"] == "response_format" and "not" in bad.value.body["message"]
