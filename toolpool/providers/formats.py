"""The provider table, and reading calls whose format is not said.

``PROVIDERS`` maps a provider name to its three conversions, so that a daemon or the
CLI (``toolpool tools --format gemini``) picks one by name. ``parse_tool_calls``
reads calls in any supported format, detecting it when not told; detection either
finds exactly one format or raises, it never guesses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from toolpool.models import JSONObject, ToolCall, ToolResult
from toolpool.profiles.declared import ITEM_TOOLS
from toolpool.providers.anthropic import (
    calls_from_anthropic,
    results_to_anthropic,
    tools_to_anthropic,
)
from toolpool.providers.gemini import calls_from_gemini, results_to_gemini, tools_to_gemini
from toolpool.providers.langchain import (
    calls_from_langchain,
    results_to_langchain,
    tools_to_langchain,
)
from toolpool.providers.mcp import results_to_mcp, tools_to_mcp
from toolpool.providers.openai_chat import (
    calls_from_openai_chat,
    results_to_openai_chat,
    tools_to_openai_chat,
)
from toolpool.providers.openai_responses import (
    calls_from_openai_responses,
    results_to_openai_responses,
    tools_to_openai_responses,
)
from toolpool.providers.payload import as_list, as_object, dumped, kind_of, object_arguments
from toolpool.registry import ToolSpec


@dataclass(frozen=True, slots=True)
class Provider:
    """One provider's formats: tool definitions out, results out, calls in.

    ``parse_calls`` is None for MCP: a ``tools/call`` request has no call id of its
    own to pair a result with.
    """

    name: str
    tools: Callable[[Iterable[ToolSpec]], list[JSONObject]]
    results: Callable[[Iterable[ToolResult]], list[JSONObject] | JSONObject]
    parse_calls: Callable[[Any], list[ToolCall]] | None


PROVIDERS: Mapping[str, Provider] = MappingProxyType(
    {
        "openai": Provider(
            "openai", tools_to_openai_chat, results_to_openai_chat, calls_from_openai_chat
        ),
        "openai-responses": Provider(
            "openai-responses",
            tools_to_openai_responses,
            results_to_openai_responses,
            calls_from_openai_responses,
        ),
        "anthropic": Provider(
            "anthropic", tools_to_anthropic, results_to_anthropic, calls_from_anthropic
        ),
        "gemini": Provider("gemini", tools_to_gemini, results_to_gemini, calls_from_gemini),
        "langchain": Provider(
            "langchain", tools_to_langchain, results_to_langchain, calls_from_langchain
        ),
        "mcp": Provider("mcp", tools_to_mcp, results_to_mcp, None),
    }
)


def provider(name: str) -> Provider:
    """The provider called ``name``; ValueError listing the known names otherwise."""
    try:
        return PROVIDERS[name]
    except KeyError:
        raise ValueError(f"unknown provider {name!r}; known: {', '.join(PROVIDERS)}") from None


def definitions(specs: Iterable[ToolSpec], provider_name: str) -> list[JSONObject]:
    """The tools' definitions in ``provider_name``'s format."""
    return provider(provider_name).tools(specs)


def results_to_provider(
    results: Iterable[ToolResult], provider_name: str
) -> list[JSONObject] | JSONObject:
    """A turn's results (in call order) as ``provider_name`` wants them back."""
    return provider(provider_name).results(results)


# The keys of a call in toolpool's own shape (ToolCall.to_dict()); any other key is
# not understood, and refused rather than dropped (E1).
TOOLPOOL_CALL_KEYS = frozenset({"id", "name", "arguments", "arguments_error"})
_PLAIN_CALL_KEYS = frozenset({"id", "name", "arguments"})


def calls_from_toolpool(payload: Any) -> list[ToolCall]:
    """Calls already in toolpool's shape: a ToolCall, or a list of ToolCalls or their
    ``to_dict()`` form (``{"id", "name", "arguments", "arguments_error"?}``). A dict
    with any other key is refused (``input`` is not ``arguments``)."""
    if isinstance(payload, ToolCall):
        return [payload]
    return [_toolpool_call(item, f"calls[{i}]") for i, item in enumerate(as_list(payload, "calls"))]


def _toolpool_call(raw: object, where: str) -> ToolCall:
    if isinstance(raw, ToolCall):
        return raw
    if type(raw) is dict and raw.keys() == _PLAIN_CALL_KEYS:
        # The shape every client library sends: checked in one look, not five steps.
        call_id, name, arguments = raw["id"], raw["name"], raw["arguments"]
        plain = type(call_id) is str and type(name) is str and type(arguments) is dict
        if plain and call_id and name:
            return ToolCall(call_id, name, dict(arguments))
    item = as_object(raw, where)
    unknown = item.keys() - TOOLPOOL_CALL_KEYS
    if unknown:
        raise ValueError(f"{where} {_not_a_toolpool_call(unknown)}")
    for key in ("id", "name"):
        if not isinstance(item.get(key), str) or not item[key]:
            raise ValueError(f"{where}.{key} must be a non-empty string, got {item.get(key)!r}")
    error = item.get("arguments_error")
    if error is not None and not isinstance(error, str):
        raise ValueError(f"{where}.arguments_error must be a string, got {kind_of(error)}")
    arguments = object_arguments(item.get("arguments", {}), f"{where}.arguments")
    return ToolCall(item["id"], item["name"], arguments, error)


