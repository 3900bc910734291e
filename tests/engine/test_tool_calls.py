"""Tool calls parsed out of a reply in each family's format, whole and streamed in pieces cut anywhere; calls
that do not parse stay text; and calls and answers laid out again by the template (or the default tool prompt)."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine import Chat, Engine, EngineConfig
from engine.templates.tool_calls import HERMES, LLAMA3, MISTRAL, ToolCallStream, split_tool_calls, tool_call_format
from engine.templates.tool_prompt import with_tool_prompt
from tests.helpers.reasoning_models import with_template

WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather in a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


def call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def hermes(name, arguments):
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def test_hermes_blocks_after_some_text():
    answer = "Let me check. " + hermes("weather", {"city": "Paris"}) + "\n" + hermes("time", {"zone": "CET"})
    text, calls = split_tool_calls(answer, HERMES, final=True)
    assert text == "Let me check. "
    assert calls == [("weather", '{"city": "Paris"}'), ("time", '{"zone": "CET"}')]


def test_a_call_that_does_not_parse_stays_text():
    for junk in ['<tool_call>{"name": "weather", "arguments": {"city": }</tool_call>', "<tool_call>{\"name\": 3}",
                 '<tool_call>{"arguments": {}}</tool_call>']:
        assert split_tool_calls("Hi " + junk, HERMES, final=True) == ("Hi " + junk, [])
    assert split_tool_calls("Hi <tool_call>{\"na", HERMES, final=False) == ("Hi ", [])  # maybe a call: held


def test_mistral_list_and_args_forms():
    listed = '[TOOL_CALLS][{"name": "weather", "arguments": {"city": "Oslo"}}]'
    assert split_tool_calls(listed, MISTRAL, final=True) == ("", [("weather", '{"city": "Oslo"}')])
    pieces = '[TOOL_CALLS]weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]time[ARGS]{}'
    assert split_tool_calls(pieces, MISTRAL, final=True)[1] == [("weather", '{"city": "Oslo"}'), ("time", "{}")]
    assert split_tool_calls(listed, MISTRAL, final=False) == ("", [])  # known once the reply ends


def test_llama3_json_reply_and_plain_json_answers():
    call = '<|python_tag|>{"name": "weather", "parameters": {"city": "Rome"}}'
    assert split_tool_calls(call, LLAMA3, final=True) == ("", [("weather", '{"city": "Rome"}')])
    assert split_tool_calls('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 1}}', LLAMA3,
                            final=True)[1] == [("a", "{}"), ("b", '{"x": 1}')]
    assert split_tool_calls('{"answer": 42}', LLAMA3, final=True) == ('{"answer": 42}', [])
    assert split_tool_calls("Plain words.", LLAMA3, final=False) == ("Plain words.", [])


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab <>{}\"é\n", max_size=20), st.lists(st.integers(0, 400), max_size=10),
       st.integers(0, 2))
def test_streamed_text_and_calls_equal_the_whole_answers(before, cuts, count):
    answer = before + "".join(hermes("f", {"n": i}) for i in range(count))
    stream, text, calls = ToolCallStream(HERMES), "", []
    for end in sorted(c for c in set(cuts) if c <= len(answer)):
        new_text, new_calls = stream.update(answer[:end], final=False)
        text, calls = text + new_text, calls + new_calls
    new_text, new_calls = stream.update(answer, final=True)
    text, calls = text + new_text, calls + new_calls
    whole_text, whole_calls = split_tool_calls(answer, HERMES, final=True)
    assert text == whole_text and [(c.name, c.arguments) for c in calls] == whole_calls
    assert len({c.id for c in calls}) == len(calls)


def test_the_format_follows_the_template():
    assert tool_call_format("{{ '<tool_call>' }}") is HERMES
    assert tool_call_format("[TOOL_CALLS]") is MISTRAL
    assert tool_call_format("<|python_tag|>") is LLAMA3
    assert tool_call_format("no tools here") is HERMES  # the default tool prompt's own format


def test_the_default_tool_prompt_describes_the_tools_and_replays_calls_and_answers():
    messages = [{"role": "user", "content": "Weather in Paris and Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    call("c1", "weather", '{"city": "Paris"}'), call("c2", "weather", '{"city": "Oslo"}')]},
                {"role": "tool", "tool_call_id": "c1", "content": "18 C"},
                {"role": "tool", "tool_call_id": "c2", "content": "7 C"}]
    out = with_tool_prompt(messages, [WEATHER])
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user"]
    assert json.dumps(WEATHER) in out[0]["content"] and "<tool_call>" in out[0]["content"]
    assert out[2]["content"] == "\n".join(hermes("weather", {"city": c}) for c in ("Paris", "Oslo"))
    assert out[3]["content"] == "<tool_response>\n18 C\n</tool_response>\n<tool_response>\n7 C\n</tool_response>"


# A template in the Hermes format that lays out tools itself (Qwen2.5's shape, shortened)
TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n<tools>' }}{%- for tool in tools %}{{- tool | tojson }}{%- endfor %}"
    "{{- '</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}{{- '<|im_start|>assistant\\n' }}"
    "{%- for call in message.tool_calls %}{{- '<tool_call>' + (call.function | tojson) + '</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}{{- '<|im_start|>user\\n<tool_response>' + message.content"
    " + '</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@pytest.fixture(scope="module")
def engines(tiny_llama, tmp_path_factory):
    tools = with_template(tiny_llama, tmp_path_factory.mktemp("tools") / "model", TOOLS_TEMPLATE)
    return Engine(EngineConfig(model=str(tools), num_kv_blocks=32)), Engine(EngineConfig(model=str(tiny_llama),
                                                                                        num_kv_blocks=32))


def test_calls_round_trip_through_a_template_that_knows_tools_and_one_that_does_not(engines):
    knows, plain = engines
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    call("c1", "weather", '{"city": "Paris"}')]},
                {"role": "tool", "tool_call_id": "c1", "content": "18 C"}]
    laid_out = knows.tokenizer.decode(knows.encode_prompt(Chat(messages, tools=[WEATHER])))
    assert '<tools>{"type": "function"' in laid_out
    assert '<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>' in laid_out  # not twice encoded
    assert "<tool_response>18 C</tool_response>" in laid_out
    described = plain.tokenizer.decode(plain.encode_prompt(Chat(messages, tools=[WEATHER])))
    assert "You are provided with function signatures" in described and '"name": "weather"' in described
    assert "<tool_response>\n18 C\n</tool_response>" in described
