"""What a tool call ended with, as text the model and the user read. No Qt in here."""

from __future__ import annotations

from dataclasses import dataclass

from ..data.tool_calls import DONE, FAILED


@dataclass(slots=True, frozen=True)
class ToolOutcome:
    """A call's end: ``done`` with the tool's answer, or ``failed`` / ``refused`` with the reason."""

    status: str
    text: str

    @classmethod
    def failed(cls, reason: str) -> ToolOutcome:
        return cls(FAILED, reason)


def outcome_of(result) -> ToolOutcome:
    """A ``CallToolResult`` as text: its text content joined, other content described; a result the tool
    marked as an error, or one that is not a result at all, is a failure saying so."""
    content = getattr(result, "content", None)
    if not isinstance(content, list):
        return ToolOutcome.failed(f"the server answered with something that is not a tool result "
                                  f"({type(result).__name__})")
    text = "\n".join(_describe(part) for part in content)
    if getattr(result, "is_error", False):
        return ToolOutcome.failed(f"the tool reported an error: {text or 'no details'}")
    return ToolOutcome(DONE, text)


def _describe(part) -> str:
    """One piece of a result: text as it is, anything else named by its kind."""
    kind = getattr(part, "type", None)
    if kind == "text":
        return str(getattr(part, "text", ""))
    if kind in ("image", "audio"):
        return f"[{kind}: {getattr(part, 'mime_type', None) or 'unknown type'}]"
    if kind == "resource_link":
        return f"[resource: {getattr(part, 'uri', '')}]"
    if kind == "resource":
        inner = getattr(part, "resource", None)
        text = getattr(inner, "text", None)
        return text if isinstance(text, str) else f"[resource: {getattr(inner, 'uri', '')}]"
    return f"[{kind or type(part).__name__} content]"
