"""The codec: a message as one msgpack frame and back, and length-prefixed frames over
byte streams (the zygote's and the MCP bridges' pipes).

Frames carry ``{"t": <type>, ...fields}``; a struct inside a message (``CallContext``)
is a map of its fields, an enum its string. ``decode`` raises ``ProtocolError`` — and
only that — for anything it cannot read. Nothing else in toolpool parses frames.
"""

from __future__ import annotations

import struct
from typing import Any, BinaryIO, NamedTuple

import msgpack

from toolpool.models import Stage
from toolpool.protocol.fields import struct as reader_of
from toolpool.protocol.fields import wire_form
from toolpool.protocol.kinds import MAX_FRAME_BYTES, ProtocolError
from toolpool.protocol.messages import MESSAGE_CLASSES, STRUCTS, Message
from toolpool.protocol.wire import CallContext, Execute

# A message class's type name (``MessageType.value`` is a descriptor: slow per frame).
_KINDS: dict[type[Any], str] = {cls: cls.type.value for cls in MESSAGE_CLASSES.values()}
_EXECUTE = _KINDS[Execute]


def encode(message: Message) -> bytes:
    """One msgpack frame for ``message``."""
    kind = _KINDS[type(message)]
    body: dict[str, Any] = STRUCTS[kind].to_map(message, {"t": kind})
    frame: bytes = msgpack.packb(body, use_bin_type=True, default=wire_form)
    return frame


class EncodedExecute(NamedTuple):
    """An ``Execute`` as it goes to a worker: its frame, and the fields the pool reads."""

    frame: bytes
    call_id: str
    ticket: int
    context: CallContext

    @classmethod
    def of(cls, message: Execute) -> EncodedExecute:
        return cls(encode(message), message.call_id, message.ticket, message.context)


class ExecuteFrames:
    """``Execute`` frames of calls that share a context and limits (a session's calls
    of one tool): those two are encoded once, and each call's frame is its own fields
    packed after them — the same map ``encode`` makes, its entries in another order."""

    __slots__ = ("_shared", "context", "limits")

    def __init__(self, context: CallContext, limits: dict[str, Any]) -> None:
        self.context = context
        self.limits = limits
        shared = {"context": reader_of(CallContext).to_map(context), "limits": limits}
        # A map of 2 entries: its header is one byte (fixmap), which the frame's own
        # replaces.
        self._shared = msgpack.packb(shared, use_bin_type=True, default=wire_form)[1:]

    def execute(
        self,
        call_id: str,
        tool: str,
        arguments: dict[str, Any],
        stamps: dict[str, dict[str, Any]],
        ticket: int,
        stage: Stage = Stage.FULL,
    ) -> EncodedExecute:
        own: dict[str, Any] = {
            "t": _EXECUTE,
            "call_id": call_id,
            "tool": tool,
            "arguments": arguments,
            "stamps": stamps,
            "ticket": ticket,
        }
        if stage is not Stage.FULL:  # omitted at its default, as encode does
            own["stage"] = stage.value
        packed: bytes = msgpack.packb(own, use_bin_type=True, default=wire_form)
        # Both maps are fixmaps (under 16 entries): one header byte for all entries.
        frame = b"".join((bytes((0x80 | (len(own) + 2),)), self._shared, packed[1:]))
        return EncodedExecute(frame, call_id, ticket, self.context)


def decode(frame: bytes) -> Message:
    """The message in ``frame``; ProtocolError for anything else."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        body = msgpack.unpackb(frame)  # raw=False, strict_map_key=True: msgpack 1.x's defaults
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"not a msgpack frame: {exc}") from None
    if type(body) is not dict:
        raise ProtocolError(f"frame holds a {type(body).__name__}, not a map")
    kind = body.pop("t", None)
    reader = STRUCTS.get(kind) if type(kind) is str else None
    if reader is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    try:
        message: Message = reader.build(body, kind)
    except ProtocolError as exc:
        request_id = body.get("request_id")
        raise ProtocolError(str(exc), request_id if isinstance(request_id, str) else None) from None
    return message


# --- length-prefixed frames over pipes --------------------------------------------------

_LENGTH = struct.Struct("!I")

HEADER_BYTES = _LENGTH.size


def framed(message: Message) -> bytes:
    """``message`` as a length-prefixed frame, for byte streams (pipes)."""
    data = encode(message)
    return _LENGTH.pack(len(data)) + data


def frame_length(header: bytes) -> int:
    """The payload size announced by a frame header; ProtocolError when too big."""
    (size,) = _LENGTH.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    return int(size)


def write_frame(stream: BinaryIO, message: Message) -> None:
    """Write one length-prefixed frame and flush."""
    stream.write(framed(message))
    stream.flush()


def read_frame(stream: BinaryIO) -> Message | None:
    """Read one length-prefixed frame; None at end of stream. Works on unbuffered
    streams too (short reads are continued)."""
    head = _read_exactly(stream, HEADER_BYTES)
    if head is None:
        return None
    data = _read_exactly(stream, frame_length(head))
    if data is None:
        raise ProtocolError("stream ended inside a frame")
    return decode(data)


def _read_exactly(stream: BinaryIO, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            if data:
                raise ProtocolError("stream ended inside a frame")
            return None
        data += chunk
    return data
