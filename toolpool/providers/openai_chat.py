"""OpenAI Chat Completions: ``tool_calls`` in, ``role: tool`` messages out.

The documented shapes (platform.openai.com/docs/api-reference/chat)::

    assistant message  {"role": "assistant", "content": null,
                        "tool_calls": [{"id": "call_1", "type": "function",
                                        "function": {"name": "read",
                                                     "arguments": "{\\"path\\": \\"a\\"}"}}]}
    tool message       {"role": "tool", "tool_call_id": "call_1", "content": "..."}
    tool definition    {"type": "function",
                        "function": {"name": ..., "description": ..., "parameters": {...}}}

``arguments`` is a JSON *string* the model wrote and may be cut off or malformed; such
a call gets an ``arguments_error`` and ends at P5 as an error result of its own.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from toolpool.models import ImageBlock, JSONObject, TextBlock, ToolCall, ToolResult
from toolpool.profiles.declared import in_format
from toolpool.providers.payload import as_list, as_object, dumped, json_arguments, required_text
from toolpool.registry import ToolSpec


def calls_from_openai_chat(payload: Any) -> list[ToolCall]:
    """The tool calls of a Chat Completions assistant message.

    ``payload`` is the assistant message, a whole completion (``choices``, which must
    then hold exactly one choice), or the ``tool_calls`` list itself. A message
    without ``tool_calls`` (or with ``null``) has no calls.
    """
    tool_calls, where = dumped(payload), "tool_calls"
    if isinstance(tool_calls, Mapping):
        message, at = _message_of(tool_calls)
        tool_calls, where = message.get("tool_calls") or [], f"{at}.tool_calls"
    return [_call(item, f"{where}[{i}]") for i, item in enumerate(as_list(tool_calls, where))]


def _message_of(payload: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    if "choices" not in payload:
        return payload, "message"
    choices = as_list(payload["choices"], "completion.choices")
    if len(choices) != 1:
        raise ValueError(
            f"the completion has {len(choices)} choices; pass the message of the one "
            "the conversation continues with"
        )
    choice = as_object(choices[0], "choices[0]")
    return as_object(choice.get("message"), "choices[0].message"), "choices[0].message"


def _call(raw: object, where: str) -> ToolCall:
    item = as_object(raw, where)
    kind = item.get("type", "function")
    if kind != "function":
        # Custom (free-form) tool calls have no JSON arguments to validate; answering
        # them is not toolpool's to do, and dropping one would orphan its id.
        raise ValueError(f"{where} is a {kind!r} tool call; toolpool runs function tools only")
    function = as_object(item.get("function"), f"{where}.function")
    arguments, error = json_arguments(function.get("arguments", ""), f"{where}.function.arguments")
    name = required_text(function, "name", f"{where}.function")
    return ToolCall(required_text(item, "id", where), name, arguments, error)


def results_to_openai_chat(results: Iterable[ToolResult]) -> list[JSONObject]:
    """One ``role: tool`` message per result, in the order given (M1).

    The content is text: a tool message's content parts may only be text, so an image
    becomes a line saying it was left out (the Responses API can carry images; see
    ``results_to_openai_responses``). Errors are plain text, as the API has no error
    flag; toolpool's error messages already say what went wrong.
    """
    return [
        {"role": "tool", "tool_call_id": result.call_id, "content": _text(result)}
        for result in results
    ]


def _text(result: ToolResult) -> str:
    return "\n".join(
        block.text if isinstance(block, TextBlock) else _left_out(block) for block in result.content
    )


def _left_out(image: ImageBlock) -> str:
    return f"[{image.media_type} image not shown: Chat Completions tool messages carry text only]"


def tools_to_openai_chat(specs: Iterable[ToolSpec]) -> list[JSONObject]:
    """Tool definitions for the ``tools`` parameter of a Chat Completions request.

    ``strict`` is left out: it defaults to false here, so optional arguments stay
    optional and toolpool's own schema check (P5) stays the judge.
    """
    return [
        {
            "type": "function",
            "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": copy.deepcopy(spec.schema),
            },
        }
        for spec in specs
        if in_format(spec.name, "openai")  # the providers' own tools are not functions
    ]
