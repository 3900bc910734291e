"""Length-prefixed JSON frames: how the engine and its template workers talk over a pipe."""

from __future__ import annotations

import json
import struct
from typing import BinaryIO

HEADER = struct.Struct(">Q")


def write_frame(stream: BinaryIO, value: dict) -> None:
    """Send ``value`` as one frame and flush it."""
    body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")
    stream.write(HEADER.pack(len(body)) + body)
    stream.flush()


def read_frame(stream: BinaryIO) -> dict | None:
    """The next frame, or None at the end of the stream (the other side has gone)."""
    header = _read_exactly(stream, HEADER.size)
    if header is None:
        return None
    body = _read_exactly(stream, HEADER.unpack(header)[0])
    if body is None:
        return None
    return json.loads(body.decode("utf-8", "surrogatepass"))


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)
