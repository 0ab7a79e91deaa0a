"""The data model: tool calls, results, content blocks and the events of a turn.

Everything here is a frozen dataclass that turns into a plain dict (``to_dict``) and
back (``from_dict``), so it can cross ZeroMQ as msgpack. This module depends on
nothing else in toolpool but ``frozen`` (how ``from_dict`` makes its instances).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Literal, TypeAlias

from toolpool.frozen import maker

JSONObject: TypeAlias = dict[str, Any]


# --- content blocks ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TextBlock:
    """A piece of text in a result."""

    text: str

    def to_dict(self) -> JSONObject:
        return {"type": "text", "text": self.text}


@dataclass(frozen=True, slots=True)
class ImageBlock:
    """An image in a result: base64 data and its media type (``image/png`` …)."""

    data: str
    media_type: str

    def to_dict(self) -> JSONObject:
        return {"type": "image", "data": self.data, "media_type": self.media_type}


ContentBlock: TypeAlias = TextBlock | ImageBlock


def content_block_from_dict(data: Mapping[str, Any]) -> ContentBlock:
    """Rebuild a content block from its dict form; raises ValueError on an unknown type."""
    kind = data.get("type")
    if kind == "text":
        return _text_block(str(data["text"]))
    if kind == "image":
        return ImageBlock(data=str(data["data"]), media_type=str(data["media_type"]))
    raise ValueError(f"unknown content block type {kind!r}")


# --- calls and results ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call the model asked for: its id, the tool's name and the arguments.

    ``arguments_error`` is set when the model's arguments could not even be parsed
    (an OpenAI call whose JSON is cut off…): the call then ends at P5 with that
    message, like any other invalid arguments, instead of failing the turn.
    """

    id: str
    name: str
    arguments: JSONObject = field(default_factory=dict)
    arguments_error: str | None = None

    def to_dict(self) -> JSONObject:
        data: JSONObject = {"id": self.id, "name": self.name, "arguments": self.arguments}
        if self.arguments_error is not None:
            data["arguments_error"] = self.arguments_error
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        error = data.get("arguments_error")
        return cls(
            id=str(data["id"]),
            name=str(data["name"]),
            arguments=data.get("arguments", {}),
            arguments_error=None if error is None else str(error),
        )


class ErrorCode(StrEnum):
    """Why a result is an error. The breaker decides from this code (see breaker.py)."""

    CANCELLED = "cancelled"  # P1, S5: the run was aborted
    INTERRUPTED = "interrupted"  # S4: cancelled in flight by a queued user message
    SKIPPED = "skipped"  # S4: never started because of a queued user message
    BREAKER_OPEN = "breaker_open"  # P2
    TOOL_NOT_FOUND = "tool_not_found"  # P4
    INVALID_ARGUMENTS = "invalid_arguments"  # P5
    VALIDATION_FAILED = "validation_failed"  # P6
    PREVIEW_FAILED = "preview_failed"  # P7: the tool's own preview raised
    DENIED = "denied"  # P8
    EXECUTION_FAILED = "execution_failed"  # P10
    LIMIT_EXCEEDED = "limit_exceeded"  # D3: wall time, CPU, memory, file or output size
    WORKER_LOST = "worker_lost"  # D2: the worker died or hung mid-call
    SANDBOX_FAILED = "sandbox_failed"  # X1: the confinement could not be set up


# By value, for reading a result: an enum's call costs more than the rest of the read;
# and the other way, for writing one (an enum member's ``.value`` is a descriptor).
_ERROR_CODES: dict[str, ErrorCode] = {code.value: code for code in ErrorCode}
_CODE_VALUES: dict[ErrorCode, str] = {code: code.value for code in ErrorCode}


class Stage(StrEnum):
    """Which of a call's tool code an executor runs (SPEC P6, P7, P10, L10)."""

    FULL = "full"  # validate, preview, execute: no gate or middleware between them
    PREPARE = "prepare"  # validate and preview only: a gate decides next
    EXECUTE = "execute"  # execute only: validate and preview ran before the gate


