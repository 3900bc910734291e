"""Connection guards for the endpoint: a deadline for each request's headers, and a cap on open connections.

Without them, clients that open connections and never finish a request hold a file each until the process runs
out of them, and the endpoint locks out everyone (uvicorn's own limits count requests, not half-sent ones). The
guards live in a subclass of uvicorn's HTTP/1.1 protocol, the one the endpoint runs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import ApiError, encode

HEADER_TIMEOUT_S = 10.0  # a local client sends its headers in milliseconds
MAX_CONNECTIONS = 1024
SPARE_FILES = 128  # open files kept for the model, the chat store and the log
WANTED_FILES = 4096


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a request's headers may take, and how many connections may be open at once."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        if self.header_timeout_s <= 0 or self.max_connections < 1:
            raise ValueError("the header timeout must be positive and at least one connection allowed")

    def protocol(self):
        """The protocol factory uvicorn's ``http`` setting takes."""
        return functools.partial(GuardedH11Protocol, limits=self)


def connection_cap(wanted: int = MAX_CONNECTIONS) -> int:
    """At most ``wanted`` connections, fewer where the process may not open enough files to keep some spare.
    Raises this process's open-file limit towards :data:`WANTED_FILES` first, as far as its hard limit allows."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to read or raise
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = WANTED_FILES if hard == resource.RLIM_INFINITY else min(WANTED_FILES, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return wanted if soft == resource.RLIM_INFINITY else max(1, min(wanted, soft - SPARE_FILES))


class GuardedH11Protocol(H11Protocol):
    """uvicorn's protocol, closing a connection whose request headers are not in by the deadline, and answering
    503 to a connection past the cap."""

    def __init__(self, *args, limits: ConnectionLimits, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._header_deadline = None

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.transport.write(_busy_response(self.limits.max_connections))
            self.transport.close()
            return
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in (or the request was refused)
            self._disarm_header_deadline()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_deadline()  # the next request on this connection gets the same deadline

    def connection_lost(self, exc) -> None:
        self._disarm_header_deadline()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        self._disarm_header_deadline()
        self._header_deadline = self.loop.call_later(self.limits.header_timeout_s, self._headers_too_slow)

    def _disarm_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_too_slow(self) -> None:
        self._header_deadline = None
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self.transport.close()


@functools.cache
def _busy_response(limit: int) -> bytes:
    error = ApiError(503, f"the server has {limit} connections open, its most; try again shortly",
                     code="too_many_connections")
    body = encode(error.body()).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"retry-after: 1\r\nconnection: close\r\n\r\n")
    return head.encode() + body
