"""Client ⇄ daemon: sessions, turns and their events, approvals, status.

The client library (``toolpool.client.connection``) sends the requests over a ZeroMQ
DEALER socket; the daemon (``toolpool.daemon.server``) answers over its ROUTER.
Every request carries a ``request_id`` chosen by the client; the daemon's answer (the
reply named in the docstring, or ``Error``) carries the same id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from toolpool.protocol.fields import OMITTED_AT_DEFAULT
from toolpool.protocol.kinds import PROTOCOL_VERSION, MessageType


class SteerAction(StrEnum):
    """What ``Steer`` does to a session's unfinished turns."""

    INTERRUPT = "interrupt"  # S4: the user sent a message; calls that allow it stop
    ABORT = "abort"  # S5: every unfinished call is cancelled


class EventSelection(StrEnum):
    """Which of a turn's events the daemon sends the client (``Submit.events``)."""

    ALL = "all"  # every event
    RESULTS = "results"  # tool_end and turn_end only: what results() and result() need


class BranchAction(StrEnum):
    """What a ``Branch`` request asks of a session's layers (SPEC B1–B10)."""

    CHECKPOINT = "checkpoint"  # make one now (``label``)
    CHECKPOINTS = "checkpoints"  # list them
    REWIND = "rewind"  # back to ``checkpoint``
    FORK = "fork"  # ``count`` new sessions at ``checkpoint`` (now when empty), ``options``
    CHANGES = "changes"  # the paths that differ from the start, or ``checkpoint``
    DIFF = "diff"  # the same as a git-format patch
    EXPORT = "export"  # the workspace written to ``path``
    COMMIT = "commit"  # the workspace's changes applied to the host directory


class FailureCode(StrEnum):
    """Why a request failed (``Error.code``)."""

    PROTOCOL = "protocol"  # unreadable, or not a request a client sends (before Hello)
    VERSION = "version"  # the client speaks another protocol version
    UNKNOWN_SESSION = "unknown_session"
    UNKNOWN_TURN = "unknown_turn"  # no running turn of this client by that id
    UNKNOWN_CHECKPOINT = "unknown_checkpoint"  # not a checkpoint of that session (B7)
    BUSY = "busy"  # a turn of the session runs or waits: branches are between turns (B6)
    BAD_REQUEST = "bad_request"  # readable, but its content is refused
    SHUTTING_DOWN = "shutting_down"  # the daemon takes no new turns
    LIMIT = "limit"  # over a daemon limit (max_sessions_per_client, max_sessions: L6)
    DISCONNECTED = "disconnected"  # the daemon let this client go (it stalled: L5)
    INTERNAL = "internal"  # the daemon failed on it


@dataclass(frozen=True, slots=True)
class Hello:
    """Client → daemon, first: the handshake. Answer: ``Welcome``, or ``Error`` with
    code ``version`` when the versions differ."""

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
class ShippedTool:
    """What the daemon knows of one tool a client ships (SPEC A5): what the model is
    shown, and the answers the pipeline and the scheduler need before a worker runs
    it — given as values, since the daemon never runs the client's code.
    ``validates`` and ``previews``: the tool has a validate (P6) or a preview (P7),
    which run in its worker."""

    name: str
    description: str
    schema: dict[str, Any]
    label: str
    read_only: bool = False
    concurrency_safe: bool = False
    interrupt_behavior: str = "block"
    activity: str | None = None  # a format string over the arguments ("Testing {path}")
    permissions: tuple[str, ...] = ()
    validates: bool = False
    previews: bool = False


@dataclass(frozen=True, slots=True)
class ShippedTools:
    """The tools a client ships with a session (``OpenSession.tools``, SPEC A5):
    ``payload`` is the pickle (dill's, by value) that only a worker bound to the
    session loads — the daemon passes it on and never unpickles it; ``python`` is
    the major.minor of the Python that made it, which must be the workers'."""

    python: str
    payload: bytes
    tools: tuple[ShippedTool, ...]


@dataclass(frozen=True, slots=True)
class OpenSession:
    """Client → daemon: open a session on ``workspace``. Answer: ``SessionOpened``.

    ``options``: the session's options as ``toolpool.session_options.SessionOptions``
    lists and checks them (SPEC E6); the daemon checks them again. A bad one is an
    ``Error`` of code ``bad_request`` naming it. ``tools``: tools of the client's own
    program, shipped by value for this session alone (SPEC A5, A6); refused as a
    ``bad_request`` saying why (the daemon's ``session_tools`` setting, the Python
    version, a name or schema).
    """

    type: ClassVar[MessageType] = MessageType.OPEN_SESSION
    request_id: str
    workspace: str
    options: dict[str, Any] = field(default_factory=dict)
    tools: ShippedTools | None = field(default=None, metadata=OMITTED_AT_DEFAULT)


