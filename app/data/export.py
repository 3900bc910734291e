"""Conversations to Markdown and JSON, and back from JSON. No Qt in here."""

from __future__ import annotations

import html
import json
import math
import time

from .drafted_spans import KEPT_DRAFT_SPANS, valid_spans
from .reasoning import stored_reasoning
from .remote_store import SETTING as REMOTE_SETTING
from .remote_store import RemoteChoice
from .settings import SAMPLING_KEYS, sampling_problems
from .store import Message, Status, Store
from .thinking import THINK
from .tool_calls import call_problem, details, summary

FORMAT = "kvasir-conversation"
FORMAT_VERSION = 1


ROLES = ("user", "assistant")
STATUSES = tuple(Status)
FINISH_REASONS = (None, "stop", "length", "abort", "error")  # why the engine ended a reply
MESSAGE_KEYS = {  # key: (types allowed, required)
    "id": ((int,), True), "parent": ((int, type(None)), True), "role": ((str,), True), "text": ((str,), True),
    "created": ((int, float), True), "model": ((str, type(None)), False),
    "quantization": ((str, type(None)), False), "stats": ((dict, type(None)), False),
    "status": ((str,), False), "error": ((str, type(None)), False), "reasoning": ((str,), False),
    "tool_calls": ((list,), False),
}
CONVERSATION_KEYS = {
    "title": ((str, type(None)), False), "system_prompt": ((str,), False), "preset": ((str, type(None)), False),
    "settings": ((dict, type(None)), False), "head": ((int, type(None)), False),
}


class ConversationImportError(ValueError):
    """The file is not a conversation Kvasir can read; the message says why."""


def to_markdown(store: Store, conversation_id: int) -> str:
    """The thread on screen as Markdown, with each reply's model and numbers."""
    conv = store.conversation(conversation_id)
    lines = [f"# {conv.title}", ""]
    if conv.system_prompt:
        lines += ["> **System:** " + conv.system_prompt.replace("\n", "\n> "), ""]
    for message in store.thread(conversation_id):
        who = "You" if message.role == "user" else f"Kvasir ({message.model or 'unknown model'})"
        lines += [f"## {who}", "", *_reasoning_markdown(message), message.text, "", *_calls_markdown(message)]
        if message.status != Status.COMPLETE:
            lines += [f"*({message.status})*", ""]
    return "\n".join(lines).rstrip() + "\n"


def _calls_markdown(message: Message) -> list[str]:
    """A reply's tool calls, each a closed ``<details>`` block: its summary line, then its arguments and result."""
    lines = []
    for call in message.tool_calls:
        text = details(call).replace("</details>", "&lt;/details>")
        lines += ["<details>", f"<summary>{html.escape(summary(call))}</summary>", "", "```", text, "```", "",
                  "</details>", ""]
    return lines


def _reasoning_markdown(message: Message) -> list[str]:
    """A reply's reasoning as a closed ``<details>`` block (its summary line, then the text), or nothing."""
    if not message.reasoning:
        return []
    summary = html.escape(stored_reasoning(message).summary())
    text = message.reasoning.replace("</details>", "&lt;/details>")  # the block ends where Kvasir ends it
    return ["<details>", f"<summary>{summary}</summary>", "", text, "", "</details>", ""]


def to_json(store: Store, conversation_id: int) -> str:
    """The whole conversation, every branch included, as versioned JSON."""
    conv = store.conversation(conversation_id)
    messages = store.all_messages(conversation_id)
    return json.dumps({
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "exported": time.time(),
        "conversation": {"title": conv.title, "system_prompt": conv.system_prompt, "preset": conv.preset,
                         "settings": conv.settings, "head": conv.head_id},
        "messages": [{"id": m.id, "parent": m.parent_id, "role": m.role, "text": m.text, "created": m.created,
                      "model": m.model, "quantization": m.quantization, "stats": m.stats, "status": m.status,
                      "error": m.error, **({"reasoning": m.reasoning} if m.reasoning else {}),
                      **({"tool_calls": m.tool_calls} if m.tool_calls else {})} for m in messages],
    }, indent=2, ensure_ascii=False)


def from_json(store: Store, text: str) -> int:
    """Create a conversation from :func:`to_json` output; returns its id.

    The whole file is checked first and then written in one transaction, so a bad file changes nothing and
    raises :class:`ConversationImportError` saying what is wrong."""
    data = _parse(text)
    meta, messages = data["conversation"], data["messages"]
    with store.transaction():
        conv = store.create_conversation(meta.get("title") or "Imported chat", meta.get("system_prompt") or "",
                                         meta.get("preset"), meta.get("settings") or {})
        new_ids: dict[int, int] = {}
        for m in _parents_first(messages):
            parent = new_ids[m["parent"]] if m["parent"] is not None else None
            stored = store.add_message(conv.id, m["role"], m["text"], parent_id=parent, model=m.get("model"),
                                       quantization=m.get("quantization"), stats=m.get("stats") or {},
                                       status=m.get("status", Status.COMPLETE), error=m.get("error"),
                                       reasoning=m.get("reasoning", ""), tool_calls=m.get("tool_calls", []))
            new_ids[m["id"]] = stored.id
        head = new_ids.get(meta.get("head"))
        if head is not None:
            store.update_conversation(conv.id, head_id=head)
    return conv.id


