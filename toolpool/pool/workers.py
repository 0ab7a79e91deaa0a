"""The pool's records: its settings, a worker and its states, how a worker ended, a
call on the pool and its states, how it ended, what the pool reports about itself,
and the kinds of worker a call may need (``Kind``: offline or not, and bound to a
session's shipped tools or not: SPEC A5, A6).

Data only: the decisions over these records are the planner's (``planner.py``), the
processes and sockets are the pool's (``supervisor.py``, ``processes.py``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any, Protocol

from toolpool.cancel import CancelSource, CancelToken
from toolpool.errors import ToolpoolError
from toolpool.images import default_cache_root
from toolpool.protocol import CallContext, CallStatus
from toolpool.sandbox.cgroups import WorkerCgroup
from toolpool.sandbox.limits import CgroupLimits, Limits, MiB
from toolpool.sandbox.policy import Policy
from toolpool.session_options import DEFAULT_LAYER_BYTES


class PoolError(ToolpoolError):
    """The pool cannot run calls (it is closed, or workers fail to start)."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    min_workers: int = 2
    max_workers: int = 4
    tool_modules: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)  # every call's defaults
    cancel_grace: float = 2.0  # seconds a cancelled call has to answer before the kill
    shutdown_grace: float = 2.0  # seconds workers told to shut down get before the kill
    heartbeat_interval: float = 0.5
    heartbeat_misses: int = 10  # a worker silent this many intervals is hung
    max_calls_per_worker: int = 1000
    max_worker_rss: int = 512 * MiB
    worker_cpus: float = 1.0  # CPU quota of each worker's cgroup
    sandbox_disabled: frozenset[str] = frozenset()
    runtime_dir: Path | None = None
    spawn_timeout: float = 10.0
    policy: Policy = field(default_factory=Policy.default)  # what confined code may see
    background_wall_seconds: float = 3600.0  # how long a background shell may run
    max_background_shells_per_client: int = 32  # running at once, all its sessions (L9)
    max_background_shells: int = 256  # running at once in the pool (L9)
    # A session's writable layers (root = "overlay" or an image, workspace_mode =
    # "overlay"): the size of their tmpfs unless the session says (V12).
    layer_bytes: int = DEFAULT_LAYER_BYTES
    # Image roots (V13): where images may lie (empty: images off), the layer cache
    # and its bound.
    image_dirs: tuple[Path, ...] = ()
    image_cache: Path = field(default_factory=default_cache_root)
    image_cache_bytes: int = 10 * 1024**3
    # A busy worker may hold read-only calls behind the one it runs, once the pool is
    # at max_workers: it starts each without waiting for the pool (SPEC H4).
    hold_calls: bool = True
    # At max_workers, the most calls given to a worker in one frame, and the most held
    # behind the one it runs (SPEC H4); 1: one call a frame, one held.
    worker_calls_per_frame: int = 8
    # network_resolve (SPEC N10): names the egress proxy sends where the operator says.
    network_resolve: Mapping[str, tuple[str, int | None]] = field(default_factory=dict)
    # Calls given to a worker together travel as one ZeroMQ message of several parts,
    # one encoded Execute each (docs/protocol.md); off: one message per call, for
    # workers that read one call per message.
    multipart_frames: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers or self.max_workers < 1:
            raise ValueError("need 0 <= min_workers <= max_workers and max_workers >= 1")
        if self.worker_calls_per_frame < 1:
            raise ValueError("need worker_calls_per_frame >= 1")


@dataclass(eq=False)
class Binding:
    """Workers of one session's own (``bindings.py``): none of them takes another
    session's call, and they retire when the binding ends.
    ``payload``: the session's shipped tools (SPEC A5, A6), their pickle, which these
    workers load after their confinement, in their own process; ``egress``: the
    session's network is a policy (N11), so its workers are forked into its network
    namespace, where only its proxy listens, and run all its calls. ``broken``: why
    the payload does not load (every later call of its tools ends with it)."""

    session_id: str
    payload: bytes = b""
    egress: bool = False
    broken: str | None = None
    ended: bool = False
    kinds: dict[bool, BoundKind] = field(default_factory=dict)

    def kind(self, offline: bool) -> BoundKind:
        """The kind of worker a call of these tools needs (offline or not)."""
        kind = self.kinds.get(offline)
        if kind is None:
            kind = self.kinds[offline] = BoundKind(self, offline)
        return kind

    def __repr__(self) -> str:
        state = "ended" if self.ended else "broken" if self.broken else "live"
        what = f"{len(self.payload)} bytes" + (", its network namespace" if self.egress else "")
        return f"<Binding of session {self.session_id}: {what}, {state}>"