@dataclass(frozen=True, slots=True)
class SessionOpened:
    """Daemon → client: the answer to ``OpenSession``; the session's id."""

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
    until ``EndTurn``. ``events`` says which of the turn's events to send: all, or
    only ``tool_end`` and ``turn_end`` (``results``), in fewer frames; it is left
    out of the frame when it is ``all``.
    """

    type: ClassVar[MessageType] = MessageType.SUBMIT
    request_id: str
    session_id: str
    calls: Any
    format: str | None = "toolpool"
    open: bool = False
    events: EventSelection = field(default=EventSelection.ALL, metadata=OMITTED_AT_DEFAULT)


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
    """Daemon → client: events of a turn, in order, in their wire form
    (``protocol.events``: a result travels once, in its ``tool_end``; the message
    events and ``turn_end`` name results by call id, L2); those emitted together
    travel together. No answer."""

    type: ClassVar[MessageType] = MessageType.TURN_EVENT
    turn_id: str
    events: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Steer:
    """Client → daemon: interrupt (the user sent a message, S4) or abort (S5) the
    session's unfinished turns. Answer: ``Reply``."""

    type: ClassVar[MessageType] = MessageType.STEER
    request_id: str
    session_id: str
    action: SteerAction


@dataclass(frozen=True, slots=True)
class Branch:
    """Client → daemon: checkpoints, rewind, fork and the changes out of a session
    whose workspace is an overlay (SPEC B1–B10), between its turns (a turn running
    or waiting: ``Error`` ``busy``). Answer: ``Reply`` whose ``data`` is, by
    ``action``: ``checkpoint`` the new checkpoint (``id``, ``turn_id``, ``time``,
    ``label``, ``paths``, ``paths_truncated``, ``merged``, ``duration_ms``); ``checkpoints``
    ``{"checkpoints": [...], "skipped": [...], "max_checkpoints"}``; ``rewind``
    ``{"checkpoint", "forgot", "shells_stopped"}``; ``fork`` ``{"session_ids", "at"}``
    (sessions of this client); ``changes`` ``{"changes": [{"path", "kind", "type",
    "old_mode", "new_mode"}]}``; ``diff`` ``{"patch"}``; ``export`` ``{"path",
    "entries"}``; ``commit`` ``{"paths", "conflicts"}``: the paths written, or (nothing
    written) the paths the host changed since the session started from them.
    ``checkpoint`` names the rewind's target, the fork's point (empty: now) and the
    start of ``changes`` and ``diff`` (empty: the host directory); ``count`` and
    ``options`` are the fork's (its sessions' options over the parent's); ``path`` is
    the export's destination."""

    type: ClassVar[MessageType] = MessageType.BRANCH
    request_id: str
    session_id: str
    action: BranchAction
    checkpoint: str = ""
    label: str = ""
    count: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    path: str = ""


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """Daemon → client: the gate asks (P8), or a policy session's proxy asks about a
    connection no rule names (``kind`` "network", N6: ``host`` and ``port``, and
    ``call`` the call whose command opened it — only its ``id`` where its turn is
    over). Answer: ``ApprovalReply`` within ``timeout`` seconds, or it is denied.
    ``preview_truncated``: the preview was cut at its cap, and its text ends saying
    so (L10)."""

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
    preview_truncated: bool = field(default=False, metadata=OMITTED_AT_DEFAULT)
    kind: str = field(default="call", metadata=OMITTED_AT_DEFAULT)
    host: str = field(default="", metadata=OMITTED_AT_DEFAULT)
    port: int = field(default=0, metadata=OMITTED_AT_DEFAULT)


@dataclass(frozen=True, slots=True)
class ApprovalReply:
    """Client → daemon: the user's decision on an ``ApprovalRequest``. No answer.
    ``scope`` "session": a network approval's answer holds for the session's later
    connections to that host and port too (N6); "" for this one."""

    type: ClassVar[MessageType] = MessageType.APPROVAL_REPLY
    approval_id: str
    allowed: bool
    reason: str = ""
    scope: str = field(default="", metadata=OMITTED_AT_DEFAULT)


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
    not even read it); ``code`` says why."""

    type: ClassVar[MessageType] = MessageType.ERROR
    request_id: str | None
    code: FailureCode
    message: str


@dataclass(frozen=True, slots=True)
class Ping:
    """Daemon → client, now and then: are you there? No answer (a failed send tells)."""

    type: ClassVar[MessageType] = MessageType.PING


@dataclass(frozen=True, slots=True)
class Bye:
    """Client → daemon: the client is closing; its sessions end. No answer."""

    type: ClassVar[MessageType] = MessageType.BYE


@dataclass(frozen=True, slots=True)
class Chunk:
    """Daemon → client: one piece of a message larger than ``CHUNK_BYTES`` (SPEC L3).
    The ``data`` of one ``stream``'s chunks, joined in order up to the one marked
    ``last``, is the message's frame. Chunks of one stream are never interleaved
    with other frames. No answer."""

    type: ClassVar[MessageType] = MessageType.CHUNK
    stream: int
    data: bytes
    last: bool = False


@dataclass(frozen=True, slots=True)
class Ack:
    """Client → daemon: ``received`` bytes of frames (every frame, counted as sent)
    have arrived so far. The daemon keeps at most ``client_buffer_bytes`` unacknowledged
    (SPEC L5). No answer."""

    type: ClassVar[MessageType] = MessageType.ACK
    received: int
