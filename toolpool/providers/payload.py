"""Reading provider payloads: plain dicts that toolpool did not write, checked field by field.

Two kinds of trouble are kept apart here. A payload of the wrong *shape* (a call
without a name, a list where an object belongs) is the caller's bug: it raises
ValueError saying what is wrong and where (``message.tool_calls[1].function``). Call
*arguments* the model wrote that are not a JSON object are the model's mistake: they
become the call's ``arguments_error``, so that the pipeline answers that one call at
P5 with an error result the model can read, and the rest of the turn runs.

The provider SDKs' own objects (Anthropic's ``Message``, OpenAI's ``ChatCompletion``,
Gemini's ``GenerateContentResponse``, and every block, item and part in them) are
read through their JSON dump (SPEC E1), without importing any SDK: anything with a
``model_dump`` method is dumped where a JSON object or list is expected.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from toolpool.models import JSONObject, ToolCall

# How much of unparseable arguments an error message quotes: enough to see where the
# JSON went wrong, bounded because a cut-off call can be megabytes of file content.
ARGUMENTS_PREVIEW_CHARS = 200


def kind_of(value: object) -> str:
    """A value's JSON type name, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, Sequence):
        return "list"
    return type(value).__name__


_SCALARS = (str, int, float, bool, type(None), bytes)


def dumped(value: Any) -> Any:
    """An SDK object as its JSON dump (E1); anything else as it is.

    An object is taken for a pydantic model when it has a callable ``model_dump``
    (every provider SDK's types are): it is called with ``mode="json",
    by_alias=True, exclude_none=True``, which gives the API's own JSON (camelCase keys
    for Gemini) without the fields the model did not set.
    """
    if type(value) in _SCALARS or isinstance(value, Mapping | list | tuple | ToolCall):
        return value
    dump = getattr(value, "model_dump", None)
    if not callable(dump):
        return value
    try:
        return dump(mode="json", by_alias=True, exclude_none=True)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cannot read the {type(value).__name__} object: {exc}") from None


def plain(value: Any) -> Any:
    """``value`` as plain JSON data, every SDK object in it dumped (``dumped``) and
    ToolCalls as their ``to_dict()``: what the wire carries. Containers with nothing
    to convert come back as they are."""
    if type(value) in _SCALARS:
        return value
    if isinstance(value, ToolCall):
        return value.to_dict()
    value = dumped(value)
    if isinstance(value, Mapping):
        items = {key: plain(item) for key, item in value.items()}
        same = type(value) is dict and all(items[k] is value[k] for k in items)
        return value if same else items
    if isinstance(value, list | tuple):
        converted = [plain(item) for item in value]
        same = type(value) is list and all(a is b for a, b in zip(converted, value, strict=True))
        return value if same else converted
    return value


def as_object(value: object, where: str) -> Mapping[str, Any]:
    """``value`` (or an SDK object's dump) as a JSON object, or ValueError naming ``where``."""
    if isinstance(value, Mapping):
        return value
    value = dumped(value)
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object, got {kind_of(value)}")
    return value


def as_list(value: object, where: str) -> Sequence[Any]:
    """``value`` (or an SDK object's dump) as a JSON list, or ValueError naming ``where``."""
    if not isinstance(value, list | tuple):
        value = dumped(value)
    if isinstance(value, str | bytes) or not isinstance(value, Sequence):
        raise ValueError(f"{where} must be a list, got {kind_of(value)}")
    return value


def required_text(obj: Mapping[str, Any], key: str, where: str) -> str:
    """The non-empty string at ``obj[key]``, or ValueError naming ``where.key``."""
    if key not in obj:
        raise ValueError(f"{where} has no {key!r}")
    value = obj[key]
    if not isinstance(value, str) or not value:
        raise ValueError(f"{where}.{key} must be a non-empty string, got {value!r}")
    return value


def object_arguments(value: object, where: str) -> JSONObject:
    """Arguments a provider already decoded (Anthropic ``input``, Gemini ``args``)."""
    return dict(as_object(value, where))


def json_arguments(raw: object, where: str) -> tuple[JSONObject, str | None]:
    """Arguments the model wrote as a JSON string (the OpenAI APIs), decoded.

    Returns the arguments and ``None``, or ``{}`` and a message for the model when
    the text is not a JSON object. An empty string means no arguments. An object in
    place of the string is taken as it is: some OpenAI-compatible servers send one.
    """
    if isinstance(raw, Mapping):
        return dict(raw), None
    if not isinstance(raw, str):
        raise ValueError(f"{where} must be a JSON string, got {kind_of(raw)}")
    if not raw.strip():
        return {}, None
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        return {}, (
            f"arguments are not valid JSON ({exc.msg} at character {exc.pos}): {_preview(raw)}"
        )
    if not isinstance(parsed, dict):
        return {}, f"arguments must be a JSON object, got {kind_of(parsed)}: {_preview(raw)}"
    return parsed, None


def _preview(raw: str) -> str:
    if len(raw) <= ARGUMENTS_PREVIEW_CHARS:
        return repr(raw)
    return f"{raw[:ARGUMENTS_PREVIEW_CHARS]!r}… ({len(raw)} characters in all)"