@dataclass(frozen=True, slots=True)
class BoundKind:
    """Workers of one binding, offline or not: they serve its calls alone."""

    binding: Binding
    offline: bool


# The kind of worker a call needs, and a worker is: offline or not (the plain workers,
# keyed by that flag alone) or bound to one session (its shipped tools, its network).
Kind = bool | BoundKind


def plain(kind: Kind) -> bool:
    """The plain kind of the same network choice (``offline``)."""
    return kind if isinstance(kind, bool) else kind.offline


class WorkerState(StrEnum):
    STARTING = "starting"
    IDLE = "idle"
    BUSY = "busy"
    RETIRING = "retiring"  # told to shut down after its call
    DEAD = "dead"


@dataclass(frozen=True, slots=True)
class WorkerExit:
    """How a worker process ended, and what we know of why."""

    exit_code: int | None
    signal: int | None
    reason: str | None = None  # set when we killed it: "hung", "cancel not answered"…
    oom: bool = False

    def describe(self) -> str:
        if self.oom:
            return "it ran out of memory and the kernel killed it"
        if self.reason:
            return self.reason
        if self.signal is not None:
            return f"it was killed by {signal.Signals(self.signal).name}"
        return f"it exited with status {self.exit_code}"


@dataclass(eq=False)
class Worker:
    """A worker process as the pool sees it. ``exit`` is set once it has ended.
    ``kind`` is what calls it takes: ``offline``, or the ``binding``'s kind."""

    id: str
    offline: bool
    cgroup: WorkerCgroup | None
    ready: asyncio.Future[None]
    binding: Binding | None = None  # the session whose shipped tools it loads (A6)
    exit: WorkerExit | None = None
    pid: int = 0
    state: WorkerState = WorkerState.STARTING
    calls: int = 0  # calls it ran (the planner recycles it after max_calls_per_worker)
    rss: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    # The calls given it and not over, in the order it runs them: the first runs (as
    # far as the pool knows), the others are held behind it (SPEC H4).
    given: deque[Call] = field(default_factory=deque)
    lines_ready: int = 0  # Ready heard on its call line and its control line
    kill_reason: str | None = None
    oom_baseline: int = 0
    # A policy session's worker (its binding's ``egress``) is forked into the
    # session's network namespace: its path and inode, found before it starts (N11).
    netns: str = ""
    netns_inode: int = 0
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    replaces_exit_at: float | None = None  # when the worker it replaces exited
    cgroup_limits: CgroupLimits | None = None  # last written to its cgroup
    load_failure: str | None = None  # why it could not load its binding's tools
    netns_failure: str | None = None  # why its session's network namespace was not had
    kind: Kind = field(init=False)

    def __post_init__(self) -> None:
        self.kind = self.offline if self.binding is None else self.binding.kind(self.offline)

    @classmethod
    def of_kind(cls, worker_id: str, kind: Kind, ready: asyncio.Future[None]) -> Worker:
        """A record of a worker of ``kind``, before its cgroup is made."""
        if isinstance(kind, bool):
            return cls(worker_id, kind, None, ready)
        return cls(worker_id, kind.offline, None, ready, kind.binding)


class OutcomeStatus(StrEnum):
    """How a call on the pool ended (``PoolOutcome.status``)."""

    OK = CallStatus.OK.value  # the first four: as the worker answered
    ERROR = CallStatus.ERROR.value
    CANCELLED = CallStatus.CANCELLED.value  # or killed when it did not answer the cancel
    PREPARED = CallStatus.PREPARED.value  # stage "prepare": validate passed (L10)
    LOST = "lost"  # the worker died or hung under it
    LIMIT = "limit"  # it ran past its wall time, or the kernel's OOM killer ended it
    UNSTARTED = "unstarted"  # cancelled before a worker took it
    FAILED = "failed"  # the pool cannot run it (closed, or no worker can start): ``cause``


class Escalation(StrEnum):
    """How a cancel or an overrun was carried out (``PoolOutcome.escalation``)."""

    ANSWERED = "answered"  # the worker answered the cancel signal in time
    KILLED = "killed"  # it did not, and was killed


@dataclass(frozen=True, slots=True)
class PoolOutcome:
    """How a call on the pool ended."""

    status: OutcomeStatus
    result: dict[str, Any] | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    stamps: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None
    escalation: Escalation | None = None  # for cancels and overruns
    worker_id: str | None = None
    worker_pid: int | None = None


Done = Callable[[PoolOutcome], None]
Sink = Callable[[Any], None]
PreviewSink = Callable[[Any, bool], None]


