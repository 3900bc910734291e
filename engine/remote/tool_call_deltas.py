"""The tool calls of a streamed reply from an OpenAI-compatible server, put back together from their deltas.

OpenAI's stream sends each call in pieces under its ``index``: the first piece has the call's ``id`` and the
function's ``name``, the next ones pieces of its ``arguments`` (a JSON text), and some servers send a call
whole in one piece. Pieces are joined per index; a call is complete once the reply finishes.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..templates.tool_calls import ToolCall, new_call_id
from .errors import RemoteError


@dataclass(slots=True)
class _Parts:
    id: str = ""
    name: str = ""
    arguments: str = ""


class ToolCallDeltas:
    """``add`` each delta's ``tool_calls`` list as it arrives; ``calls()`` once the reply has finished."""

    def __init__(self) -> None:
        self._parts: dict[int, _Parts] = {}

    def __bool__(self) -> bool:
        return bool(self._parts)

    def add(self, pieces) -> None:
        """One delta's ``tool_calls``; a piece that is not OpenAI's shape raises :class:`RemoteError`."""
        if not isinstance(pieces, list):
            raise RemoteError(f"the server sent tool_calls that are not a list: {_shown(pieces)}")
        for position, piece in enumerate(pieces):
            if not isinstance(piece, dict):
                raise RemoteError(f"the server sent a tool call that is not an object: {_shown(piece)}")
            index = piece.get("index", position)
            function = piece.get("function") or {}
            if not isinstance(index, int) or isinstance(index, bool) or not isinstance(function, dict):
                raise RemoteError(f"the server sent a malformed tool call: {_shown(piece)}")
            parts = self._parts.setdefault(index, _Parts())
            parts.id = _text(piece, "id", parts.id) or parts.id
            parts.name += _text(function, "name", "")
            parts.arguments += _text(function, "arguments", "")

    def calls(self) -> tuple[ToolCall, ...]:
        """The calls in index order; one without a function name raises :class:`RemoteError`. A call the
        server gave no id gets one here (a tool's answer must name its call)."""
        calls = []
        for index in sorted(self._parts):
            parts = self._parts[index]
            if not parts.name:
                raise RemoteError(f"the server sent tool call {index} without a function name")
            calls.append(ToolCall(parts.id or new_call_id(), parts.name, parts.arguments or "{}"))
        return tuple(calls)


def _text(fields: dict, key: str, default: str) -> str:
    value = fields.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise RemoteError(f"the server sent a tool call whose {key} is not text: {_shown(value)}")
    return value


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:79] + "…"
