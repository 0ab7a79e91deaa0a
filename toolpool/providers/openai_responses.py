"""OpenAI Responses: ``function_call`` output items in, ``function_call_output`` items out.

The documented shapes (platform.openai.com/docs/api-reference/responses)::

    output item   {"type": "function_call", "id": "fc_1", "call_id": "call_1",
                   "name": "read", "arguments": "{\\"path\\": \\"a\\"}", "status": "completed"}
    input item    {"type": "function_call_output", "call_id": "call_1", "output": "..."}
    tool          {"type": "function", "name": ..., "description": ...,
                   "parameters": {...}, "strict": false}

A call is answered by its ``call_id``, not by the item's ``id``. ``output`` is a string,
or a list of ``input_text`` / ``input_image`` / ``input_file`` parts.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from toolpool.models import JSONObject, TextBlock, ToolCall, ToolResult
from toolpool.providers.payload import as_list, as_object, dumped, json_arguments, required_text
from toolpool.registry import ToolSpec


def calls_from_openai_responses(payload: Any) -> list[ToolCall]:
    """The function calls of a Responses ``output`` list, or of a whole response.

    Every other item (``reasoning``, ``message``, hosted tools such as
    ``web_search_call`` that OpenAI runs itself) is skipped.
    """
    where, payload = "output", dumped(payload)
    if isinstance(payload, Mapping):
        payload, where = payload.get("output"), "response.output"
    calls = []
    for i, raw in enumerate(as_list(payload, where)):
        item = as_object(raw, f"{where}[{i}]")
        if item.get("type") != "function_call":
            continue
        at = f"{where}[{i}]"
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


def results_to_openai_responses(results: Iterable[ToolResult]) -> list[JSONObject]:
    """One ``function_call_output`` input item per result, in the order given (M1).

    Text-only results give ``output`` as a string; a result with an image gives the
    list form, the image as an ``input_image`` with a base64 data URL. Errors are plain
    text: the API has no error flag.
    """
    return [
        {"type": "function_call_output", "call_id": result.call_id, "output": _output(result)}
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
    """
    return [
        {
            "type": "function",
            "name": spec.name,
            "description": spec.description,
            "parameters": copy.deepcopy(spec.schema),
            "strict": False,
        }
        for spec in specs
    ]