class CallState(Enum):
    QUEUED = "queued"  # waiting for a worker
    HELD = "held"  # given a worker, behind the call it runs
    RUNNING = "running"  # the first of its worker's calls: it runs, as far as we know
    STOPPING = "stopping"  # running, told to stop (a cancel, its wall time): the grace
    KILLING = "killing"  # it did not stop in time: its worker is being killed
    ENDED = "ended"  # ``done`` was called


class Call:
    """One call on the pool, from its start to its end. ``frame`` is its ``Execute``,
    encoded once (a call that runs again elsewhere is sent the same bytes);
    ``cgroup`` the limits its worker's cgroup must have (``CgroupLimits``);
    ``holdable``: read-only, so it may be held at a busy worker and run again when a
    worker's death leaves it in doubt.

    Its life is a small state machine driven by callbacks — its token's cancel, a
    timer, its worker's messages and its worker's end — with no task or future of its
    own (``Dispatch``, ``dispatch.py``)::

        QUEUED ─given─▶ HELD ─the call ahead ended─▶ RUNNING ─Result─▶ ENDED
          │               │                            │
          │ cancel        │ cancel: Cancel(ticket);    │ cancel, or past its wall
          ▼               │ Withdrawn, or it began     │ time: Cancel(ticket)
        ENDED             ▼ and stops                  ▼
        (unstarted)     ENDED (unstarted)           STOPPING ─Result─▶ ENDED
                                                       │ cancel_grace
                                                       ▼
                                                    KILLING ─killed─▶ ENDED

    A held call given back (``Withdrawn``), or lost with its worker while not known
    to have run to its end, goes back to QUEUED, to run elsewhere (SPEC H4).
    """

    __slots__ = (
        "abandoned",
        "behind",
        "call_id",
        "cancel_sent",
        "cgroup",
        "context",
        "done",
        "frame",
        "holdable",
        "host",
        "kind",
        "limits",
        "on_preview",
        "on_progress",
        "past_wall_time",
        "recalled",
        "retries",
        "state",
        "suspect",
        "ticket",
        "timer",
        "token",
        "untrack",
        "worker",
    )

    def __init__(
        self,
        host: CallHost,
        call_id: str,
        ticket: int,
        frame: bytes,
        context: CallContext,
        limits: Limits,
        *,
        kind: Kind,
        holdable: bool,
        token: CancelToken,
        on_progress: Sink,
        on_preview: PreviewSink | None,
        done: Done,
        retries: int,
    ) -> None:
        self.host = host
        self.call_id = call_id
        self.ticket = ticket
        self.frame = frame
        self.context = context
        self.limits = limits
        self.cgroup = CgroupLimits.of(limits)
        self.kind = kind  # the worker it needs (offline or not; bound to its tools or not)
        self.holdable = holdable
        self.token = token
        self.on_progress = on_progress
        self.on_preview = on_preview
        self.done: Done | None = done
        self.retries = retries  # runs again elsewhere this often, when in doubt (H4)
        self.state = CallState.QUEUED
        self.worker: Worker | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.untrack: Callable[[], None] | None = None
        self.cancel_sent = False  # a Cancel for it went out
        self.recalled = False  # asked back (Cancel running=False) for an idle worker
        self.past_wall_time = False
        self.abandoned = False  # its caller gave up on it (``WorkerPool.run``'s task)
        # It runs again after a worker's death that may have been its doing: alone,
        # so that a crasher takes no other call with it.
        self.suspect = False
        # A call was given its worker behind it: should the worker die, that one may
        # have crashed it after this one's Result was sent but before it left.
        self.behind = False

    def cancelled(self, _: CancelSource) -> None:
        """Its token fired (``CancelToken.on_cancel``)."""
        self.host.cancel(self)

    @property
    def unwanted(self) -> bool:
        """Whether a run of it that did not happen must not happen: cancelled, or its
        caller is gone."""
        return self.abandoned or self.token.requested

    def __repr__(self) -> str:
        worker = self.worker.id if self.worker is not None else "-"
        return f"<Call {self.call_id} #{self.ticket} {self.state.value} on {worker}>"


class CallHost(Protocol):
    """What a ``Call`` reports to: its pool."""

    def cancel(self, call: Call) -> None: ...


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    workers: dict[str, int]
    queued: int
    held: int  # calls given a busy worker, behind its running one (SPEC H4)
    started: int
    replaced: int
    calls: int
    profile: dict[str, Any]
    replacement_ms: list[float]  # exit of a worker → its replacement ready, latest last
    zygotes_replaced: int  # zygotes that died (or hung) and were replaced (SPEC L1)
    zygote_recovery_ms: list[float]  # a zygote's death noticed → a new worker ready
