"""Where the endpoint listens and the key it asks for; loopback needs no key, any other address does."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

API_SOURCE = "api"  # the request origin the live panel shows as an API request

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8400
API_KEY_ENV = "KVASIR_API_KEY"  # read by `kvasir serve`, so the key need not show in the process list


class ApiConfigError(ValueError):
    """The endpoint can't start as configured; the message says what to change."""


@dataclass(frozen=True, slots=True)
class ApiConfig:
    """``port=0`` takes any free port (the server reports the one it got). ``api_key``: every request must send
    ``Authorization: Bearer <key>``; required for any address other than loopback."""

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host.strip():
            raise ApiConfigError("the host must be an address such as 127.0.0.1")
        object.__setattr__(self, "host", self.host.strip())
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ApiConfigError(f"the port must be a whole number from 0 to 65535, not {self.port!r}")
        if self.api_key is not None and not isinstance(self.api_key, str):
            raise ApiConfigError("the API key must be text")
        key = (self.api_key or "").strip() or None
        if key is not None and (not key.isprintable() or not key.isascii() or " " in key):
            raise ApiConfigError("the API key must be printable ASCII without spaces (it travels in an HTTP header)")
        object.__setattr__(self, "api_key", key)
        if not self.loopback and key is None:
            raise ApiConfigError(f"serving on {self.host} lets other machines use the model, so it needs an API key; "
                                 f"without one, serve on {DEFAULT_HOST} only")

    @property
    def loopback(self) -> bool:
        """True when only this machine can connect."""
        return is_loopback(self.host)


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
