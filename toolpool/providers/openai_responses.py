"""OpenAI Responses: ``function_call`` and ``custom_tool_call`` output items in,
``function_call_output`` and ``custom_tool_call_output`` items out.

The documented shapes (platform.openai.com/docs/api-reference/responses)::

    output item   {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                   "name": "read", "arguments": "{\\"path\\": \\"a\\"}", "status": "completed"}
    output item   {"type": "custom_tool_call", "id": "ctc_1", "call_id": "call_2",
                   "name": "apply_patch", "input": "*** Begin Patch\\n..."}
    input item    {"type": "function_call_output", "call_id": "call_1", "output": "..."}
    input item    {"type": "custom_tool_call_output", "call_id": "call_2", "output": "..."}
    tool          {"type": "function", "name": ..., "description": ...,
                   "parameters": {...}, "strict": false}

A call is answered by its ``call_id``, not by the item's ``id``. ``output`` is a string,
or a list of ``input_text`` / ``input_image`` / ``input_file`` parts. A custom tool
takes free text, not JSON: its call becomes a ToolCall whose one argument ``input`` is
that text (the shape of toolpool's ``apply_patch``, which is what Codex models call
so), and it is answered by a ``custom_tool_call_output`` (``custom_call_ids`` tells
which calls were custom).

OpenAI's own tools (``apply_patch``, ``shell``, ``local_shell``) have call items of
their own types, read and answered in ``openai_items.py``, and declarations of their
own (``{"type": "shell"}``), which ``tools_to_openai_responses`` gives for them.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from toolpool.models import JSONObject, TextBlock, ToolCall, ToolResult
from toolpool.profiles.declared import declaration, in_format
from toolpool.providers.openai_items import answers_as_item, item_call, item_output
from toolpool.providers.payload import as_list, as_object, dumped, json_arguments, required_text
from toolpool.registry import ToolSpec

_CALL_TYPES = frozenset({"function_call", "custom_tool_call"})


def calls_from_openai_responses(payload: Any) -> list[ToolCall]:
    """The function and custom tool calls of a Responses ``output`` list, or of a
    whole response, and the calls of OpenAI's own tools (``apply_patch_call``,
    ``shell_call``, ``local_shell_call``: ``openai_items.py``).

    Every other item (``reasoning``, ``message``, hosted tools such as
    ``web_search_call`` that OpenAI runs itself) is skipped.
    """
    where, payload = "output", dumped(payload)
    if isinstance(payload, Mapping):
        payload, where = payload.get("output"), "response.output"
    calls = []
    for i, raw in enumerate(as_list(payload, where)):
        item = as_object(raw, f"{where}[{i}]")
        kind = item.get("type")
        at = f"{where}[{i}]"
        if kind not in _CALL_TYPES:
            own = item_call(item, at)
            if own is not None:
                calls.append(own)
            continue
        if kind == "custom_tool_call":
            arguments, error = {"input": required_text(item, "input", at)}, None
        else:
            arguments, error = json_arguments(item.get("arguments", ""), f"{at}.arguments")
        calls.append(
            ToolCall(
                required_text(item, "call_id", at),
                required_text(item, "name", at),
                arguments,
                error,
            )
        )
    return calls


def custom_call_ids(payload: Any) -> frozenset[str]:
    """The call ids of the ``custom_tool_call`` items of a Responses ``output`` list or
    response; none for anything else (other formats, malformed input)."""
    payload = dumped(payload)
    if isinstance(payload, Mapping):
        payload = payload.get("output")
    if not isinstance(payload, list):
        return frozenset()
    items = [dumped(item) for item in payload]  # SDK objects in a plain list too
    return frozenset(
        str(item["call_id"])
        for item in items
        if isinstance(item, Mapping)
        and item.get("type") == "custom_tool_call"
        and "call_id" in item
    )


def results_to_openai_responses(
    results: Iterable[ToolResult], custom_calls: Collection[str] = ()
) -> list[JSONObject]:
    """One input item per result, in the order given (M1): ``function_call_output``,
    or ``custom_tool_call_output`` for the calls of ``custom_calls`` (the call ids of
    the custom tool calls among them: ``custom_call_ids`` of the model's output), or
    the output item of OpenAI's own tool the result is of (``apply_patch_call_output``,
    ``shell_call_output``, ``local_shell_call_output``: ``openai_items.item_output``).

    Text-only results give ``output`` as a string; a result with an image gives the
    list form, the image as an ``input_image`` with a base64 data URL. Errors are plain
    text: the API has no error flag.
    """
    return [
        item_output(result)
        if answers_as_item(result)
        else {
            "type": "custom_tool_call_output"
            if result.call_id in custom_calls
            else "function_call_output",
            "call_id": result.call_id,
            "output": _output(result),
        }
        for result in results
    ]


def _output(result: ToolResult) -> str | list[JSONObject]:
    if all(isinstance(block, TextBlock) for block in result.content):
        return result.text
    return [
        {"type": "input_text", "text": block.text}
        if isinstance(block, TextBlock)
        else {"type": "input_image", "image_url": f"data:{block.media_type};base64,{block.data}"}
        for block in result.content
    ]


def tools_to_openai_responses(specs: Iterable[ToolSpec]) -> list[JSONObject]:
    """Tool definitions for the ``tools`` parameter of a Responses request.

    ``strict`` is set to false on purpose: when it is left out, the Responses API
    normalises a schema into strict mode if it can, which makes every optional
    argument required. toolpool's own schema check (P5) is the judge.

    OpenAI's own tools are given as their declarations (``{"type": "shell"}``);
    another provider's own tools are left out.
    """
    return [
        dict(own)
        if (own := declaration(spec.name, "openai-responses")) is not None
        else {
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": copy.deepcopy(spec.schema),
            "strict": False,
        }
        for spec in specs
        if in_format(spec.name, "openai-responses")
    ]
