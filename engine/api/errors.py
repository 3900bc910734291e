"""Errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}`` with the matching status."""

from __future__ import annotations

import json

from starlette.responses import Response

# OpenAI's error types by HTTP status; anything not listed is a server error.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """A request the server answers with an error; ``param`` names the field at fault, when there is one."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        """The JSON body OpenAI's clients read."""
        kind = ERROR_TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        return json_response(self.body(), self.status, self.headers)


def bad_field(param: str, message: str, code: str | None = None) -> ApiError:
    """A 400 that names the field at fault."""
    return ApiError(400, message, param=param, code=code)


def json_response(body: dict, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """JSON with every non-ASCII character escaped, so text the client sent (a lone surrogate, say) can always
    be echoed back without an encoding failure."""
    return Response(encode(body), status, headers=headers, media_type="application/json")


def encode(body: dict) -> str:
    return json.dumps(body, ensure_ascii=True, separators=(",", ":"))


def shown(value, limit: int = 40) -> str:
    """A value as an error message quotes it: short, and safe to print."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
