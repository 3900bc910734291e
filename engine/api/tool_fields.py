"""The tool fields of a chat request: ``tools``, ``tool_choice``, and the messages that carry calls (an assistant's
``tool_calls``) and their answers (``tool`` messages), checked into what :class:`engine.Chat` takes. A field that
is wrong is a 400 naming it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from .errors import bad_field, shown

FORCED = "required"  # tool_choice: some tool must be called (a function's name: that one)


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """What the request allows: ``mode`` "none" (no tools offered or allowed), "auto", "required", or "function"
    with the function's ``name``."""

    mode: str = "none"
    name: str | None = None

    @property
    def offered(self) -> bool:
        return self.mode != "none"

    @property
    def forced(self) -> bool:
        return self.mode in (FORCED, "function")


def tools_of(present: dict) -> list[dict]:
    """``tools``: function tools, each with a name (letters, digits, '_' and '-') and JSON-schema parameters."""
    tools = present.get("tools", [])
    if not isinstance(tools, list):
        raise bad_field("tools", f"tools must be a list of tools, not {shown(tools)}")
    names = set()
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise bad_field(where, f"{where} must be {{'type': 'function', 'function': {{...}}}}")
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not name or not all(c.isalnum() or c in "_-" for c in name):
            raise bad_field(f"{where}.function.name", f"{where}.function.name must be letters, digits, '_' or '-'")
        if name in names:
            raise bad_field(f"{where}.function.name", f"two tools are called {name}")
        names.add(name)
        if not isinstance(function.get("parameters", {}), dict):
            raise bad_field(f"{where}.function.parameters", f"{where}.function.parameters must be a JSON schema")
        if not isinstance(function.get("description", ""), str):
            raise bad_field(f"{where}.function.description", f"{where}.function.description must be a string")
    return tools


def tool_choice_of(present: dict, tools: list[dict]) -> ToolChoice:
    """``tool_choice``: "none", "auto" (the default where tools are given), "required", or one function."""
    choice = present.get("tool_choice", "auto" if tools else "none")
    if choice == "none" or (choice == "auto" and not tools):
        return ToolChoice()
    if not tools:
        raise bad_field("tool_choice", f"tool_choice {shown(choice)} needs tools")
    if choice in ("auto", FORCED):
        return ToolChoice(choice)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise bad_field("tool_choice", "tool_choice must be 'none', 'auto', 'required' or "
                                       f"{{'type': 'function', 'function': {{'name': ...}}}}, not {shown(choice)}")
    if name not in {tool["function"]["name"] for tool in tools}:
        raise bad_field("tool_choice", f"tool_choice names {shown(name)}, which is not among the tools")
    return ToolChoice("function", name)


def tool_message(index: int, message: dict, content: str) -> dict:
    """A ``tool`` message: the answer to the call ``tool_call_id`` names."""
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad_field(f"messages[{index}].tool_call_id", f"messages[{index}] (a tool's answer) needs its "
                                                           "tool_call_id")
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def assistant_calls(index: int, calls) -> list[dict]:
    """An assistant message's ``tool_calls``: each with an id, a function name and its arguments as JSON text."""
    where = f"messages[{index}].tool_calls"
    if not isinstance(calls, list) or not calls:
        raise bad_field(where, f"{where} must be a non-empty list of calls")
    checked = []
    for number, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        name = function.get("name") if isinstance(function, dict) else None
        arguments = function.get("arguments", "{}") if isinstance(function, dict) else None
        if not isinstance(name, str) or not isinstance(arguments, str) or not isinstance(call.get("id", ""), str):
            raise bad_field(f"{where}[{number}]", f"{where}[{number}] must be {{'id': ..., 'type': 'function', "
                                                  "'function': {'name': ..., 'arguments': '<JSON>'}}")
        try:
            json.loads(arguments)
        except ValueError:
            raise bad_field(f"{where}[{number}].function.arguments", "a call's arguments must be JSON text") from None
        checked.append({"id": call.get("id") or f"call_{index}_{number}", "type": "function",
                        "function": {"name": name, "arguments": arguments}})
    return checked
