"""The wire format: every message that crosses a process boundary, and its codec.

One enum of message types; one frozen dataclass per type, whose docstring says who
sends it and what answers it. ``encode`` turns a message into one msgpack frame;
``decode`` turns bytes back, raising ``ProtocolError`` — and only that — for
anything it cannot read. Nothing else in toolpool parses frames.

Frames carry ``{"t": <type>, ...fields}``. The protocol version is checked once, at
the handshake (``Ready``); a peer speaking another version is refused there.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, BinaryIO, ClassVar, TypeAlias

import msgpack

from toolpool.errors import ToolpoolError

PROTOCOL_VERSION = 1
# Large enough for any result toolpool lets through (see Limits.output_bytes), small
# enough that a bad peer cannot make us allocate without bound.
MAX_FRAME_BYTES = 64 * 1024 * 1024


class ProtocolError(ToolpoolError):
    """Bytes that are not a valid toolpool message (or a message of another version)."""


class MessageType(StrEnum):
    # coordinator ⇄ worker
    READY = "ready"
    EXECUTE = "execute"
    PROGRESS = "progress"
    RESULT = "result"
    HEARTBEAT = "heartbeat"
    SHUTDOWN = "shutdown"
    # pool ⇄ zygote
    SPAWN = "spawn"
    SPAWNED = "spawned"
    EXITED = "exited"
    # client ⇄ daemon
    HELLO = "hello"
    WELCOME = "welcome"
    OPEN_SESSION = "open_session"
    SESSION_OPENED = "session_opened"
    CLOSE_SESSION = "close_session"
    SUBMIT = "submit"
    ACCEPTED = "accepted"
    APPEND = "append"
    CANCEL_CALL = "cancel_call"
    END_TURN = "end_turn"
    TURN_EVENT = "turn_event"
    STEER = "steer"
    APPROVAL_REQUEST = "approval_request"
    APPROVAL_REPLY = "approval_reply"
    STATUS = "status"
    TOOLS = "tools"
    REPLY = "reply"
    ERROR = "error"
    PING = "ping"
    BYE = "bye"
    # MCP bridge ⇄ daemon, worker ⇄ MCP bridge
    BRIDGE_READY = "bridge_ready"
    MCP_CALL = "mcp_call"
    MCP_PROGRESS = "mcp_progress"
    MCP_RESULT = "mcp_result"
    MCP_CANCEL = "mcp_cancel"


# --- coordinator ⇄ worker --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """Worker → coordinator, once, when it has connected: the handshake.

    Answer: nothing, or ``Shutdown`` when the version differs. After it the worker is
    idle and may be sent ``Execute``.
    """

    type: ClassVar[MessageType] = MessageType.READY
    worker_id: str
    pid: int
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True, slots=True)
class Execute:
    """Coordinator → idle worker: run one call.

    Answer: any number of ``Progress``, then exactly one ``Result`` with the same
    ``call_id``. Cancellation is not a message: the coordinator sends the worker
    SIGUSR1 (SPEC D4), and the worker answers with a cancelled ``Result``.

    ``context`` holds the ToolContext fields (session_id, workspace, extra_roots,
    allow_network, scratch_dir); ``stamps`` the file-read register entries of the
    files the call names (FileTool.file_paths); ``limits`` a ``Limits`` dict.
    """

    type: ClassVar[MessageType] = MessageType.EXECUTE
    call_id: str
    tool: str
    arguments: dict[str, Any]
    context: dict[str, Any]
    limits: dict[str, Any]
    stamps: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Progress:
    """Worker → coordinator while a call runs: one progress report (SPEC P9). No answer."""

    type: ClassVar[MessageType] = MessageType.PROGRESS
    call_id: str
    data: Any


@dataclass(frozen=True, slots=True)
class Result:
    """Worker → coordinator: the call is over. No answer; the worker is idle again.

    ``status`` is "ok", "error" or "cancelled"; ``result`` a ToolResult dict;
    ``usage`` wall/cpu seconds and peak memory; ``stamps`` the register entries the
    call recorded (path → stamp dict, or None for a forgotten path).
    """

    type: ClassVar[MessageType] = MessageType.RESULT
    call_id: str
    status: str
    result: dict[str, Any]
    usage: dict[str, Any] = field(default_factory=dict)
    stamps: dict[str, dict[str, Any] | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Worker → coordinator every heartbeat interval, busy or not. No answer.

    A worker whose heartbeats stop is hung (a tool holding the GIL, a stopped
    process) and is replaced.
    """

    type: ClassVar[MessageType] = MessageType.HEARTBEAT
    worker_id: str
    rss: int = 0


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Coordinator → worker: exit once idle. No answer; the zygote reports the exit."""

    type: ClassVar[MessageType] = MessageType.SHUTDOWN
    reason: str = ""


# --- pool ⇄ zygote --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Spawn:
    """Pool → zygote: fork a worker with this configuration. Answer: ``Spawned``."""

    type: ClassVar[MessageType] = MessageType.SPAWN
    worker_id: str
    config: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Spawned:
    """Zygote → pool: the worker's process exists (it has not connected yet)."""

    type: ClassVar[MessageType] = MessageType.SPAWNED
    worker_id: str
    pid: int