_CALL_PARSERS: Mapping[str, Callable[[Any], list[ToolCall]]] = MappingProxyType(
    {
        "toolpool": calls_from_toolpool,
        **{name: p.parse_calls for name, p in PROVIDERS.items() if p.parse_calls is not None},
    }
)
CALL_FORMATS: tuple[str, ...] = tuple(_CALL_PARSERS)


def _keys(keys: Iterable[str]) -> str:
    """``key 'a'`` or ``keys 'a', 'b'``."""
    names = sorted(keys)
    return f"key{'s' if len(names) > 1 else ''} {', '.join(repr(k) for k in names)}"


def _not_a_toolpool_call(unknown: Iterable[str]) -> str:
    """What to say of a call-like dict with keys toolpool's calls do not have."""
    return (
        f"matches no call format ({', '.join(CALL_FORMATS)}): {_keys(unknown)} not "
        "understood; a toolpool call has only 'id', 'name', 'arguments' and "
        "'arguments_error', and model output is read whole (the message, the response, "
        "the content/output/parts list) or with its format named"
    )


# Keys that only one format's messages or responses have.
_MESSAGE_KEYS = {
    "choices": "openai",
    "tool_calls": "openai",
    "output": "openai-responses",
    "candidates": "gemini",
    "parts": "gemini",
}


def parse_tool_calls(payload: Any, provider: str | None = None) -> list[ToolCall]:
    """The tool calls in ``payload``, as toolpool ToolCalls.

    ``provider`` is one of ``CALL_FORMATS`` ("toolpool", "openai",
    "openai-responses", "anthropic", "gemini"); when None the format is detected
    (see ``detect_call_format``). Malformed input raises ValueError saying what is
    wrong where; arguments the model wrote that are not a JSON object do not raise,
    they become that call's ``arguments_error`` (an error result at P5).

    ``payload`` may be a provider SDK's own object (a ``Message``, a
    ``ChatCompletion``, a ``GenerateContentResponse``…) or a list of them
    (``message.content``): each is read through its ``model_dump`` (E1).
    """
    payload = _dumped(payload)
    if provider is None:
        detected = _detected(payload)
        if detected is None:
            return []
        provider = detected
    try:
        parse = _CALL_PARSERS[provider]
    except KeyError:
        raise ValueError(f"no call format {provider!r}; known: {', '.join(CALL_FORMATS)}") from None
    return parse(payload)


def detect_call_format(payload: Any) -> str | None:
    """Which call format ``payload`` is in; None when it holds no call in any format.

    A dict is recognised by keys only one format's messages have (``tool_calls`` or
    ``choices``: OpenAI Chat; ``output``: Responses; ``candidates`` or ``parts``:
    Gemini; a ``content`` list: Anthropic). A list by its call items (``tool_use``,
    ``function_call``, ``{"type": "function", "function": …}``, ``functionCall``
    parts, ToolCalls), snake_case Gemini parts (``function_call``) included. Keys or
    items of two formats raise ValueError, and so does a dict that matches no format
    (the error names the formats and the keys not understood). SDK objects are read
    through their dump (E1).
    """
    return _detected(_dumped(payload))


def _detected(payload: Any) -> str | None:
    if isinstance(payload, ToolCall):
        return "toolpool"
    if isinstance(payload, Mapping):
        return _message_format(payload)
    if isinstance(payload, Sequence) and not isinstance(payload, str | bytes):
        return _list_format(payload)
    raise ValueError(f"tool calls come in a message (a dict) or a list, not a {kind_of(payload)}")


def _dumped(payload: Any) -> Any:
    """An SDK object's dump, and a list's SDK objects dumped (once, not at every look)."""
    if type(payload) is list and all(type(item) is dict for item in payload):
        return payload  # plain data, as a client sends it: nothing to dump
    payload = dumped(payload)
    if isinstance(payload, list | tuple) and not all(
        isinstance(item, Mapping | ToolCall) for item in payload
    ):
        return [dumped(item) for item in payload]
    return payload


# The keys of an assistant message that holds no call: OpenAI Chat's, when a dump
# left out its null ``content`` and ``tool_calls`` (exclude_none).
_NO_CALL_MESSAGE_KEYS = frozenset({"role", "refusal", "annotations", "audio"})


