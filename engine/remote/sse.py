"""Server-sent events (the WHATWG event-stream format) read one line at a time.

OpenAI-compatible servers stream a chat reply as ``data: {json}`` events separated by blank lines, ending with
``data: [DONE]``. The decoder is fed lines (without their line ending) and returns each event when the blank
line that ends it arrives; comment lines (``: keep-alive``) and unknown fields are ignored, as the format says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import RemoteError

DONE = "[DONE]"
MAX_LINE_CHARS = 4 * 1024 * 1024  # a chat chunk is a few hundred characters; a line this long is not one
MAX_EVENT_CHARS = 8 * 1024 * 1024
_NEWLINE = re.compile(r"\r\n|\r|\n")


class LineSplitter:
    """Text as it arrives, cut into lines (``\n``, ``\r\n`` or ``\r``, the endings the format allows). A line
    longer than ``max_chars`` is refused (:class:`RemoteError`) instead of being held: a server that never
    ends one would otherwise grow the client without bound."""

    def __init__(self, max_chars: int = MAX_LINE_CHARS) -> None:
        self.max_chars, self.pending = max_chars, ""

    def feed(self, text: str) -> list[str]:
        """The lines that ``text`` completes."""
        if not _NEWLINE.search(text):
            self.pending += text
            self._check()
            return []
        text, held = (text[:-1], "\r") if text.endswith("\r") else (text, "")  # maybe half of a \r\n
        lines = _NEWLINE.split(self.pending + text)
        self.pending = lines.pop() + held
        self._check()
        return lines

    def flush(self) -> list[str]:
        """The last line, when the text ended without a line ending."""
        last, self.pending = self.pending.rstrip("\r"), ""
        return [last] if last else []

    def _check(self) -> None:
        if len(self.pending) > self.max_chars:
            raise RemoteError(f"the server sent a line of more than {self.max_chars // 1024**2} MiB without ending "
                              "it; the reply was stopped there")


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One event: its type ("message" unless the server named one) and its data lines joined by newlines."""

    event: str
    data: str


class SSEDecoder:
    """Turns event-stream lines into :class:`SSEEvent`s; an event without data is not dispatched."""

    def __init__(self, max_chars: int = MAX_EVENT_CHARS) -> None:
        self._data: list[str] = []
        self._event = ""
        self._size, self.max_chars = 0, max_chars

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
            self._size += len(value) + 1
            if self._size > self.max_chars:
                raise RemoteError(f"the server sent an event of more than {self.max_chars // 1024**2} MiB; the "
                                  "reply was stopped there")
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> SSEEvent | None:
        """The event left open when the stream ended without its closing blank line, if any."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event or "message"
        self._data, self._event, self._size = [], "", 0
        return SSEEvent(event, "\n".join(data)) if data else None
