"""Tools for a model whose chat template knows none (the bundled one): the tools described in the system message
in the Hermes format (:mod:`.tool_calls` parses the calls back), earlier calls written into the assistant's text as
``<tool_call>`` blocks, and the tools' answers given as user messages in ``<tool_response>`` blocks. For a template
that lays out tools itself, the calls' arguments become mappings, as chat templates expect them."""

from __future__ import annotations

import json

TOOL_PROMPT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>"
)


def with_tool_prompt(messages: list[dict], tools: list[dict]) -> list[dict]:
    """``messages`` as a template without tools can render them."""
    out = [_plain(message) for message in messages]
    if tools:
        described = TOOL_PROMPT.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{described}"}
        else:
            out.insert(0, {"role": "system", "content": described})
    return _joined(out)


def with_mapping_arguments(messages: list[dict]) -> list[dict]:
    """``messages`` whose assistant calls carry their arguments as mappings (chat templates write them with
    ``tojson``; a JSON string would be written twice over)."""
    return [{**m, "tool_calls": [_mapped(call) for call in m["tool_calls"]]} if m.get("tool_calls") else m
            for m in messages]


def _plain(message: dict) -> dict:
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    if message.get("tool_calls"):
        blocks = [f"<tool_call>\n{json.dumps(_call_object(call), ensure_ascii=False)}\n</tool_call>"
                  for call in message["tool_calls"]]
        text = "\n".join(filter(None, [message["content"], *blocks]))
        return {"role": "assistant", "content": text}
    return {key: value for key, value in message.items() if key != "tool_call_id"}


def _joined(messages: list[dict]) -> list[dict]:
    """Consecutive tool answers (now user messages) as one message, as a plain template expects turns to
    alternate."""
    out: list[dict] = []
    for message in messages:
        if out and message["role"] == "user" and out[-1]["role"] == "user" \
                and message["content"].startswith("<tool_response>") and "<tool_response>" in out[-1]["content"]:
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{message['content']}"}
        else:
            out.append(message)
    return out


def _call_object(call: dict) -> dict:
    function = call.get("function", call)
    return {"name": function["name"], "arguments": _arguments(function.get("arguments", {}))}


def _mapped(call: dict) -> dict:
    function = call.get("function", call)
    return {**call, "function": {**function, "arguments": _arguments(function.get("arguments", {}))}}


def _arguments(arguments):
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments
