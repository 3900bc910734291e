"""Who may use the endpoint: the API key when one is set, and, on loopback, only this machine's own clients.

On loopback with no key, two browser tricks could still reach the model: a web page posting to
``127.0.0.1`` (its ``Origin`` is another site), and DNS rebinding (a name of the page's own that resolves to
``127.0.0.1``; the ``Host`` header still says that name). Both are refused. A page served from another port of
this machine is refused too: it is whatever that server shows (a dev server's preview, a downloaded page behind a
file server), and a browser sends its plain-text posts without asking first. Only the endpoint's own origin
passes without a key; with a key, any page that sends it is served.
"""

from __future__ import annotations

import hmac
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .config import ApiConfig, is_loopback
from .errors import ApiError

MISSING_KEY = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
               "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
WRONG_KEY = "Incorrect API key provided."


class AccessGuard:
    """ASGI middleware: answers a request it refuses with an OpenAI-shaped 401 or 403, and passes the rest."""

    def __init__(self, app: ASGIApp, config: ApiConfig) -> None:
        self.app = app
        self.key = config.api_key.encode() if config.api_key else None
        self.loopback = config.loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self.problem(Headers(scope=scope))
            if problem is not None:
                await problem.response()(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def problem(self, headers: Headers) -> ApiError | None:
        """Why a request with these headers is refused, or None."""
        if self.loopback and not is_loopback(_host_name(headers.get("host", ""))):
            return ApiError(403, "this server answers only requests addressed to 127.0.0.1 or localhost",
                            code="host_not_allowed")
        if self.key is None:
            origin = headers.get("origin")
            if origin and urlsplit(origin).netloc.lower() != headers.get("host", "").lower():
                return ApiError(403, "requests from web pages (other than the server's own address) are refused "
                                     "unless the server has an API key", code="origin_not_allowed")
            return None
        return self._key_problem(headers.get("authorization"))

    def _key_problem(self, authorization: str | None) -> ApiError | None:
        challenge = {"WWW-Authenticate": "Bearer"}
        if not authorization:
            return ApiError(401, MISSING_KEY, headers=challenge)
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8", "replace"), self.key):
            return ApiError(401, WRONG_KEY, code="invalid_api_key", headers=challenge)
        return None


def _host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8400`` -> ``::1``)."""
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host
