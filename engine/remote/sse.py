"""Server-sent events (the WHATWG event-stream format) read one line at a time.

OpenAI-compatible servers stream a chat reply as ``data: {json}`` events separated by blank lines, ending with
``data: [DONE]``. The decoder is fed lines (without their line ending) and returns each event when the blank
line that ends it arrives; comment lines (``: keep-alive``) and unknown fields are ignored, as the format says.
"""

from __future__ import annotations

from dataclasses import dataclass

DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One event: its type ("message" unless the server named one) and its data lines joined by newlines."""

    event: str
    data: str


class SSEDecoder:
    """Turns event-stream lines into :class:`SSEEvent`s; an event without data is not dispatched."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""

    def feed(self, line: str) -> SSEEvent | None:
        """Take one line (its ``\\n`` / ``\\r\\n`` already removed); return the event it completes, if any."""
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> SSEEvent | None:
        """The event left open when the stream ended without its closing blank line, if any."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event or "message"
        self._data, self._event = [], ""
        return SSEEvent(event, "\n".join(data)) if data else None
