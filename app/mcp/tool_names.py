"""The MCP servers' tools as the model sees them: OpenAI tool definitions, with names unique across servers.
No Qt in here."""

from __future__ import annotations

import re
from dataclasses import dataclass

EMPTY_SCHEMA = {"type": "object", "properties": {}}


@dataclass(slots=True, frozen=True)
class OfferedTool:
    """A tool as offered to the model (``name``) and where it lives (``server``, ``tool``: its own name)."""

    name: str
    server: str
    tool: str
    description: str
    parameters: dict

    def to_openai(self) -> dict:
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def offered_tools(listed: dict[str, list]) -> list[OfferedTool]:
    """Every server's tools (``listed``: server name -> its MCP ``Tool``s); a name that two servers share is
    prefixed with its server's name, so the model can name each one."""
    counts: dict[str, int] = {}
    for tools in listed.values():
        for tool in tools:
            counts[tool.name] = counts.get(tool.name, 0) + 1
    offered = []
    for server, tools in listed.items():
        for tool in tools:
            name = tool.name if counts[tool.name] == 1 else f"{_identifier(server)}__{tool.name}"
            offered.append(OfferedTool(name, server, tool.name, tool.description or "",
                                       _parameters(getattr(tool, "input_schema", None))))
    return offered


def _parameters(schema) -> dict:
    """A tool's input schema, or an empty object's where it gave none usable."""
    return dict(schema) if isinstance(schema, dict) and schema else dict(EMPTY_SCHEMA)


def _identifier(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_") or "server"
