"""Tool calls in a reply: the format a model writes them in, picked from its chat template, and a reply's answer
split as it streams into its text and its calls.

Handled: Hermes-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5, Qwen3, Hermes,
SmolLM3, and every model whose template knows no tools: :mod:`.tool_prompt` describes the tools in this format),
Mistral's ``[TOOL_CALLS]`` (a JSON list, or ``name[ARGS]{...}`` pieces) and Llama 3.x's JSON reply
(``{"name": ..., "parameters": {...}}``, after ``<|python_tag|>`` or alone). A call that does not parse stays in the
text, so nothing the model wrote is lost.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from .reasoning import partial_marker


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model asked for: its id (for the tool's answer to name), the tool and its arguments as JSON."""

    id: str
    name: str
    arguments: str

    def as_openai(self, index: int | None = None) -> dict:
        """OpenAI's shape (with ``index`` for a stream's delta)."""
        call = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return call if index is None else {"index": index, **call}


@dataclass(frozen=True, slots=True)
class ToolCallFormat:
    """How a family writes its calls: ``start`` opens them; ``end`` closes each one (None: they run to the end of
    the reply)."""

    name: str
    start: str
    end: str | None


HERMES = ToolCallFormat("hermes", "<tool_call>", "</tool_call>")
MISTRAL = ToolCallFormat("mistral", "[TOOL_CALLS]", None)
LLAMA3 = ToolCallFormat("llama3", "<|python_tag|>", None)


def tool_call_format(template_source: str | None) -> ToolCallFormat:
    """The format the model's template shows its calls in; Hermes where the template knows no tools."""
    source = template_source or ""
    if "[TOOL_CALLS]" in source:
        return MISTRAL
    if "<tool_call>" in source:
        return HERMES
    if "<|python_tag|>" in source or ("ipython" in source and "parameters" in source):
        return LLAMA3
    return HERMES


def renders_tools(template_source: str | None) -> bool:
    """Whether the template lays out a ``tools`` list itself (else the default tool prompt describes them)."""
    return "tools" in (template_source or "")


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallStream:
    """Takes a reply's answer output after output and gives back its text (what may still become a call held
    back) and its calls, each parsed once it is complete."""

    def __init__(self, fmt: ToolCallFormat) -> None:
        self.fmt = fmt
        self.text = ""
        self.calls: list[ToolCall] = []
        self._parsed: list[tuple[str, str]] = []

    def update(self, answer: str, final: bool) -> tuple[str, list[ToolCall]]:
        """The answer so far (``final``: all of it); returns the new text and the new calls."""
        text, parsed = split_tool_calls(answer, self.fmt, final)
        new_text = text[len(self.text):]
        self.text = text
        new_calls = [ToolCall(new_call_id(), name, arguments) for name, arguments in parsed[len(self._parsed):]]
        self._parsed = parsed
        self.calls += new_calls
        return new_text, new_calls


def split_tool_calls(answer: str, fmt: ToolCallFormat, final: bool) -> tuple[str, list[tuple[str, str]]]:
    """An answer's text and its complete calls as (name, arguments as JSON). Text from where a call begins is
    held back until the call is complete; a call that does not parse is given back as text once the reply ends."""
    if fmt is LLAMA3:
        return _split_json_reply(answer, final)
    start = answer.find(fmt.start)
    if start < 0:
        return answer[: len(answer) - (0 if final else partial_marker(answer, fmt.start))], []
    before, rest = answer[:start], answer[start:]
    calls = _hermes_calls(rest, final) if fmt is HERMES else _mistral_calls(rest[len(fmt.start):], final)
    if calls is None:  # junk where a call should be: the reply's own text
        return (answer, []) if final else (before, [])
    return before, calls


def _hermes_calls(rest: str, final: bool) -> list[tuple[str, str]] | None:
    """The complete ``<tool_call>`` blocks at the start of ``rest``; None when one is not a call."""
    calls, position = [], 0
    while True:
        position += len(rest[position:]) - len(rest[position:].lstrip())
        if not rest.startswith(HERMES.start, position):
            break
        end = rest.find(HERMES.end, position)
        if end < 0:
            return None if final else calls
        call = _call(rest[position + len(HERMES.start): end])
        if call is None:
            return None
        calls.append(call)
        position = end + len(HERMES.end)
    if rest[position:].strip() and final:
        return calls or None  # text after the calls is dropped, as the peers do
    return calls


def _mistral_calls(body: str, final: bool) -> list[tuple[str, str]] | None:
    """``[{"name": ..., "arguments": ...}, ...]`` or ``name[ARGS]{...}`` pieces, known once the reply ends."""
    if not final:
        return []
    body = body.strip()
    if body.startswith("["):
        try:
            items = json.loads(body)
        except ValueError:
            return None
        calls = [_call_of(item) for item in items] if isinstance(items, list) else [None]
        return None if not calls or None in calls else calls
    calls = []
    for piece in body.split("[TOOL_CALLS]"):
        name, marker, arguments = piece.partition("[ARGS]")
        call = _call_of({"name": name.strip(), "arguments": _json(arguments)}) if marker else None
        if call is None:
            return None
        calls.append(call)
    return calls


def _split_json_reply(answer: str, final: bool) -> tuple[str, list[tuple[str, str]]]:
    """Llama 3.x: a reply that is a call is a JSON object (or several, split by ';'), known once it ends."""
    head = answer.lstrip()
    if not (head.startswith(("{", LLAMA3.start)) or (not final and LLAMA3.start.startswith(head))):
        return answer, []
    body = head.removeprefix(LLAMA3.start).strip()
    if not final:
        return "", []
    calls = [_call(part) for part in body.split(";") if part.strip()]
    return (answer, []) if not calls or None in calls else ("", calls)


def _call(text: str) -> tuple[str, str] | None:
    return _call_of(_json(text))


def _call_of(item) -> tuple[str, str] | None:
    """(name, arguments as JSON) of a parsed call (arguments or Llama's parameters), None if it is not one."""
    if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
        return None
    arguments = item.get("arguments", item.get("parameters", {}))
    if isinstance(arguments, str):
        arguments = _json(arguments)
    if not isinstance(arguments, dict):
        return None
    return item["name"], json.dumps(arguments, ensure_ascii=False)


def _json(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def forced_call_grammar(fmt: ToolCallFormat, tools: list[dict], name: str | None = None) -> str:
    """A Lark grammar (llguidance's, with ``%json`` schemas) for a reply that is exactly one call, in ``fmt``, to
    the tool ``name`` (None: to any of ``tools``), its arguments held to the tool's parameters."""
    chosen = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    key = "parameters" if fmt is LLAMA3 else "arguments"
    calls = [{"type": "object", "properties": {"name": {"const": f["name"]},
                                               key: f.get("parameters") or {"type": "object"}},
              "required": ["name", key], "additionalProperties": False} for f in chosen]
    schema = {"x-guidance": {"whitespace_flexible": False}, **(calls[0] if len(calls) == 1 else {"anyOf": calls})}
    call = f"call: %json {json.dumps(schema)}"
    if fmt is HERMES:
        return f'start: "<tool_call>\\n" call "\\n</tool_call>"\n{call}'
    if fmt is MISTRAL:
        return f'start: "[TOOL_CALLS][" call "]"\n{call}'
    return f"start: call\n{call}"
