"""Model Context Protocol: tool definitions for ``tools/list`` and ``CallToolResult`` bodies.

The documented shapes (modelcontextprotocol.io/specification, "Tools")::

    tool     {"name": ..., "title": ..., "description": ..., "inputSchema": {...},
              "annotations": {"readOnlyHint": bool, "destructiveHint": bool,
                              "idempotentHint": bool, "openWorldHint": bool},
              "_meta": {...}}
    result   {"content": [{"type": "text", "text": "..."},
                          {"type": "image", "data": "<base64>", "mimeType": "image/png"}],
              "isError": bool}

The annotations are hints a client may show or act on (ask before a destructive
tool); toolpool still runs every call through its own pipeline and gate.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from toolpool.models import JSONObject, TextBlock, ToolResult
from toolpool.profiles.declared import in_format
from toolpool.registry import ToolSpec

CONCURRENCY_SAFE_META = "toolpool/concurrencySafe"


def tools_to_mcp(specs: Iterable[ToolSpec]) -> list[JSONObject]:
    """MCP tool definitions, with toolpool's capabilities as annotations.

    The capabilities are asked with empty arguments, as a definition has no call:

    - ``readOnlyHint`` is ``read_only({})``; ``destructiveHint`` is its negation (MCP
      only reads it when readOnlyHint is false, and defaults it to true: a tool that
      may write files or run commands is not known to be additive);
    - ``openWorldHint`` is whether the tool's permissions (T3) include "network", and
      is left out when the tool declares none;
    - ``idempotentHint`` is left out: toolpool does not know, and MCP's default
      (false) is the cautious answer;
    - ``_meta["toolpool/concurrencySafe"]`` is ``concurrency_safe({})`` (S1), which MCP
      has no hint for.

    The providers' own tools (OpenAI's ``shell``, Anthropic's ``bash``…) are left out.
    """
    definitions = []
    for spec in specs:
        if not in_format(spec.name, "mcp"):
            continue  # OpenAI's and Anthropic's own tools are their APIs', not MCP's
        read_only = spec.read_only({})
        annotations: JSONObject = {"readOnlyHint": read_only, "destructiveHint": not read_only}
        if spec.permissions:
            annotations["openWorldHint"] = "network" in spec.permissions
        definitions.append(
            {
                "name": spec.name,
                "title": spec.label(),
                "description": spec.description,
                "inputSchema": copy.deepcopy(spec.schema),
                "annotations": annotations,
                "_meta": {CONCURRENCY_SAFE_META: spec.concurrency_safe({})},
            }
        )
    return definitions


def results_to_mcp(results: Iterable[ToolResult]) -> list[JSONObject]:
    """One ``CallToolResult`` per result, in the order given.

    A ``tools/call`` request carries no call id of its own (the JSON-RPC request id
    belongs to the transport), so the caller puts each result in the response to
    its request.
    """
    return [
        {
            "content": [
                {"type": "text", "text": block.text}
                if isinstance(block, TextBlock)
                else {"type": "image", "data": block.data, "mimeType": block.media_type}
                for block in result.content
            ],
            "isError": result.is_error,
        }
        for result in results
    ]
