"""Which MCP servers the daemon imports, and the names their tools get in toolpool.

The file has the shape MCP clients share (Claude Code, Claude Desktop, Cursor…)::

    {"mcpServers": {
        "files": {"command": "npx",
                  "args": ["-y", "@modelcontextprotocol/server-filesystem", "/srv"],
                  "env": {"DEBUG": "0"}},
        "search": {"url": "http://127.0.0.1:8000/mcp", "trusted": true}}}

A server is started over stdio (``command``, ``args``, ``env``, ``cwd``) or reached
over streamable HTTP (``url``). ``trusted`` is toolpool's own key: only a trusted
server's annotations are believed (``readOnlyHint`` makes a tool read-only and
concurrency-safe); any other server's tools are not read-only and run alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolpool.errors import ToolpoolError

PROXY_PREFIX = "mcp"
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_-]")
_MAX_NAME = 64  # what every model provider accepts (registry._TOOL_NAME)
_KEYS = ("command", "args", "env", "cwd", "url", "type", "trusted")
_TYPES = {"stdio": "command", "http": "url", "streamable-http": "url", "streamableHttp": "url"}


class McpConfigError(ToolpoolError):
    """An ``mcpServers`` file that cannot be used; the message says where."""


@dataclass(frozen=True, slots=True)
class McpServerConfig:
    """One server to import: started over stdio, or reached at ``url``."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    trusted: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "command": self.command,
            "args": list(self.args),
            "env": dict(self.env),
            "cwd": self.cwd,
            "url": self.url,
            "trusted": self.trusted,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> McpServerConfig:
        values = dict(data)
        values["args"] = tuple(values.get("args", ()))
        return cls(**values)


def load_mcp_servers(path: Path) -> list[McpServerConfig]:
    """The servers of an ``mcpServers`` JSON file, in file order."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise McpConfigError(f"{path}: {exc}") from None
    return parse_mcp_servers(data, str(path))


def parse_mcp_servers(data: Any, source: str = "mcpServers") -> list[McpServerConfig]:
    """Check an ``{"mcpServers": {name: {...}}}`` document; its servers."""
    if not isinstance(data, dict) or not isinstance(data.get("mcpServers"), dict):
        raise McpConfigError(f'{source}: expected {{"mcpServers": {{name: {{...}}}}}}')
    return [_server(name, entry, source) for name, entry in data["mcpServers"].items()]


def _server(name: str, entry: Any, source: str) -> McpServerConfig:
    where = f"{source}: server {name!r}"
    if not name or not isinstance(entry, dict):
        raise McpConfigError(f"{where}: expected a non-empty name and an object")
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown:
        raise McpConfigError(f"{where}: unknown keys {unknown} (known: {', '.join(_KEYS)})")
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise McpConfigError(f'{where}: give either "command" (stdio) or "url" (HTTP)')
    kind = entry.get("type")
    if kind is not None and kind not in _TYPES:
        raise McpConfigError(f"{where}: type {kind!r} is not supported ({', '.join(_TYPES)})")
    if kind is not None and _TYPES[kind] != ("command" if command is not None else "url"):
        raise McpConfigError(f"{where}: type {kind!r} does not fit its command/url")
    args, env = entry.get("args", []), entry.get("env", {})
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise McpConfigError(f"{where}: args must be a list of strings")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise McpConfigError(f"{where}: env must map names to strings")
    for key in ("command", "url", "cwd"):
        if entry.get(key) is not None and not isinstance(entry[key], str):
            raise McpConfigError(f"{where}: {key} must be a string")
    trusted = entry.get("trusted", False)
    if not isinstance(trusted, bool):
        raise McpConfigError(f"{where}: trusted must be true or false")
    return McpServerConfig(
        name=name,
        command=command,
        args=tuple(args),
        env=dict(env),
        cwd=entry.get("cwd"),
        url=url,
        trusted=trusted,
    )


def proxy_tool_name(server: str, tool: str) -> str:
    """``mcp__<server>__<tool>``, made a valid toolpool name: other characters become
    ``_``; a name over 64 characters is cut and ends with a hash of the whole, so
    two long names stay apart."""
    name = _NOT_ALLOWED.sub("_", f"{PROXY_PREFIX}__{server}__{tool}")
    if len(name) <= _MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: _MAX_NAME - 9]}_{digest}"
