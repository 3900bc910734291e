"""The MCP servers the user added in Preferences, as stored with the settings. No Qt in here.

A server is started as a local program that speaks MCP on its standard input and output (``stdio``: a command,
its arguments and extra environment variables) or reached at a URL (``http``: MCP's streamable HTTP transport,
with optional headers)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

TRANSPORTS = ("stdio", "http")
CONNECT_TIMEOUT_S = 30.0  # a server that has not answered its first questions after this long is "not answering"
DEFAULT_TOOL_TIMEOUT_S = 30.0  # a tool call that has not answered after this long ends with that reason
MAX_TOOL_TIMEOUT_S = 3600.0


@dataclass(slots=True, frozen=True)
class McpServer:
    """One MCP server: how to reach it, and whether its tools are offered to chats."""

    name: str
    transport: str = "stdio"
    command: str = ""
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    url: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    enabled: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError("an MCP server needs a name")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"{self.name}: the transport must be one of {', '.join(TRANSPORTS)}")
        if self.transport == "stdio" and not (isinstance(self.command, str) and self.command.strip()):
            raise ValueError(f"{self.name}: a stdio server needs a command to start")
        if self.transport == "http" and not (isinstance(self.url, str) and
                                             self.url.startswith(("http://", "https://"))):
            raise ValueError(f"{self.name}: an HTTP server needs a URL starting with http:// or https://")
        _check_strings(self.name, "arguments", list(self.args))
        _check_strings(self.name, "environment", [*self.env, *self.env.values()])
        _check_strings(self.name, "headers", [*self.headers, *self.headers.values()])

    def to_dict(self) -> dict:
        return {**asdict(self), "args": list(self.args)}

    @classmethod
    def from_dict(cls, saved) -> McpServer:
        """A server from its stored form; a ValueError names what is wrong with it."""
        if not isinstance(saved, dict):
            raise ValueError("an MCP server must be an object")
        known = {k: v for k, v in saved.items() if k in cls.__dataclass_fields__}
        if not isinstance(known.get("args", []), list | tuple):
            raise ValueError(f"{saved.get('name')}: the arguments must be a list")
        for key in ("env", "headers"):
            if not isinstance(known.get(key, {}), dict):
                raise ValueError(f"{saved.get('name')}: the {key} must be an object")
        return cls(**{**known, "args": tuple(known.get("args", ()))})


def _check_strings(name: str, what: str, values: list) -> None:
    if not all(isinstance(v, str) for v in values):
        raise ValueError(f"{name}: the {what} must be text")


def valid_servers(saved) -> list[dict]:
    """The stored servers that are valid, with unique names (a later duplicate is dropped); raises nothing."""
    kept, names = [], set()
    for entry in saved if isinstance(saved, list) else []:
        try:
            server = McpServer.from_dict(entry)
        except (ValueError, TypeError):
            continue
        if server.name.casefold() not in names:
            names.add(server.name.casefold())
            kept.append(server.to_dict())
    return kept


def servers_of(settings) -> list[McpServer]:
    """The MCP servers in ``settings``."""
    return [McpServer.from_dict(s) for s in valid_servers(settings["mcp_servers"])]


def tool_timeout_s(settings) -> float:
    """How long a tool call may take before it ends with "timed out"."""
    return float(settings["tool_timeout_s"])


def parse_pairs(text: str, separator: str, what: str) -> dict[str, str]:
    """``KEY<separator>value`` lines (blank lines skipped) as a dict; a ValueError names the first bad line."""
    pairs = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, found, value = line.partition(separator)
        if not found or not key.strip():
            raise ValueError(f"{what}, line {number}: write it as NAME{separator.strip() or separator}value")
        pairs[key.strip()] = value.strip()
    return pairs


def pairs_text(pairs: dict[str, str], separator: str) -> str:
    return "\n".join(f"{key}{separator}{value}" for key, value in pairs.items())
