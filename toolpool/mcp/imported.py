"""The tools of the daemon's imported MCP servers: a tool module.

The daemon names the file describing them in ``$TOOLPOOL_MCP_TOOLS`` before it loads
this module, so the coordinator (validation, scheduling) and every worker
(execution) build the same ``TOOLS``. Without that variable the module offers
nothing. It is read once, at import: keep this module free of anything else, so
nothing imports it before the file exists.
"""

from __future__ import annotations

import os

from toolpool.mcp.proxy import TOOLS_FILE_ENV, load_tools

TOOLS = load_tools(os.environ.get(TOOLS_FILE_ENV))