@dataclass(frozen=True, slots=True)
class Exited:
    """Zygote → pool, unasked: a worker process ended (reaped by the zygote).

    ``exit_code`` when it exited, ``signal`` when a signal ended it.
    """

    type: ClassVar[MessageType] = MessageType.EXITED
    pid: int
    exit_code: int | None = None
    signal: int | None = None


# --- client ⇄ daemon ---------------------------------------------------------------------
# Every request carries a ``request_id`` chosen by the client; the daemon's answer
# (the reply named in the docstring, or ``Error``) carries the same id.


@dataclass(frozen=True, slots=True)
class Hello:
    """Client → daemon, first: the handshake. Answer: ``Welcome``, or ``Error`` with
    code "version" when the versions differ."""

    type: ClassVar[MessageType] = MessageType.HELLO
    request_id: str
    version: int = PROTOCOL_VERSION
    client: str = ""


@dataclass(frozen=True, slots=True)
class Welcome:
    """Daemon → client: the handshake's answer, with the daemon's pid and version."""

    type: ClassVar[MessageType] = MessageType.WELCOME
    request_id: str
    version: int
    daemon_pid: int
    tools: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class OpenSession:
    """Client → daemon: open a session on ``workspace``. Answer: ``SessionOpened``.

    ``options``: extra_roots, allow_network, max_tool_errors, limits, gate ("allow",
    "ask", "policy"), policy (rules), approval_timeout, max_tool_concurrency.
    """

    type: ClassVar[MessageType] = MessageType.OPEN_SESSION
    request_id: str
    workspace: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionOpened:
    type: ClassVar[MessageType] = MessageType.SESSION_OPENED
    request_id: str
    session_id: str


@dataclass(frozen=True, slots=True)
class CloseSession:
    """Client → daemon: end a session (its running turns are aborted). Answer: ``Reply``."""

    type: ClassVar[MessageType] = MessageType.CLOSE_SESSION
    request_id: str
    session_id: str


@dataclass(frozen=True, slots=True)
class Submit:
    """Client → daemon: a turn. Answer: ``Accepted``, then its ``TurnEvent``s, the last
    of which is ``turn_end``.

    ``calls`` is a list of ToolCall dicts when ``format`` is "toolpool", else model
    output in that provider's shape ("openai", "openai-responses", "anthropic",
    "gemini"), or None to detect it. An ``open`` turn takes more calls (``Append``)
    until ``EndTurn``.
    """

    type: ClassVar[MessageType] = MessageType.SUBMIT
    request_id: str
    session_id: str
    calls: Any
    format: str | None = "toolpool"
    open: bool = False


@dataclass(frozen=True, slots=True)
class Append:
    """Client → daemon: more calls for an open turn, queued at its tail. Answer:
    ``Reply`` with ``{"call_ids": [...]}``; their events follow in the turn's stream."""

    type: ClassVar[MessageType] = MessageType.APPEND
    request_id: str
    turn_id: str
    calls: Any
    format: str | None = "toolpool"


@dataclass(frozen=True, slots=True)
class CancelCall:
    """Client → daemon: stop one call of a turn (running: cancelled; queued: never
    started). Answer: ``Reply``."""

    type: ClassVar[MessageType] = MessageType.CANCEL_CALL
    request_id: str
    turn_id: str
    call_id: str


@dataclass(frozen=True, slots=True)
class EndTurn:
    """Client → daemon: an open turn takes no more calls; it ends after the last one.
    Answer: ``Reply``."""

    type: ClassVar[MessageType] = MessageType.END_TURN
    request_id: str
    turn_id: str


