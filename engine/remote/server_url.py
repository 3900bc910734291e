"""Where a remote server is: its base address, the API under it and its Prometheus metrics beside it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit


@dataclass(slots=True)
class RemoteConfig:
    """An OpenAI-compatible server. ``base_url`` may end in ``/v1`` or not (``http://host:8000`` and
    ``http://host:8000/v1`` are the same server); a bad address raises ``ValueError`` saying why.

    Timeouts: ``connect_timeout_s`` to open the connection, ``read_timeout_s`` for the longest silence
    between two pieces of a reply (a long prompt on a busy server may take a while to its first token).
    ``connect_retries``: how often a connection that could not be opened is tried again (nothing was sent)."""

    base_url: str
    api_key: str | None = None
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 120.0
    connect_retries: int = 2

    def __post_init__(self) -> None:
        self.base_url = normalise_base_url(self.base_url)
        self.api_key = (self.api_key or "").strip() or None
        for name in ("connect_timeout_s", "read_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a number of seconds > 0, not {value!r}")
        if isinstance(self.connect_retries, bool) or not isinstance(self.connect_retries, int) \
                or self.connect_retries < 0:
            raise ValueError(f"connect_retries must be a whole number >= 0, not {self.connect_retries!r}")

    @property
    def api_root(self) -> str:
        """The OpenAI API: ``<base>/v1``."""
        return self.base_url + "/v1"

    @property
    def metrics_url(self) -> str:
        """Prometheus metrics, where vLLM, SGLang and llama-server put them: ``<base>/metrics``."""
        return self.base_url + "/metrics"

    @property
    def is_local(self) -> bool:
        """True for a server on this machine (loopback), where plain http can't be overheard."""
        return is_loopback(urlsplit(self.base_url).hostname or "")


def normalise_base_url(url: str) -> str:
    """``url`` without a trailing ``/`` or ``/v1``; refuses what is not an http(s) address with a host."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("the server address is empty")
    text = url.strip()
    if "://" not in text:
        raise ValueError(f"{text!r} is not a web address: start it with http:// or https://")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{text!r}: only http:// and https:// servers are supported")
    try:
        parts.port  # noqa: B018 (raises on a port that is not a number)
    except ValueError:
        raise ValueError(f"{text!r}: the port is not a number between 0 and 65535") from None
    if not parts.hostname:
        raise ValueError(f"{text!r} names no host")
    if parts.query or parts.fragment:
        raise ValueError(f"{text!r}: a server address takes no ?query or #fragment")
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[: -len("/v1")]
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost`` or a loopback address."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