def _message_format(payload: Mapping[str, Any]) -> str | None:
    if _is_langchain_message(payload):
        return "langchain"
    matched = {key: fmt for key, fmt in _MESSAGE_KEYS.items() if key in payload}
    formats = sorted(set(matched.values()))
    if len(formats) > 1:
        raise ValueError(
            f"ambiguous payload: its keys {sorted(matched)} belong to {' and '.join(formats)}; "
            "pass provider="
        )
    if formats:
        return formats[0]
    content = payload.get("content")
    if isinstance(content, list | tuple):
        return "anthropic"
    if "content" in payload and (content is None or isinstance(content, str)):
        return None  # a message of text only, in either OpenAI's or Anthropic's shape
    if "role" in payload and payload.keys() <= _NO_CALL_MESSAGE_KEYS:
        return None
    if not payload:
        raise ValueError(
            f"an empty object matches no call format ({', '.join(CALL_FORMATS)}): expected an "
            "assistant message, a model response or a list of calls"
        )
    unknown = payload.keys() - {"role"} or payload.keys()
    alone = " (one call or block alone goes in a list)" if _CALL_LIKE_KEYS & payload.keys() else ""
    raise ValueError(
        f"cannot tell the format of an object with keys {sorted(payload)}: it matches no "
        f"call format ({', '.join(CALL_FORMATS)}), {_keys(unknown)} not understood; "
        f"expected an assistant message, a model response or a list of calls{alone}"
    )


def _is_langchain_message(payload: Mapping[str, Any]) -> bool:
    """An ``AIMessage``'s dump, or a message whose calls are LangChain's (``args``)."""
    if payload.get("type") == "ai" and "tool_calls" in payload:
        return True
    calls = payload.get("tool_calls")
    return (
        isinstance(calls, list | tuple)
        and bool(calls)
        and all(
            isinstance(c, Mapping) and ("args" in c or c.get("type") == "tool_call") for c in calls
        )
    )


def _list_format(items: Sequence[Any]) -> str | None:
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        fmt = _item_format(item, i)
        if fmt is not None:
            first_seen.setdefault(fmt, i)
    if len(first_seen) > 1:
        seen = ", ".join(f"item {i} is {fmt}" for fmt, i in first_seen.items())
        raise ValueError(f"the list mixes call formats ({seen}); pass provider=")
    return next(iter(first_seen), None)


def _item_format(item: Any, index: int) -> str | None:
    if isinstance(item, ToolCall):
        return "toolpool"
    block = as_object(item, f"item {index}")
    kind = block.get("type")
    if kind == "tool_use":
        return "anthropic"
    if kind in ("function_call", "custom_tool_call") or kind in ITEM_TOOLS:
        return "openai-responses"  # OpenAI's own tools' calls included (F15, F16)
    if kind in ("tool_call", "invalid_tool_call"):
        return "langchain"
    if "function" in block or (kind == "custom" and "custom" in block):
        return "openai"  # a custom (free-form) call is refused by its parser, by name
    if kind is None and ("functionCall" in block or "function_call" in block):
        return "gemini"  # a Part, in camelCase or snake_case
    if kind is None and {"name", "args"} <= block.keys() and "arguments" not in block:
        return "langchain"  # LangChain's ToolCall, whose ``type`` may be left out
    if kind is None and _CALL_LIKE_KEYS & block.keys():
        unknown = block.keys() - TOOLPOOL_CALL_KEYS
        if unknown:
            raise ValueError(f"item {index} {_not_a_toolpool_call(unknown)}")
        return "toolpool"
    if kind is None or kind in _NO_CALL_TYPES:
        return None  # text, reasoning, a hosted tool's item: no call
    # A type no format has: refused, as the same item inside a message is, never
    # skipped (a call of a format toolpool does not read must not run nothing).
    raise ValueError(
        f"item {index} has type {kind!r}, which matches no call format "
        f"({', '.join(CALL_FORMATS)}) and is no known text or hosted-tool item"
    )


# The item types of the formats' lists that hold no call toolpool runs: content
# blocks, Responses output items, hosted tools' calls and results, LangChain blocks.
_NO_CALL_TYPES = frozenset(
    {
        "text", "thinking", "redacted_thinking", "image", "document", "search_result",
        "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
        "code_execution_tool_result", "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result", "mcp_tool_use", "mcp_tool_result",
        "container_upload", "tool_result", "message", "reasoning", "output_text",
        "input_text", "refusal", "web_search_call", "file_search_call", "computer_call",
        "image_generation_call", "code_interpreter_call", "mcp_call", "mcp_list_tools",
        "mcp_approval_request", "compaction", "function_call_output",
        "custom_tool_call_output", "apply_patch_call_output", "shell_call_output",
        "local_shell_call_output",
        "server_tool_call", "server_tool_result", "file", "audio", "video",
        "text-plain", "non_standard", "citation",
    }
)  # fmt: skip


# An item without a ``type`` that has one of these keys is meant as a call in
# toolpool's shape: it is read as one, or refused, never skipped.
_CALL_LIKE_KEYS = frozenset({"id", "name", "arguments", "input", "args"})
