"""Pool ⇄ worker and pool ⇄ zygote: running one call in a worker process.

The pool talks to its workers over a ZeroMQ ROUTER socket (one frame per message), to
the zygote over its stdin/stdout (length-prefixed frames, ``frames.write_frame``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar

from toolpool.models import Stage
from toolpool.protocol.fields import OMITTED_AT_DEFAULT
from toolpool.protocol.kinds import PROTOCOL_VERSION, MessageType


class CallStatus(StrEnum):
    """How a call ended, as its worker says in ``Result.status``."""

    OK = "ok"
    ERROR = "error"  # the result is an error (the tool's failure, a limit…)
    CANCELLED = "cancelled"  # the cancel signal stopped it
    PREPARED = "prepared"  # stage "prepare": validate passed, the preview was sent


@dataclass(frozen=True, slots=True)
class Ready:
    """Worker → pool, once, when it has connected: the handshake.

    Answer: nothing, or ``Shutdown`` when the version differs. After it the worker is
    idle and may be sent ``Execute``. ``failure``: the worker could not load the
    session tools it was started with (SPEC A5), and why; it takes no call, and
    waits for its ``Shutdown``.
    """

    type: ClassVar[MessageType] = MessageType.READY
    worker_id: str
    pid: int
    version: int = PROTOCOL_VERSION
    failure: str = field(default="", metadata=OMITTED_AT_DEFAULT)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallContext:
    """The ``ToolContext`` of a call as it crosses to the worker, inside ``Execute``:
    built by the pool executor from the engine's context, turned back into a
    ``ToolContext`` by the worker's runner. Paths travel as strings; ``allow_network``
    is the session's choice or the call's limits, whichever allows."""

    workspace: str
    session_id: str = ""
    extra_roots: tuple[str, ...] = ()
    allow_network: bool = False
    persistent_shell: bool = False
    root: str = "host"
    layer_bytes: int = 0
    image: str = ""
    workspace_overlay: bool = False
    workspace_view: str = ""  # the session's overlay of the workspace, once mounted (V14)
    scratch_dir: str | None = None
    tool_profile: str = "toolpool"  # the session's (SPEC F12)
    # A network policy session's key (hex): its commands and Python tools reach the
    # network through its proxy, with tokens made with this key (SPEC N3, N11).
    egress: str = field(default="", metadata=OMITTED_AT_DEFAULT)


@dataclass(frozen=True, slots=True)
class Execute:
    """Pool → worker: run one call — at once when the worker is idle, else (held)
    after the call it runs.

    Answer: any number of ``Progress``, then exactly one ``Result`` with the same
    ``call_id``; or, for a held call that never started, ``Withdrawn``. A worker runs
    its calls in the order they came, so results come in that order. A cancel is a
    ``Cancel`` naming the ``ticket`` (the pool's number for this call, unique in the
    pool: call ids are the model's, and two sessions may use the same); for the
    running call it becomes SIGTERM in the worker (SPEC D4), and the worker answers
    with a ``Result`` whose status is "cancelled" — or is killed when it has not
    answered within the pool's ``cancel_grace``.

    ``stamps`` holds the file-read register entries of the files the call names
    (FileTool.file_paths); ``limits`` a ``Limits`` dict. ``stage`` says what of the
    tool runs (SPEC L10): "full" its validate, its preview (sent as a ``Preview``
    before the tool executes) and its execute; "prepare" validate and preview only,
    answered by a ``Result`` of status "prepared" when validate passed (or by the
    refusal); "execute" the tool alone (validate and preview ran before the gate).
    """

    type: ClassVar[MessageType] = MessageType.EXECUTE
    call_id: str
    tool: str
    arguments: dict[str, Any]
    context: CallContext
    limits: dict[str, Any]
    stamps: dict[str, dict[str, Any]] = field(default_factory=dict)
    ticket: int = 0
    stage: Stage = field(default=Stage.FULL, metadata=OMITTED_AT_DEFAULT)


@dataclass(frozen=True, slots=True)
class Progress:
    """Worker → pool while a call runs: one progress report (SPEC P9). No answer."""

    type: ClassVar[MessageType] = MessageType.PROGRESS
    call_id: str
    data: Any


@dataclass(frozen=True, slots=True)
class Preview:
    """Worker → pool, at most once per call, before its tool executes: the call's
    preview (SPEC P7), cut at its cap (``truncated``), made in the worker under the
    call's limits (L10). No answer."""

    type: ClassVar[MessageType] = MessageType.PREVIEW
    call_id: str
    data: Any
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Result:
    """Worker → pool: the call is over. No answer; the worker is idle again.

    ``result`` is a ToolResult dict; ``usage`` wall/cpu seconds and peak memory;
    ``stamps`` the register entries the call recorded (path → stamp dict, or None for
    a forgotten path).
    """

    type: ClassVar[MessageType] = MessageType.RESULT
    call_id: str
    status: CallStatus
    result: dict[str, Any]
    usage: dict[str, Any] = field(default_factory=dict)
    stamps: dict[str, dict[str, Any] | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Worker → pool every heartbeat interval, busy or not. No answer.

    A worker whose heartbeats stop is hung (a tool holding the GIL, a stopped
    process) and is replaced. The zygote sends them too, over its stdout
    (``worker_id`` "zygote"): the first once its tool modules imported, then every
    interval; a zygote whose heartbeats stop is killed and replaced (SPEC L1).
    """

    type: ClassVar[MessageType] = MessageType.HEARTBEAT
    worker_id: str
    rss: int = 0


@dataclass(frozen=True, slots=True)
class Shutdown:
    """Pool → worker: exit once idle. No answer; the zygote reports the exit."""

    type: ClassVar[MessageType] = MessageType.SHUTDOWN
    reason: str = ""


class ShellAction(StrEnum):
    """What a ``ShellRequest`` asks of the pool's background shells."""

    START = "start"  # start ``command`` for the call's session
    OUTPUT = "output"  # the shell's state and the output not read before
    KILL = "kill"  # end the shell
    SANDBOX = "sandbox"  # the session's sandbox (started if need be): its socket


@dataclass(frozen=True, slots=True)
class ShellRequest:
    """Worker → pool while a call runs: a background shell of the call's session is to
    be started, read or ended (bash's ``run_in_background``, ``bash_output``,
    ``kill_shell``). The pool owns the shells, so they outlive the worker; the session
    is the one of the call running on that worker (the pool knows it), never one the
    worker names.

    Answer: exactly one ``ShellReply`` with the same ``call_id`` and ``request_id``.
    """

    type: ClassVar[MessageType] = MessageType.SHELL_REQUEST
    call_id: str
    request_id: str
    action: ShellAction
    shell_id: str = ""
    command: str = ""


@dataclass(frozen=True, slots=True)
class ShellReply:
    """Pool → worker: the answer to a ``ShellRequest``. No answer.

    ``shell`` is the shell's record (``toolpool.background.ShellInfo`` as a dict), or
    ``error`` says, for the model, why the request was refused (no such shell in the
    session, too many running, the sandbox failed). For ``output``, ``start`` and
    ``end`` are the bytes of its output file not read before.
    ``code`` is a refusal's ErrorCode value ("limit_exceeded", "sandbox_failed"…).
    For ``sandbox``, ``socket`` is the path of the session sandbox's socket, or empty
    when the pool keeps none here (commands then get a sandbox each); ``layer`` the
    mount point of its copy-on-write root's layer, if it has one; ``env`` and
    ``working_dir`` what an image root gives its commands as their base.
    """

    type: ClassVar[MessageType] = MessageType.SHELL_REPLY
    call_id: str
    request_id: str
    shell: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    start: int = 0
    end: int = 0
    code: str = ""
    socket: str = ""
    layer: str = ""
    env: dict[str, str] = field(default_factory=dict)  # an image root's Env (V13)
    working_dir: str = ""  # and its WorkingDir


@dataclass(frozen=True, slots=True)
class Cancel:
    """Pool → worker, on its control line (``Channel``): stop the call whose
    ``Execute`` had this ``ticket``. No answer but what it causes.

    The call running: the worker's I/O thread raises the cancel signal (SIGTERM) in
    the main thread for exactly that call — the signal is never sent for a call
    that is not the one running. The call held (sent ahead while another ran, not
    started): it never starts, and the worker answers ``Withdrawn``. The call ended
    already: nothing (its ``Result`` is on its way). ``running=False`` asks only for
    the held case: the pool takes a call back from behind a long one, for a worker
    that fell idle.
    """

    type: ClassVar[MessageType] = MessageType.CANCEL
    ticket: int
    running: bool = True


@dataclass(frozen=True, slots=True)
class Withdrawn:
    """Worker → pool: the call of this ``ticket`` was held, not started, and never
    will be (a ``Cancel`` took it back, or the call before it left the worker unfit to
    run another). No answer."""

    type: ClassVar[MessageType] = MessageType.WITHDRAWN
    ticket: int


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