@dataclass(frozen=True, slots=True)
class Accepted:
    """Daemon → client: the turn is queued; these are its calls' ids, in order."""

    type: ClassVar[MessageType] = MessageType.ACCEPTED
    request_id: str
    turn_id: str
    call_ids: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """Daemon → client: events of a turn (``Event.to_dict()`` each), in order; those
    emitted together travel together. No answer."""

    type: ClassVar[MessageType] = MessageType.TURN_EVENT
    turn_id: str
    events: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Steer:
    """Client → daemon: "interrupt" (the user sent a message, S4) or "abort" (S5) the
    session's unfinished turns. Answer: ``Reply``."""

    type: ClassVar[MessageType] = MessageType.STEER
    request_id: str
    session_id: str
    action: str


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """Daemon → client: the gate asks (P8). Answer: ``ApprovalReply`` within
    ``timeout`` seconds, or the call is denied."""

    type: ClassVar[MessageType] = MessageType.APPROVAL_REQUEST
    approval_id: str
    session_id: str
    turn_id: str
    call: dict[str, Any]
    label: str
    preview: Any
    read_only: bool
    permissions: list[str]
    timeout: float


@dataclass(frozen=True, slots=True)
class ApprovalReply:
    """Client → daemon: the user's decision on an ``ApprovalRequest``. No answer."""

    type: ClassVar[MessageType] = MessageType.APPROVAL_REPLY
    approval_id: str
    allowed: bool
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Status:
    """Client → daemon: how are you? Answer: ``Reply`` with workers, queue, sessions,
    breaker states and the sandbox profile."""

    type: ClassVar[MessageType] = MessageType.STATUS
    request_id: str


@dataclass(frozen=True, slots=True)
class Tools:
    """Client → daemon: the tools' definitions in ``format`` ("toolpool", "openai",
    "openai-responses", "anthropic", "gemini", "mcp"). Answer: ``Reply``."""

    type: ClassVar[MessageType] = MessageType.TOOLS
    request_id: str
    format: str = "toolpool"


@dataclass(frozen=True, slots=True)
class Reply:
    """Daemon → client: a request succeeded; ``data`` depends on the request."""

    type: ClassVar[MessageType] = MessageType.REPLY
    request_id: str
    data: Any = None


@dataclass(frozen=True, slots=True)
class Error:
    """Daemon → client: a request failed (``request_id`` is None when the daemon could
    not even read it). ``code``: "protocol", "version", "unknown_session",
    "bad_request", "shutting_down", "internal"."""

    type: ClassVar[MessageType] = MessageType.ERROR
    request_id: str | None
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Ping:
    """Daemon → client, now and then: are you there? No answer (a failed send tells)."""

    type: ClassVar[MessageType] = MessageType.PING


@dataclass(frozen=True, slots=True)
class Bye:
    """Client → daemon: the client is closing; its sessions end. No answer."""

    type: ClassVar[MessageType] = MessageType.BYE


# --- MCP bridges (toolpool.mcp.bridge) --------------------------------------------------
# A bridge process holds the session with one imported MCP server. It tells the daemon
# over its stdout what the server offers; workers running the server's proxy tools
# talk to it over a ZeroMQ socket in the daemon's runtime directory.


@dataclass(frozen=True, slots=True)
class BridgeReady:
    """Bridge → daemon, once, as a length-prefixed frame on its stdout: the server's
    tools (MCP ``Tool`` definitions as the server gave them), or ``error`` saying why
    the bridge could not connect. No answer; the daemon closes the bridge's stdin to
    stop it."""

    type: ClassVar[MessageType] = MessageType.BRIDGE_READY
    server: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""


@dataclass(frozen=True, slots=True)
class McpCall:
    """Worker → bridge: call the server's tool ``tool`` (its own, unprefixed name).

    Answer: any number of ``McpProgress``, then exactly one ``McpResult`` with the same
    ``call_id``, also when ``McpCancel`` stops it early.
    """

    type: ClassVar[MessageType] = MessageType.MCP_CALL
    call_id: str
    tool: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class McpProgress:
    """Bridge → worker: the server reported progress of a call (an MCP progress
    notification). No answer."""

    type: ClassVar[MessageType] = MessageType.MCP_PROGRESS
    call_id: str
    progress: float
    total: float | None = None
    message: str | None = None


