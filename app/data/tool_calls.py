"""A reply's tool calls as they are stored with it, and as the model reads them again. No Qt in here.

Each call is a dict: ``id``, ``name``, ``arguments`` (the JSON text the model wrote), ``status`` (``done``,
``failed``, ``refused``, or ``pending`` until it ends) and ``result`` (the tool's answer, or why there is none)."""

from __future__ import annotations

import json

DONE, FAILED, REFUSED, PENDING = "done", "failed", "refused", "pending"  # how a call ended, or that it has not
NOT_RUN = "the call was not run (the app stopped before it ended)"
REFUSED_TEXT = "the user refused to run this tool"
TOOLS = "tools"  # a chat's setting: True offers the MCP servers' tools to its model
ALLOWED = "allowed_tools"  # a chat's setting: the tools the user let run without asking
# a chat's setting: which tool the first reply to each message must call: absent or "auto" (the model decides),
# "required" (any offered tool) or a tool's name; later replies of the same turn decide for themselves
TOOL_CHOICE = "tool_choice"
AUTO, REQUIRED = "auto", "required"


def pending_calls(tool_calls) -> list[dict]:
    """The engine's ``ToolCall``s of a finished reply, stored before any has run."""
    return [{"id": c.id, "name": c.name, "arguments": c.arguments, "status": PENDING, "result": ""}
            for c in tool_calls]


def with_answers(sent: dict, calls: list[dict]) -> list[dict]:
    """An assistant message ``sent`` with its ``calls`` and, after it, their answers as ``tool`` messages."""
    if not calls:
        return [sent]
    sent["tool_calls"] = [{"id": c["id"], "type": "function",
                           "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls]
    return [sent, *({"role": "tool", "tool_call_id": c["id"], "content": answer_of(c)} for c in calls)]


def answer_of(call: dict) -> str:
    """What the model reads as a call's answer."""
    if call.get("status") == PENDING:
        return NOT_RUN
    if call.get("status") == DONE:
        return call.get("result", "")
    return f"Error: {call.get('result', '')}"


def pretty_arguments(arguments: str) -> str:
    """A call's arguments as indented JSON (as written, where they are not JSON)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def tools_on(settings: dict) -> bool:
    """Whether a chat with ``settings`` offers the MCP tools to its model."""
    return settings.get(TOOLS) is True


def tool_choice(settings: dict, offered: list[str]) -> str:
    """A chat's tool choice among the ``offered`` tool names: ``AUTO``, ``REQUIRED`` or one of ``offered`` (a
    tool no server offers any more counts as ``AUTO``)."""
    value = settings.get(TOOL_CHOICE)
    return value if value == REQUIRED or value in offered else AUTO


def allowed(settings: dict) -> list[str]:
    """The tools a chat lets run without asking."""
    value = settings.get(ALLOWED)
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


STATUS_WORDS = {DONE: "done", FAILED: "failed", REFUSED: "refused", PENDING: "not run yet"}


def summary(call: dict) -> str:
    """A call in one line, as the transcript shows it closed."""
    return f"Tool call: {call.get('name', '?')} · {STATUS_WORDS.get(call.get('status'), call.get('status'))}"


def details(call: dict) -> str:
    """A call's arguments and its result (or why it has none), as the transcript shows it open."""
    heading = "Result" if call.get("status") == DONE else "Reason"
    result = call.get("result") or ("(waiting)" if call.get("status") == PENDING else "(empty)")
    return f"Arguments:\n{pretty_arguments(call.get('arguments', ''))}\n\n{heading}:\n{result}"


CALL_KEYS = ("id", "name", "arguments", "status", "result")


def call_problem(calls) -> str | None:
    """Why ``calls`` (read from a file) are not a reply's stored tool calls, or None when they are."""
    if not isinstance(calls, list):
        return "tool_calls must be a list"
    for number, call in enumerate(calls, 1):
        if not isinstance(call, dict) or not all(isinstance(call.get(key), str) for key in CALL_KEYS):
            return f"tool call {number} needs the texts {', '.join(CALL_KEYS)}"
        if call["status"] not in STATUS_WORDS:
            return f"tool call {number} has an unknown status {call['status']!r}"
    return None
