"""toolpool and the Model Context Protocol, both ways.

- ``toolpool mcp serve`` (``serve.py``): a stdio MCP server that offers the daemon's
  tools to any MCP client; each connection is one toolpool session.
- Imported servers (``config.py``, ``bridges.py``, ``bridge.py``, ``proxy.py``): the
  daemon connects to the MCP servers of an ``mcpServers`` file through one bridge
  process each, and offers their tools as ``mcp__<server>__<tool>``, run through the
  same pipeline and workers as every other tool.

The official MCP SDK (the ``mcp`` extra) is imported only by ``serve.py`` and
``bridge.py``: the daemon, its workers and the proxy tools do without it.
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
