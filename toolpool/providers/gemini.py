"""Google Gemini: ``functionCall`` parts in, ``functionResponse`` parts out.

The documented shapes (ai.google.dev/gemini-api/docs/function-calling and the
``Content``/``FunctionResponse`` API reference)::

    model content   {"role": "model",
                     "parts": [{"functionCall": {"id"?: "...", "name": "read",
                                                 "args": {"path": "a"}}}]}
    user content    {"role": "user",
                     "parts": [{"functionResponse": {"id"?: "...", "name": "read",
                                                     "response": {"output": "..."}}}]}
    declaration     {"name": ..., "description": ..., "parameters": {OpenAPI subset}}

Gemini pairs a response with its call by ``id`` when the model gave one, otherwise
by name and order; either way a response needs the function's *name*. ``Content.role``
is "user" or "model", and function responses go back as "user".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from toolpool.models import ImageBlock, JSONObject, ToolCall, ToolResult
from toolpool.profiles.declared import in_format
from toolpool.providers.gemini_schema import gemini_parameters
from toolpool.providers.payload import (
    as_list,
    as_object,
    dumped,
    object_arguments,
    required_text,
)
from toolpool.registry import ToolSpec

# Ids toolpool makes up for calls the model sent without one: the prefix and the
# call's position among the message's function calls (gemini-call-0, gemini-call-1…).
# Unique within a turn, which is what pairing needs, and the same on every parse of
# the same message. They are never sent back to Gemini, which did not issue them.
SYNTHETIC_ID_PREFIX = "gemini-call-"


def calls_from_gemini(payload: Any) -> list[ToolCall]:
    """The function calls of a ``generateContent`` response, a ``Content``, or its parts.

    A response must hold at most one candidate (none, as when the prompt was blocked,
    means no calls). Text, thought and other parts are skipped. Keys are read in
    camelCase (the API's JSON, an SDK object's dump by alias) or snake_case (the
    google-genai SDK's ``model_dump()``): ``functionCall`` or ``function_call``. Calls without an
    ``id`` get ``gemini-call-<n>``, n counting the message's function calls from 0.
    """
    parts, where = dumped(payload), "parts"
    if isinstance(parts, Mapping):
        parts, where = _parts_of(parts)
    calls: list[ToolCall] = []
    for i, raw in enumerate(as_list(parts, where)):
        part = as_object(raw, f"{where}[{i}]")
        key = "functionCall" if part.get("functionCall") is not None else "function_call"
        if part.get(key) is None:
            continue
        at = f"{where}[{i}].{key}"
        call = as_object(part[key], at)
        call_id = call.get("id") or f"{SYNTHETIC_ID_PREFIX}{len(calls)}"
        if not isinstance(call_id, str):
            raise ValueError(f"{at}.id must be a string, got {call_id!r}")
        arguments = object_arguments(call.get("args") or {}, f"{at}.args")
        calls.append(ToolCall(call_id, required_text(call, "name", at), arguments))
    return calls


def _parts_of(payload: Mapping[str, Any]) -> tuple[Any, str]:
    if "parts" in payload:
        return payload["parts"], "content.parts"
    if "candidates" not in payload:
        raise ValueError("a Gemini payload needs 'candidates' (a response) or 'parts' (a Content)")
    candidates = as_list(payload["candidates"], "response.candidates")
    if not candidates:
        return [], "response.candidates"
    if len(candidates) != 1:
        raise ValueError(
            f"the response has {len(candidates)} candidates; pass the content of the one "
            "the conversation continues with"
        )
    # A candidate stopped early (safety, recitation) may carry no content at all.
    content = as_object(candidates[0], "candidates[0]").get("content") or {}
    parts = as_object(content, "candidates[0].content").get("parts") or []
    return parts, "candidates[0].content.parts"


def results_to_gemini(results: Iterable[ToolResult]) -> JSONObject:
    """One ``Content`` with role "user" and a ``functionResponse`` part per result.

    ``response`` is ``{"output": text}``, or ``{"error": text}`` for an error result
    (the keys the API documents for a function's output and its failure). Images go
    in the response's own ``parts`` as ``inlineData`` (multimodal function responses,
    documented for Gemini 3 models; earlier ones may refuse them). ``id`` is sent only
    when the model issued it.
    """
    return {"role": "user", "parts": [{"functionResponse": _response(r)} for r in results]}


def _response(result: ToolResult) -> JSONObject:
    out: JSONObject = {}
    if not result.call_id.startswith(SYNTHETIC_ID_PREFIX):
        out["id"] = result.call_id
    out["name"] = result.tool_name
    out["response"] = {"error" if result.is_error else "output": result.text}
    images = [block for block in result.content if isinstance(block, ImageBlock)]
    if images:
        out["parts"] = [
            {"inlineData": {"mimeType": image.media_type, "data": image.data}} for image in images
        ]
    return out


def tools_to_gemini(specs: Iterable[ToolSpec]) -> list[JSONObject]:
    """Function declarations, for ``{"tools": [{"functionDeclarations": [...]}]}``.

    ``parameters`` (the OpenAPI subset every Gemini endpoint and model accepts) is
    preferred to the newer ``parametersJsonSchema``; the tool's schema is converted
    (see gemini_schema.py) and left out for a tool that takes no arguments.
    """
    declarations = []
    for spec in specs:
        if not in_format(spec.name, "gemini"):
            continue  # OpenAI's and Anthropic's own tools: no Gemini model calls them
        declaration: JSONObject = {"name": spec.name, "description": spec.description}
        try:
            parameters = gemini_parameters(spec.schema)
        except ValueError as exc:
            raise ValueError(f"tool {spec.name!r}: {exc}") from exc
        if parameters is not None:
            declaration["parameters"] = parameters
        declarations.append(declaration)
    return declarations
