"""The pool's records: its settings, a worker and its states, how a worker ended, how a
call on the pool ended, and what the pool reports about itself.

Data only: the decisions over these records are the planner's (``planner.py``), the
processes and sockets are the pool's (``supervisor.py``, ``processes.py``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from toolpool.errors import ToolpoolError
from toolpool.protocol import CallContext, CallStatus, Result
from toolpool.sandbox.cgroups import WorkerCgroup
from toolpool.sandbox.limits import Limits, MiB
from toolpool.sandbox.policy import Policy


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
    # A busy worker may hold the next read-only call behind the one it runs, once the
    # pool is at max_workers: it starts it without waiting for the pool (SPEC H4).
    hold_calls: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.min_workers <= self.max_workers or self.max_workers < 1:
            raise ValueError("need 0 <= min_workers <= max_workers and max_workers >= 1")


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


@dataclass(slots=True, eq=False)
class Flight:
    """A call on a worker. ``wake`` is the one future its waiter sleeps on, woken by
    whichever comes first: its result, its worker's end, a cancel, its wall time — and,
    for a held call (sent ahead, behind the worker's running call), its promotion or
    its withdrawal. ``context`` and ``limits`` are the call's: a background shell it
    starts gets them. ``ticket`` is the pool's number for the call (``Cancel``)."""

    call_id: str
    on_progress: Callable[[Any], None]
    wake: asyncio.Future[None]
    context: CallContext | None = None
    limits: Limits | None = None
    result: Result | None = None
    ticket: int = 0
    held: bool = False  # behind the worker's running call, as far as the pool knows
    withdrawn: bool = False  # the worker gave it back, never started
    cancel_sent: bool = False  # a Cancel for it went out
    recalled: bool = False  # asked back (Cancel running=False) for an idle worker
    holdable: bool = False  # read-only: it may be held, and run again when in doubt
    on_preview: Callable[[Any, bool], None] | None = None  # the worker's Preview (P7)
    # A call was held behind it: should the worker die, that one may have crashed it
    # after this one's Result was sent but before it left the process.
    behind: bool = False

    def answer(self, result: Result) -> None:
        """The worker's Result (the first one counts)."""
        if self.result is None:
            self.result = result
            self.fire()

    def answered(self) -> Result | None:
        return self.result

    def promote(self) -> None:
        """The call ahead of it ended: the worker runs this one now."""
        self.held = False
        self.fire()

    def is_withdrawn(self) -> bool:
        """A method, not the field: a waiter reads it anew after each wait."""
        return self.withdrawn

    def give_back(self) -> None:
        """The worker withdrew it: it never started."""
        self.withdrawn = True
        self.fire()

    def fire(self, *_: object) -> None:
        if not self.wake.done():
            self.wake.set_result(None)

    def rearm(self) -> None:
        """A fresh ``wake`` for a second wait (the cancel's grace)."""
        if self.wake.done():
            self.wake = self.wake.get_loop().create_future()


@dataclass(eq=False)
class Worker:
    id: str
    offline: bool
    cgroup: WorkerCgroup | None
    ready: asyncio.Future[None]
    exited: asyncio.Future[WorkerExit]
    pid: int = 0
    state: WorkerState = WorkerState.STARTING
    calls: int = 0
    rss: int = 0
    last_seen: float = field(default_factory=time.monotonic)
    # Its calls, in the order it runs them: the first runs, one more may be held.
    flights: deque[Flight] = field(default_factory=deque)
    lines_ready: int = 0  # Ready heard on its call line and its control line
    # Calls given this worker and not yet over (a flight leaves ``flights`` when its
    # Result comes, before its waiter is done): it is released when none is left.
    assigned: int = 0
    kill_reason: str | None = None
    oom_baseline: int = 0
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    replaces_exit_at: float | None = None  # when the worker it replaces exited
    cgroup_limits: tuple[int, int] | None = None  # (memory, processes) last written


def drop_flight(worker: Worker, flight: Flight) -> None:
    """``flight`` is no longer the worker's (withdrawn, or over without a ``Result``,
    as when the worker died). Had it been the first of a live worker's, the next is
    the one the worker runs now: it is promoted, as when a ``Result`` comes."""
    if flight not in worker.flights:
        return
    first = worker.flights[0] is flight
    worker.flights.remove(flight)
    if first and worker.flights and worker.flights[0].held and not worker.exited.done():
        worker.flights[0].promote()


class OutcomeStatus(StrEnum):
    """How a call on the pool ended (``PoolOutcome.status``)."""

    OK = CallStatus.OK.value  # the first four: as the worker answered
    ERROR = CallStatus.ERROR.value
    CANCELLED = CallStatus.CANCELLED.value  # or killed when it did not answer the cancel
    PREPARED = CallStatus.PREPARED.value  # stage "prepare": validate passed (L10)
    LOST = "lost"  # the worker died or hung under it
    LIMIT = "limit"  # it ran past its wall time, or the kernel's OOM killer ended it
    UNSTARTED = "unstarted"  # cancelled before a worker took it


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


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    workers: dict[str, int]
    queued: int
    held: int  # calls sent ahead to a busy worker, behind its running one (SPEC H4)
    started: int
    replaced: int
    calls: int
    profile: dict[str, Any]
    replacement_ms: list[float]  # exit of a worker → its replacement ready, latest last
    zygotes_replaced: int  # zygotes that died (or hung) and were replaced (SPEC L1)
    zygote_recovery_ms: list[float]  # a zygote's death noticed → a new worker ready
