"""Anthropic Messages: ``tool_use`` blocks in, one user message of ``tool_result`` blocks out.

The documented shapes (docs.anthropic.com, "Tool use")::

    assistant content  [{"type": "text", "text": "..."},
                        {"type": "tool_use", "id": "toolu_1", "name": "read",
                         "input": {"path": "a"}}]
    user message       {"role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                     "content": [{"type": "text", "text": "..."}],
                                     "is_error": false}]}
    image block        {"type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "..."}}
    tool definition    {"name": ..., "description": ..., "input_schema": {...}}

Every ``tool_use`` of a turn must be answered in the *next* message, so all results go
into one user message.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from toolpool.models import JSONObject, TextBlock, ToolCall, ToolResult
from toolpool.profiles.declared import declaration, in_format
from toolpool.providers.payload import as_list, as_object, dumped, object_arguments, required_text
from toolpool.registry import ToolSpec


def calls_from_anthropic(payload: Any) -> list[ToolCall]:
    """The ``tool_use`` blocks of an assistant message (or of its ``content`` list).

    Text, thinking and server-tool blocks (``server_tool_use``: Anthropic runs those
    itself) are skipped. A message whose content is a plain string has no calls.
    """
    where, payload = "content", dumped(payload)
    if isinstance(payload, Mapping):
        payload, where = payload.get("content"), "message.content"
        if isinstance(payload, str):
            return []
    calls = []
    for i, raw in enumerate(as_list(payload, where)):
        block = as_object(raw, f"{where}[{i}]")
        if block.get("type") != "tool_use":
            continue
        at = f"{where}[{i}]"
        calls.append(
            ToolCall(
                required_text(block, "id", at),
                required_text(block, "name", at),
                object_arguments(block.get("input", {}), f"{at}.input"),
            )
        )
    return calls


def results_to_anthropic(results: Iterable[ToolResult]) -> JSONObject:
    """ONE user message holding a ``tool_result`` block per result, in the order given.

    Each block carries ``is_error``. Text that is empty or only whitespace is left out,
    because the API refuses such text blocks; a result with nothing left has no
    ``content`` key (the field is optional).
    """
    return {"role": "user", "content": [_tool_result(result) for result in results]}


def _tool_result(result: ToolResult) -> JSONObject:
    blocks: list[JSONObject] = [
        {"type": "text", "text": block.text}
        if isinstance(block, TextBlock)
        else {
            "type": "image",
            "source": {"type": "base64", "media_type": block.media_type, "data": block.data},
        }
        for block in result.content
        if not isinstance(block, TextBlock) or block.text.strip()
    ]
    out: JSONObject = {"type": "tool_result", "tool_use_id": result.call_id}
    if blocks:
        out["content"] = blocks
    out["is_error"] = result.is_error
    return out


def tools_to_anthropic(specs: Iterable[ToolSpec]) -> list[JSONObject]:
    """Tool definitions for the ``tools`` parameter of a Messages request: Anthropic's
    own tools as their declarations (``{"type": "bash_20250124", "name": "bash"}``),
    another provider's own tools left out."""
    return [
        dict(own)
        if (own := declaration(spec.name, "anthropic")) is not None
        else {
            "name": spec.name,
            "description": spec.description,
            "input_schema": copy.deepcopy(spec.schema),
        }
        for spec in specs
        if in_format(spec.name, "anthropic")
    ]
