"""The tools of MCP servers, imported by the daemon.

- ``config.py``: an ``mcpServers`` file, and the proxy tools' names;
- ``bridges.py``: the daemon's side: one bridge process per server, started and
  stopped with the daemon;
- ``bridge.py``: the bridge process (``python -m toolpool.mcp.bridge``), the MCP
  session with one server;
- ``proxy.py`` and ``imported.py``: the proxy tools ``mcp__<server>__<tool>``, run
  through the same pipeline and workers as every other tool.

The other way round — ``toolpool mcp serve``, the daemon's tools to an MCP client —
is a client of the daemon: ``toolpool.client.mcp_serve``. The official MCP SDK (the
``mcp`` extra) is imported only by ``bridge.py`` and ``toolpool.client.mcp_serve``
(``require_sdk`` says when it is missing): the daemon, its workers and the proxy
tools do without it.
"""

from __future__ import annotations

import importlib
import importlib.metadata

from toolpool.errors import ToolpoolError

INSTALL_HINT = "pip install 'toolpool[mcp]'"


class McpUnavailable(ToolpoolError):
    """The MCP SDK (the ``mcp`` extra, version 2 or later) is not installed."""


def require_sdk() -> None:
    """Raise ``McpUnavailable`` naming the extra to install when the SDK is missing or
    older than version 2 (whose API toolpool uses)."""
    try:
        importlib.import_module("mcp.server.lowlevel")
        version = importlib.metadata.version("mcp")
    except ImportError as exc:
        raise McpUnavailable(f"the MCP SDK is not installed: {INSTALL_HINT} ({exc})") from None
    if int(version.split(".")[0]) < 2:
        raise McpUnavailable(
            f"the MCP SDK is version {version}, toolpool needs 2 or later: {INSTALL_HINT}"
        )