@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one call, error or not, as the model will see it.

    ``details`` carries machine-readable extras (coerced fields, validation code,
    resource usage…) that clients may show; the model sees ``content``.
    """

    call_id: str
    tool_name: str
    content: tuple[ContentBlock, ...]
    is_error: bool = False
    error_code: ErrorCode | None = None
    details: JSONObject = field(default_factory=dict)

    @classmethod
    def error(
        cls,
        call: ToolCall,
        code: ErrorCode,
        message: str,
        details: JSONObject | None = None,
    ) -> ToolResult:
        return cls(
            call_id=call.id,
            tool_name=call.name,
            content=(TextBlock(message),),
            is_error=True,
            error_code=code,
            details=details or {},
        )

    @property
    def text(self) -> str:
        """All text blocks joined by newlines (images left out)."""
        return "\n".join(b.text for b in self.content if isinstance(b, TextBlock))

    def to_dict(self) -> JSONObject:
        content = self.content
        # Nearly every result is one text block: written without a call per block.
        first = content[0] if len(content) == 1 else None
        return {
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "content": (
                [{"type": "text", "text": first.text}]
                if type(first) is TextBlock
                else [b.to_dict() for b in content]
            ),
            "is_error": self.is_error,
            "error_code": None if self.error_code is None else _CODE_VALUES[self.error_code],
            "details": self.details,
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], more_details: JSONObject | None = None
    ) -> ToolResult:
        """The result from its dict form; ``more_details`` are added to its details
        (the reader's own: where it ran, its usage)."""
        code = data.get("error_code")
        content = data.get("content", ())
        # Nearly every result is one text block: read without a call per block.
        first = content[0] if type(content) is list and len(content) == 1 else None
        if type(first) is dict and first.get("type") == "text":
            blocks: tuple[ContentBlock, ...] = (_text_block(str(first["text"])),)
        else:
            blocks = tuple([content_block_from_dict(b) for b in content])
        details = data.get("details")
        if more_details:
            details = {**details, **more_details} if details else more_details
        return (_tool_result if cls is ToolResult else cls)(
            str(data["call_id"]),
            str(data["tool_name"]),
            blocks,
            bool(data.get("is_error", False)),
            None if code is None else _ERROR_CODES.get(code) or ErrorCode(code),
            dict(details) if details else {},
        )


@dataclass(frozen=True, slots=True)
class ToolMessage:
    """M1: a result as one tool-role message for the model's context.

    Plain text results carry a string; rich results (images, several blocks) carry
    the content blocks.
    """

    tool_call_id: str
    content: str | tuple[ContentBlock, ...]
    is_error: bool = False
    role: Literal["tool"] = "tool"

    @classmethod
    def from_result(cls, result: ToolResult) -> ToolMessage:
        blocks = result.content
        make = _tool_message if cls is ToolMessage else cls
        if len(blocks) == 1 and isinstance(blocks[0], TextBlock):
            return make(result.call_id, blocks[0].text, result.is_error, "tool")
        if not blocks:
            return make(result.call_id, "", result.is_error, "tool")
        return make(result.call_id, blocks, result.is_error, "tool")

    def to_dict(self) -> JSONObject:
        content: Any = (
            self.content if isinstance(self.content, str) else [b.to_dict() for b in self.content]
        )
        return {
            "role": self.role,
            "tool_call_id": self.tool_call_id,
            "content": content,
            "is_error": self.is_error,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolMessage:
        raw = data["content"]
        content: str | tuple[ContentBlock, ...] = (
            raw if isinstance(raw, str) else tuple(content_block_from_dict(b) for b in raw)
        )
        return cls(str(data["tool_call_id"]), content, bool(data.get("is_error", False)))


# --- events -----------------------------------------------------------------------


class EventType(StrEnum):
    TOOL_START = "tool_start"
    TOOL_UPDATE = "tool_update"
    TOOL_END = "tool_end"
    MESSAGE_START = "message_start"
    MESSAGE_END = "message_end"
    TURN_END = "turn_end"


# Their names in dicts, read once (an enum member's ``.value`` is a descriptor).
_TOOL_START = EventType.TOOL_START.value
_TOOL_UPDATE = EventType.TOOL_UPDATE.value
_TOOL_END = EventType.TOOL_END.value


class UpdateKind(StrEnum):
    PREVIEW = "preview"  # P7: computed before the gate, e.g. a unified diff
    PROGRESS = "progress"  # P9: reported by the running tool


@dataclass(frozen=True, slots=True)
class ToolStart:
    """P3: a call entered the pipeline. ``arguments`` are the model's, uncoerced."""

    type: ClassVar[EventType] = EventType.TOOL_START
    call_id: str
    tool_name: str
    arguments: JSONObject
    label: str
    activity: str | None = None

    def to_dict(self) -> JSONObject:
        return {
            "type": _TOOL_START,
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "arguments": self.arguments,
            "label": self.label,
            "activity": self.activity,
        }


@dataclass(frozen=True, slots=True)
class ToolUpdate:
    """P7/P9: a preview or a progress report of a call that has started."""

    type: ClassVar[EventType] = EventType.TOOL_UPDATE
    call_id: str
    tool_name: str
    kind: UpdateKind
    data: Any

    def to_dict(self) -> JSONObject:
        return {
            "type": _TOOL_UPDATE,
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "kind": self.kind.value,
            "data": self.data,
        }


@dataclass(frozen=True, slots=True)
class ToolEnd:
    """P11: a call is over; exactly one per ToolStart (P12)."""

    type: ClassVar[EventType] = EventType.TOOL_END
    call_id: str
    tool_name: str
    result: ToolResult

    def to_dict(self) -> JSONObject:
        return {
            "type": _TOOL_END,
            "call_id": self.call_id,
            "tool_name": self.tool_name,
            "result": self.result.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolEnd:
        """The event from its dict form (its ``type`` is not looked at)."""
        return (_tool_end if cls is ToolEnd else cls)(
            str(data["call_id"]), str(data["tool_name"]), ToolResult.from_dict(data["result"])
        )


@dataclass(frozen=True, slots=True)
class MessageStart:
    """M2: a tool-role message is about to be added to the model's context."""

    type: ClassVar[EventType] = EventType.MESSAGE_START
    message: ToolMessage

    def to_dict(self) -> JSONObject:
        return {"type": self.type.value, "message": self.message.to_dict()}


@dataclass(frozen=True, slots=True)
class MessageEnd:
    """M2: the tool-role message is complete."""

    type: ClassVar[EventType] = EventType.MESSAGE_END
    message: ToolMessage

    def to_dict(self) -> JSONObject:
        return {"type": self.type.value, "message": self.message.to_dict()}


@dataclass(frozen=True, slots=True)
class TurnEnd:
    """M2: the turn is over; carries every result in the turn's call order (S6)."""

    type: ClassVar[EventType] = EventType.TURN_END
    results: tuple[ToolResult, ...]

    def to_dict(self) -> JSONObject:
        return {"type": self.type.value, "results": [r.to_dict() for r in self.results]}


Event: TypeAlias = ToolStart | ToolUpdate | ToolEnd | MessageStart | MessageEnd | TurnEnd


# The classes read off the wire, made from every field's value (frozen.maker): most of
# what reading a small event costs is a frozen dataclass's __init__.
_text_block = maker(TextBlock)
_tool_result = maker(ToolResult)
_tool_message = maker(ToolMessage)
_tool_start = maker(ToolStart)
_tool_end = maker(ToolEnd)
# The events a call's life emits, made the same way (every field given, in order).
new_tool_start = _tool_start
new_tool_end = _tool_end
new_tool_result = _tool_result


def event_from_dict(data: Mapping[str, Any]) -> Event:
    """Rebuild an event from its dict form; raises ValueError on an unknown type."""
    kind = data.get("type")
    read = _EVENT_READERS.get(kind) if isinstance(kind, str) else None
    if read is None:
        raise ValueError(f"unknown event type {kind!r}")
    return read(data)


def _read_tool_start(data: Mapping[str, Any]) -> ToolStart:
    return _tool_start(
        str(data["call_id"]),
        str(data["tool_name"]),
        dict(data["arguments"]),
        str(data["label"]),
        data.get("activity"),
    )


def _tool_update(data: Mapping[str, Any]) -> ToolUpdate:
    return ToolUpdate(
        str(data["call_id"]), str(data["tool_name"]), UpdateKind(data["kind"]), data.get("data")
    )


def _message(data: Mapping[str, Any]) -> ToolMessage:
    return ToolMessage.from_dict(data["message"])


# By the type's string (an enum's lookup by value costs more than the rest of a read).
_EVENT_READERS: dict[str, Callable[[Mapping[str, Any]], Event]] = {
    EventType.TOOL_START.value: _read_tool_start,
    EventType.TOOL_UPDATE.value: _tool_update,
    EventType.TOOL_END.value: ToolEnd.from_dict,
    EventType.MESSAGE_START.value: lambda data: MessageStart(_message(data)),
    EventType.MESSAGE_END.value: lambda data: MessageEnd(_message(data)),
    EventType.TURN_END.value: lambda data: TurnEnd(
        tuple([ToolResult.from_dict(r) for r in data["results"]])
    ),
}
