"""What went wrong talking to a remote server, said so that the user can act on it."""

from __future__ import annotations

import json

import httpx

from ..errors import EngineError

BODY_SHOWN = 200  # characters of an error page quoted in a message


class RemoteError(EngineError):
    """A remote server could not be reached or refused the request; the message says which and why."""


def status_reason(status: int, body: bytes | str, headers: httpx.Headers | dict | None = None) -> str:
    """A message for an HTTP error reply: what the status means here, and the server's own words."""
    detail = server_message(body)
    said = f": {detail}" if detail else ""
    if status == 401:
        return f"the server refused the API key (HTTP 401){said}. Check the key in the server's settings."
    if status == 403:
        return f"the server does not allow this (HTTP 403){said}"
    if status == 404:
        return f"not found on the server (HTTP 404){said}. Check the address and the model name."
    if status == 429:
        retry = (headers or {}).get("retry-after")
        wait = f" It asks to wait {retry} s." if retry else ""
        return f"the server is busy or rate-limiting (HTTP 429){said}.{wait} Try again later."
    if status >= 500:
        return f"the server failed (HTTP {status}){said}"
    return f"the server refused the request (HTTP {status}){said}"


def server_message(body: bytes | str) -> str:
    """The message inside an OpenAI-shaped error body (``{"error": {"message": ...}}``), else the start of the
    body as text."""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else (body or "")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    message = error_message(data) if data is not None else None
    if message:
        return message
    text = " ".join(text.split())
    return text if len(text) <= BODY_SHOWN else text[: BODY_SHOWN - 1] + "…"


def error_message(data) -> str | None:
    """The message of an error object in a JSON reply or stream chunk: OpenAI's ``{"error": {...}}``, or the
    ``{"error": "text"}`` / ``{"detail": ...}`` / ``{"message": ...}`` shapes other servers use."""
    if not isinstance(data, dict):
        return None
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or error.get("type") or error)
    if isinstance(error, str) and error:
        return error
    for key in ("detail", "message"):
        if isinstance(data.get(key), str) and data[key]:
            return data[key]
    return None


def transport_reason(exc: httpx.HTTPError, url: str, read_timeout_s: float) -> str:
    """A message for a failure below HTTP: refused, unreachable, timed out, cut off."""
    if isinstance(exc, httpx.ConnectTimeout):
        return f"could not connect to {url}: no answer within the connect timeout"
    if isinstance(exc, httpx.ConnectError):
        return f"could not connect to {url}: {_cause(exc)}"
    if isinstance(exc, httpx.ReadTimeout):
        return f"the server sent nothing for {read_timeout_s:g} s (read timeout)"
    if isinstance(exc, httpx.WriteTimeout):
        return "the request could not be sent in time (write timeout)"
    if isinstance(exc, httpx.PoolTimeout):
        return "too many requests to this server at once (no free connection)"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return f"the server closed the connection mid-reply ({_cause(exc)})"
    return f"the connection to {url} failed: {_cause(exc)}"


def _cause(exc: BaseException) -> str:
    text = str(exc).strip()
    return text or type(exc).__name__