@dataclass(frozen=True, slots=True)
class McpResult:
    """Bridge → worker: the call is over. ``content`` holds MCP content blocks (text,
    image…); ``is_error`` is the server's ``isError``, or true when the call failed on
    the way (the server crashed, hung up or refused the request: ``content`` says
    so). No answer."""

    type: ClassVar[MessageType] = MessageType.MCP_RESULT
    call_id: str
    content: list[dict[str, Any]]
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class McpCancel:
    """Worker → bridge: the call was cancelled (interrupt, abort, wall time); the
    bridge cancels the MCP request. Answer: the call's ``McpResult`` (an error saying
    "Cancelled.", unless the server's answer was already on its way)."""

    type: ClassVar[MessageType] = MessageType.MCP_CANCEL
    call_id: str


Message: TypeAlias = (
    Ready
    | Execute
    | Progress
    | Result
    | Heartbeat
    | Shutdown
    | Spawn
    | Spawned
    | Exited
    | Hello
    | Welcome
    | OpenSession
    | SessionOpened
    | CloseSession
    | Submit
    | Accepted
    | Append
    | CancelCall
    | EndTurn
    | TurnEvent
    | Steer
    | ApprovalRequest
    | ApprovalReply
    | Status
    | Tools
    | Reply
    | Error
    | Ping
    | Bye
    | BridgeReady
    | McpCall
    | McpProgress
    | McpResult
    | McpCancel
)

_CLASSES: dict[str, type[Any]] = {
    cls.type.value: cls
    for cls in (
        Ready,
        Execute,
        Progress,
        Result,
        Heartbeat,
        Shutdown,
        Spawn,
        Spawned,
        Exited,
        Hello,
        Welcome,
        OpenSession,
        SessionOpened,
        CloseSession,
        Submit,
        Accepted,
        Append,
        CancelCall,
        EndTurn,
        TurnEvent,
        Steer,
        ApprovalRequest,
        ApprovalReply,
        Status,
        Tools,
        Reply,
        Error,
        Ping,
        Bye,
        BridgeReady,
        McpCall,
        McpProgress,
        McpResult,
        McpCancel,
    )
}
_FIELDS: dict[type[Any], tuple[dataclasses.Field[Any], ...]] = {
    cls: dataclasses.fields(cls) for cls in _CLASSES.values()
}


def encode(message: Message) -> bytes:
    """One msgpack frame for ``message``."""
    body: dict[str, Any] = {"t": message.type.value}
    for f in _FIELDS[type(message)]:
        body[f.name] = getattr(message, f.name)
    frame: bytes = msgpack.packb(body, use_bin_type=True)
    return frame


def decode(frame: bytes) -> Message:
    """The message in ``frame``; ProtocolError for anything else."""
    if len(frame) > MAX_FRAME_BYTES:
        raise ProtocolError(f"frame of {len(frame)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        body = msgpack.unpackb(frame, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise ProtocolError(f"not a msgpack frame: {exc}") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"frame holds a {type(body).__name__}, not a map")
    kind = body.pop("t", None)
    cls = _CLASSES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {kind!r}")
    try:
        message: Message = cls(**body)
    except TypeError as exc:
        raise ProtocolError(f"bad {kind} message: {exc}") from None
    _check_types(message)
    return message


def _check_types(message: Any) -> None:
    """Shallow type checks of the fields, so handlers can trust what they read."""
    for f in _FIELDS[type(message)]:
        value = getattr(message, f.name)
        expected = _EXPECTED.get(str(f.type))
        if expected is not None and not isinstance(value, expected):
            raise ProtocolError(
                f"{message.type.value}.{f.name} is a {type(value).__name__}, "
                f"not {str(f.type).split(' |')[0]}"
            )


_EXPECTED: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "float": (int, float),
    "list[str]": (list,),
    "list[dict[str, Any]]": (list,),
    "dict[str, Any]": (dict,),
    "dict[str, dict[str, Any]]": (dict,),
    "dict[str, dict[str, Any] | None]": (dict,),
    "int | None": (int, type(None)),
    "str | None": (str, type(None)),
    "float | None": (int, float, type(None)),
}


# --- length-prefixed frames over pipes (the zygote's stdin/stdout) ------------------------

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
