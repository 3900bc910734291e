"""Conversations to Markdown and JSON, and back from JSON. No Qt in here."""

from __future__ import annotations

import json
import time

from .store import Store

FORMAT = "kvasir-conversation"
FORMAT_VERSION = 1


class ImportError_(ValueError):
    """The file is not a conversation Kvasir can read; the message says why."""


def to_markdown(store: Store, conversation_id: int) -> str:
    """The thread on screen as Markdown, with each reply's model and numbers."""
    conv = store.conversation(conversation_id)
    lines = [f"# {conv.title}", ""]
    if conv.system_prompt:
        lines += ["> **System:** " + conv.system_prompt.replace("\n", "\n> "), ""]
    for message in store.thread(conversation_id):
        who = "You" if message.role == "user" else f"Kvasir ({message.model or 'unknown model'})"
        lines += [f"## {who}", "", message.text, ""]
        if message.status != "complete":
            lines += [f"*({message.status})*", ""]
    return "\n".join(lines).rstrip() + "\n"


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
                      "error": m.error} for m in messages],
    }, indent=2, ensure_ascii=False)


def from_json(store: Store, text: str) -> int:
    """Create a conversation from :func:`to_json` output; returns its id."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ImportError_(f"not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ImportError_("not a Kvasir conversation export")
    if data.get("version", 0) > FORMAT_VERSION:
        raise ImportError_(f"written by a newer Kvasir (format version {data['version']})")
    meta = data["conversation"]
    conv = store.create_conversation(meta.get("title") or "Imported chat", meta.get("system_prompt", ""),
                                     meta.get("preset"), meta.get("settings") or {})
    new_ids: dict[int, int] = {}
    for m in sorted(data["messages"], key=lambda m: (m["created"], m["id"])):
        if m["role"] not in ("user", "assistant"):
            raise ImportError_(f"unknown role {m['role']!r}")
        parent = new_ids.get(m["parent"]) if m["parent"] is not None else None
        stored = store.add_message(conv.id, m["role"], m["text"], parent_id=parent, model=m.get("model"),
                                   quantization=m.get("quantization"), stats=m.get("stats") or {},
                                   status=m.get("status", "complete"), error=m.get("error"))
        new_ids[m["id"]] = stored.id
    head = new_ids.get(meta.get("head"))
    if head is not None:
        store.update_conversation(conv.id, head_id=head)
    return conv.id