def _parse(text: str) -> dict:
    """The export as a dict, every part of it checked; raises ConversationImportError."""
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise ConversationImportError(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ConversationImportError("not a Kvasir conversation export")
    version = data.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ConversationImportError(f"the format version {version!r} is not a number")
    if version > FORMAT_VERSION:
        raise ConversationImportError(f"written by a newer Kvasir (format version {version})")
    _check_conversation(data.get("conversation"))
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ConversationImportError("'messages' is missing or not a list")
    for index, message in enumerate(messages):
        _check_message(index, message)
    _check_tree(messages, data["conversation"].get("head"))
    return data


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _check_fields(where: str, value, spec: dict) -> None:
    """``value`` is an object whose keys have the types ``spec`` allows, with the required ones present."""
    if not isinstance(value, dict):
        raise ConversationImportError(f"{where} is not an object")
    for key, (types, required) in spec.items():
        if key not in value:
            if required:
                raise ConversationImportError(f"{where} has no '{key}'")
            continue
        item = value[key]
        if not isinstance(item, types) or (isinstance(item, bool) and bool not in types):
            raise ConversationImportError(f"{where}: '{key}' is {type(item).__name__}, not {_names(types)}")


def _names(types: tuple) -> str:
    words = {int: "an integer", float: "a number", str: "text", dict: "an object", list: "a list",
             type(None): "null"}
    return " or ".join(words[t] for t in types)


def _check_conversation(meta) -> None:
    _check_fields("'conversation'", meta, CONVERSATION_KEYS)
    settings = meta.get("settings") or {}
    unknown = set(settings) - set(SAMPLING_KEYS) - {"skip_messages", REMOTE_SETTING, THINK}
    if unknown:
        raise ConversationImportError(f"unknown chat settings: {', '.join(sorted(unknown))}")
    if not isinstance(settings.get(THINK, True), bool):
        raise ConversationImportError(f"the setting {THINK}={settings[THINK]!r} is not true or false")
    if REMOTE_SETTING in settings and RemoteChoice.from_setting(settings[REMOTE_SETTING]) is None:
        raise ConversationImportError("the setting 'remote' must name a server and a model")
    skip = settings.get("skip_messages", 0)
    if not isinstance(skip, int) or isinstance(skip, bool) or skip < 0:
        raise ConversationImportError(f"the setting skip_messages={skip!r} is not a count")
    problems = sampling_problems(settings)
    if problems:
        raise ConversationImportError("invalid sampling settings: " + "; ".join(problems.values()))


def _check_message(index: int, message) -> None:
    where = f"message {index + 1}"
    _check_fields(where, message, MESSAGE_KEYS)
    if message["role"] not in ROLES:
        raise ConversationImportError(f"{where}: unknown role {message['role']!r}")
    if message.get("status", Status.COMPLETE) not in STATUSES:
        raise ConversationImportError(f"{where}: unknown status {message['status']!r}")
    if not math.isfinite(message["created"]):
        raise ConversationImportError(f"{where}: 'created' is not a finite number")
    problem = call_problem(message.get("tool_calls", []))
    if problem is not None:
        raise ConversationImportError(f"{where}: {problem}")
    for key, value in (message.get("stats") or {}).items():
        if key == "finish_reason":
            if value not in FINISH_REASONS:
                raise ConversationImportError(f"{where}: unknown finish reason {value!r}")
        elif key == KEPT_DRAFT_SPANS:
            if value and not valid_spans(value):
                raise ConversationImportError(f"{where}: {KEPT_DRAFT_SPANS} is not a list of [start, end] ranges "
                                              "in order")
        elif value is not None and not _finite_number(value):
            raise ConversationImportError(f"{where}: the statistic {key!r} is {value!r}, not a finite number")


def _finite_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _check_tree(messages: list[dict], head) -> None:
    """Ids are unique, every parent is in the file, and following parents never loops."""
    parents = {}
    for m in messages:
        if m["id"] in parents:
            raise ConversationImportError(f"two messages have the id {m['id']}")
        parents[m["id"]] = m["parent"]
    for message_id, parent in parents.items():
        if parent is not None and parent not in parents:
            raise ConversationImportError(f"message {message_id} answers message {parent}, which is not in the file")
    acyclic: set[int] = set()
    for start in parents:
        path, node = set(), start
        while node is not None and node not in acyclic:
            if node in path:
                raise ConversationImportError(f"the replies of message {start} loop back on themselves")
            path.add(node)
            node = parents[node]
        acyclic |= path  # walked to a root: no later walk needs to pass here again (each message walked once)
    if head is not None and head not in parents:
        raise ConversationImportError(f"the conversation's current message {head} is not in the file")


def _parents_first(messages: list[dict]) -> list[dict]:
    """Messages in an order where each comes after its parent; siblings oldest first."""
    children: dict[int | None, list[dict]] = {}
    for m in sorted(messages, key=lambda m: (m["created"], m["id"])):
        children.setdefault(m["parent"], []).append(m)
    ordered = list(children.get(None, []))
    for m in ordered:  # grows while it is walked: a breadth-first walk from the roots
        ordered += children.get(m["id"], [])
    return ordered
