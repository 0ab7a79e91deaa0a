"""LangChain: ``AIMessage.tool_calls`` in, ``ToolMessage``-shaped dicts out (SPEC E7).

The shapes (langchain_core.messages)::

    tool call       {"type": "tool_call", "id": "call_1", "name": "read",
                     "args": {"path": "a"}}            (``type`` may be left out)
    invalid call    {"type": "invalid_tool_call", "id": "call_2", "name": "read",
                     "args": "{\\"path\\": ", "error": "..."}
    AI message      {"type": "ai", "content": ..., "tool_calls": [...],
                     "invalid_tool_calls": [...]}      (``AIMessage.model_dump()``)
    tool message    {"type": "tool", "tool_call_id": "call_1", "name": "read",
                     "content": "...", "status": "success" | "error"}

``ToolMessage(**message)`` rebuilds each answer. A call LangChain could not parse (an
``invalid_tool_call``) is a call with an ``arguments_error``: an error result of its
own (P5). Tool definitions are OpenAI's function tools, which ``bind_tools`` takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from toolpool.models import ImageBlock, JSONObject, TextBlock, ToolCall, ToolResult
from toolpool.providers.openai_chat import tools_to_openai_chat
from toolpool.providers.payload import as_list, as_object, dumped, object_arguments, required_text

tools_to_langchain = tools_to_openai_chat


def calls_from_langchain(payload: Any) -> list[ToolCall]:
    """The calls of an ``AIMessage`` (its dump), or of a list of LangChain tool calls."""
    payload, where = dumped(payload), "tool_calls"
    invalid: list[Any] = []
    if isinstance(payload, Mapping):
        invalid = list(payload.get("invalid_tool_calls") or [])
        payload, where = payload.get("tool_calls") or [], "message.tool_calls"
    calls = []
    for i, raw in enumerate(as_list(payload, where)):
        item, at = as_object(raw, f"{where}[{i}]"), f"{where}[{i}]"
        if item.get("type") == "invalid_tool_call":
            invalid.append(item)
            continue
        if item.get("type", "tool_call") != "tool_call":
            raise ValueError(f"{at} is a {item.get('type')!r}, not a LangChain tool call")
        name = required_text(item, "name", at)
        calls.append(
            ToolCall(
                required_text(item, "id", at),
                name,
                object_arguments(item.get("args", {}), f"{at}.args"),
            )
        )
    for i, raw in enumerate(invalid):
        item, at = as_object(raw, f"invalid_tool_calls[{i}]"), f"invalid_tool_calls[{i}]"
        why = item.get("error") or "the arguments are not a JSON object"
        error = f"The arguments could not be read ({why}): {item.get('args')!r}"
        calls.append(
            ToolCall(required_text(item, "id", at), str(item.get("name") or ""), {}, error)
        )
    return calls


def results_to_langchain(results: Iterable[ToolResult]) -> list[JSONObject]:
    """One ``ToolMessage``-shaped dict per result, in the order given: text as a
    string, images as LangChain's standard image blocks, ``status`` "error" for an
    error result."""
    return [
        {
            "type": "tool",
            "tool_call_id": result.call_id,
            "name": result.tool_name,
            "content": message_content(result),
            "status": "error" if result.is_error else "success",
        }
        for result in results
    ]


def message_content(result: ToolResult) -> Any:
    """A ``ToolMessage``'s content: the text, or LangChain's standard text and image
    blocks when the result holds an image."""
    if all(isinstance(block, TextBlock) for block in result.content):
        return result.text
    return [
        {"type": "text", "text": block.text}
        if isinstance(block, TextBlock)
        else {"type": "image", "base64": block.data, "mime_type": block.media_type}
        for block in result.content
        if isinstance(block, TextBlock | ImageBlock)
    ]
