"""The worker pool: pre-started, sandboxed processes that run tools (SPEC D2-D4).

Workers are forked by a zygote, connect to a ZeroMQ ROUTER socket in a private
runtime directory, announce themselves (``Ready``) and heartbeat. A call goes to an
idle worker; when none is idle and the pool is below its maximum, a new one starts.

How a call on a worker can end:
- its ``Result`` arrives: the result, with the worker's resource usage;
- it is cancelled (interrupt or abort): the worker is sent SIGTERM, and has
  ``cancel_grace`` seconds to answer "cancelled" before it is killed;
- it runs past its wall time: the same, reported as a limit;
- the worker dies (crash, exit, OOM kill, CPU hard limit) or stops heartbeating
  (hung): an error result naming the cause.

A worker that was killed or died, or whose call was cancelled, overran a limit or
left processes behind, is replaced; a worker is also recycled after
``max_calls_per_worker`` calls or when its memory grows past ``max_worker_rss``.
The pool keeps ``min_workers`` alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import signal
import tempfile
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil
import zmq

from toolpool.cancel import CancelToken
from toolpool.coordinator.peers import LOCAL_DOMAIN, PeerGuard
from toolpool.coordinator.zygote import Zygote, ZygoteError
from toolpool.errors import ToolpoolError
from toolpool.protocol import (
    MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Execute,
    Exited,
    Heartbeat,
    Message,
    Progress,
    ProtocolError,
    Ready,
    Result,
    Shutdown,
    decode,
    encode,
)
from toolpool.sandbox import linux
from toolpool.sandbox.cgroups import CgroupTree, WorkerCgroup
from toolpool.sandbox.limits import Limits, MiB
from toolpool.sandbox.policy import Policy
from toolpool.sandbox.profile import SandboxProfile
from toolpool.sandbox.terminate import (
    CgroupMembers,
    ProcessSet,
    ProcessTree,
    TerminationReport,
    Together,
    terminate,
)
from toolpool.worker.main import WorkerConfig
from toolpool.zmqloop import LoopSocket

log = logging.getLogger(__name__)


class PoolError(ToolpoolError):
    """The pool cannot run calls (it is closed, or workers fail to start)."""


@dataclass(frozen=True, slots=True)
class PoolConfig:
    min_workers: int = 2
    max_workers: int = 4
    tool_modules: tuple[str, ...] = ()
    limits: Limits = field(default_factory=Limits)  # every call's defaults
    cancel_grace: float = 2.0  # seconds a cancelled call has to answer before the kill
    heartbeat_interval: float = 0.5
    heartbeat_misses: int = 10  # a worker silent this many intervals is hung
    max_calls_per_worker: int = 1000
    max_worker_rss: int = 512 * MiB
    worker_cpus: float = 1.0  # CPU quota of each worker's cgroup
    sandbox_disabled: frozenset[str] = frozenset()
    runtime_dir: Path | None = None
    spawn_timeout: float = 10.0
    policy: Policy = field(default_factory=Policy.default)  # what confined code may see

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


@dataclass(slots=True)
class _Flight:
    """A call on a worker."""

    call_id: str
    on_progress: Callable[[Any], None]
    result: asyncio.Future[Result]


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
    flight: _Flight | None = None
    kill_reason: str | None = None
    oom_baseline: int = 0
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    replaces_exit_at: float | None = None  # when the worker it replaces exited
    cgroup_limits: tuple[int, int] | None = None  # (memory, processes) last written


@dataclass(frozen=True, slots=True)
class PoolOutcome:
    """How a call on the pool ended.

    ``status``: "ok", "error" or "cancelled" as the worker answered; "lost" when the
    worker died or hung; "limit" when the call ran past its wall time; "unstarted"
    when it was cancelled before a worker took it.
    """

    status: str
    result: dict[str, Any] | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    stamps: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None
    escalation: str | None = None  # "answered" or "killed", for cancels and overruns
    worker_id: str | None = None


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    workers: dict[str, int]
    queued: int
    started: int
    replaced: int
    calls: int
    profile: dict[str, Any]
    replacement_ms: list[float]  # exit of a worker → its replacement ready, latest last


class WorkerPool:
    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self.profile = SandboxProfile.nothing()
        self._workers: dict[str, Worker] = {}
        self._by_pid: dict[int, Worker] = {}
        # Calls waiting for a worker, by kind (offline or not), first come first
        # served. Only pending futures are kept: whoever settles one removes it.
        self._waiters: dict[bool, deque[asyncio.Future[Worker | None]]] = {
            False: deque(),
            True: deque(),
        }
        self._ids = itertools.count(1)
        self._cgroups: CgroupTree | None = None
        self._zygote: Zygote | None = None
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._router: LoopSocket | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Future[Any]] = set()
        self._runtime_dir: Path | None = None
        self._owns_runtime_dir = False
        self._start_failures = 0
        self._counts = {"started": 0, "replaced": 0, "calls": 0}
        self._replacement_ms: deque[float] = deque(maxlen=100)
        self._open = False
        self.endpoint = ""
        self._policy = self.config.policy
        self._guard: PeerGuard | None = None
        self._connected: set[int] = set()  # worker pids that have connected

    # -- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Probe the sandbox, open the socket, start the zygote and the minimum of
        workers, and wait until they are ready."""
        loop = asyncio.get_running_loop()
        self.profile = await loop.run_in_executor(
            None, SandboxProfile.probe, self.config.sandbox_disabled
        )
        if self.profile.active("cgroups"):
            self._cgroups = CgroupTree.probe()
        for line in self.profile.describe():
            log.info("sandbox: %s", line)
        if self.config.runtime_dir is None:
            self._runtime_dir = Path(tempfile.mkdtemp(prefix="toolpool-"))
            self._owns_runtime_dir = True
        else:
            self._runtime_dir = self.config.runtime_dir
            self._runtime_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self._runtime_dir, 0o700)
        self.endpoint = f"ipc://{self._runtime_dir}/workers.sock"
        # Workers and the commands they start never see the runtime dir (X2).
        self._policy = dataclasses.replace(
            self.config.policy, hidden=(*self.config.policy.hidden, str(self._runtime_dir))
        )
        self._context = zmq.Context()
        # Only a worker, and only once, may connect: a Python tool that opens a
        # second connection cannot pose as a worker that has not yet connected and
        # be handed other sessions' calls (X2).
        self._guard = PeerGuard(
            self._context, lambda pid: not self._admits(pid), "a process that is no new worker"
        )
        self._guard.start()
        router = self._context.socket(zmq.ROUTER)
        router.zap_domain = LOCAL_DOMAIN.encode()
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.setsockopt(zmq.SNDHWM, 0)  # a send never blocks the loop
        router.bind(self.endpoint)
        self._router = LoopSocket(router, self._on_frames)
        self._zygote = Zygote(
            self.config.tool_modules,
            self._runtime_dir,
            self._on_exit,
            self._on_zygote_death,
            env=self._policy.worker_environment(),
        )
        await self._zygote.start()
        self._open = True
        self._tasks = [asyncio.ensure_future(self._watch_heartbeats())]
        workers = [
            self._spawn(offline=self._offline_default) for _ in range(self.config.min_workers)
        ]
        try:
            await asyncio.gather(*(w.ready for w in workers))
        except Exception:
            await self.close()
            raise

    async def close(self, *, polite: bool = True) -> None:
        """Stop every worker (politely: a Shutdown and 2 s to exit; then by force), the
        zygote and the socket; remove the cgroups and the runtime directory. Nothing
        is left running."""
        self._open = False
        self._fail_waiters("the pool is closed")
        live = [w for w in self._workers.values() if w.state is not WorkerState.DEAD]
        for worker in live if polite else ():
            if worker.state is WorkerState.STARTING:
                continue  # not connected yet: it cannot hear a Shutdown
            worker.state = WorkerState.RETIRING
            self._send(worker, Shutdown("pool closing"))
        leaving = [w.exited for w in live if w.state is WorkerState.RETIRING]
        if leaving:
            await asyncio.wait(leaving, timeout=2.0)
        for worker in live:
            if worker.pid and not worker.exited.done():
                await self._kill(worker, "the pool closed")
        if self._zygote is not None:
            await self._zygote.close()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._router is not None:
            self._router.close()
            self._router = None
        if self._guard is not None:
            self._guard.stop()  # before the context ends: it holds a socket in it
            self._guard = None
        if self._context is not None:
            self._context.term()
        for worker in self._workers.values():
            if worker.cgroup is not None:
                worker.cgroup.remove()
        if self._cgroups is not None:
            self._cgroups.close()
        if self._owns_runtime_dir and self._runtime_dir is not None:
            shutil.rmtree(self._runtime_dir, ignore_errors=True)

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def _offline_default(self) -> bool:
        return self.profile.active("netns")

    # -- running a call ----------------------------------------------------------------

    async def run(
        self,
        execute: Execute,
        *,
        network: bool,
        token: CancelToken,
        on_progress: Callable[[Any], None],
        limits: Limits,
    ) -> PoolOutcome:
        """Run ``execute`` on a worker; every way it can end is an outcome, not an
        exception (PoolError only when the pool itself cannot work)."""
        offline = self._offline_default and not network
        worker = await self._acquire(offline, token)
        if worker is None:
            return PoolOutcome("unstarted")
        flight = _Flight(execute.call_id, on_progress, asyncio.get_running_loop().create_future())
        worker.flight = flight
        self._counts["calls"] += 1
        try:
            self._apply_cgroup_limits(worker, limits)
            self._send(worker, execute)
            return await self._await_call(worker, flight, token, limits)
        finally:
            worker.flight = None
            worker.calls += 1
            self._after_call(worker)

    async def _await_call(
        self, worker: Worker, flight: _Flight, token: CancelToken, limits: Limits
    ) -> PoolOutcome:
        # One future, woken by whichever comes first: the result, the worker's end,
        # a cancel, or the wall time (callbacks, not a task per call: many may wait).
        loop = asyncio.get_running_loop()
        wake: asyncio.Future[None] = loop.create_future()

        def fire(*_: object) -> None:
            if not wake.done():
                wake.set_result(None)

        flight.result.add_done_callback(fire)
        worker.exited.add_done_callback(fire)
        untrack = token.on_cancel(fire)
        timer = loop.call_later(limits.wall_seconds, fire)
        try:
            await wake
        finally:
            timer.cancel()
            untrack()
            flight.result.remove_done_callback(fire)
            worker.exited.remove_done_callback(fire)
        if flight.result.done():
            return self._answered(worker, flight.result.result())
        if worker.exited.done():
            return self._lost(worker, limits)
        # Cancelled, or past its wall time: ask the worker to stop the tool (D4).
        overran = not token.requested
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker.pid, signal.SIGTERM)
        answer: set[asyncio.Future[Any]] = {flight.result, worker.exited}
        await asyncio.wait(
            answer,
            timeout=self.config.cancel_grace,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if flight.result.done():
            outcome = self._answered(worker, flight.result.result(), escalation="answered")
        elif worker.exited.done():
            return self._lost(worker, limits)
        else:
            why = "it ran past its wall time" if overran else "it did not stop when cancelled"
            await self._kill(worker, f"{why} and was killed")
            outcome = PoolOutcome("cancelled", escalation="killed", worker_id=worker.id)
        self._retire(worker)  # a fresh process for whatever comes next
        if overran and outcome.status in ("cancelled", "error"):
            return PoolOutcome(
                "limit",
                usage=outcome.usage,
                cause=f"wall time limit of {limits.wall_seconds:g} s",
                escalation=outcome.escalation,
                worker_id=worker.id,
            )
        return outcome

    def _answered(
        self, worker: Worker, result: Result, escalation: str | None = None
    ) -> PoolOutcome:
        # A call that was stopped, hit a limit, or left processes to clean up may have
        # left the worker in a state no next call should inherit.
        if (
            result.status == "cancelled"
            or result.result.get("error_code") == "limit_exceeded"
            or result.usage.get("ended_processes")
        ):
            self._retire(worker)
        return PoolOutcome(
            result.status,
            result.result,
            result.usage,
            result.stamps,
            escalation=escalation,
            worker_id=worker.id,
        )

    def _lost(self, worker: Worker, limits: Limits) -> PoolOutcome:
        exit_ = worker.exited.result()
        if exit_.oom:
            # The kernel's OOM killer ended the worker itself: the call met its
            # memory limit (X7), which is no crash of the worker.
            return PoolOutcome(
                "limit",
                cause=f"memory limit (memory_bytes = {limits.memory_bytes})",
                worker_id=worker.id,
            )
        return PoolOutcome("lost", cause=exit_.describe(), worker_id=worker.id)

    # -- workers ------------------------------------------------------------------------

    async def _acquire(self, offline: bool, token: CancelToken) -> Worker | None:
        """An idle worker of the right kind, waiting for one if need be; None when
        the token fires first."""
        if not self._open:
            raise PoolError("the pool is not running")
        for idle in self._workers.values():
            if idle.state is WorkerState.IDLE and idle.offline == offline:
                idle.state = WorkerState.BUSY
                return idle
        future: asyncio.Future[Worker | None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters[offline]
        waiters.append(future)
        self._grow(offline)

        def give_up(_: object) -> None:
            if not future.done():
                waiters.remove(future)
                future.set_result(None)

        untrack = token.on_cancel(give_up)
        try:
            worker = await future  # raises PoolError when workers cannot start
        except asyncio.CancelledError:
            if not future.done() or future.cancelled():  # our task's cancel cancels it
                waiters.remove(future)
            elif future.exception() is None:
                given = future.result()
                if given is not None:
                    self._release(given)  # handed over just as our task was cancelled
            raise
        finally:
            untrack()
        if worker is not None and token.requested:
            self._release(worker)
            return None
        return worker

    def _live(self) -> list[Worker]:
        return [
            w
            for w in self._workers.values()
            if w.state not in (WorkerState.DEAD, WorkerState.RETIRING)
        ]

    def _grow(self, offline: bool) -> None:
        """Start workers for the waiters no starting worker will serve, up to the
        maximum; make room by retiring idle workers of the other kind."""
        waiting = len(self._waiters[offline])
        starting = sum(
            1 for w in self._live() if w.state is WorkerState.STARTING and w.offline == offline
        )
        for _ in range(waiting - starting):
            if len(self._live()) >= self.config.max_workers:
                other = next(
                    (
                        w
                        for w in self._live()
                        if w.state is WorkerState.IDLE and w.offline != offline
                    ),
                    None,
                )
                if other is None:
                    return
                self._retire(other)
            self._spawn(offline)

    def _spawn(self, offline: bool) -> Worker:
        loop = asyncio.get_running_loop()
        worker_id = f"w{next(self._ids)}"
        cgroup = self._cgroups.create(worker_id) if self._cgroups is not None else None
        worker = Worker(worker_id, offline, cgroup, loop.create_future(), loop.create_future())
        self._workers[worker_id] = worker
        if cgroup is not None:
            limits = self.config.limits
            cgroup.set_memory(limits.memory_bytes)
            cgroup.set_pids(limits.processes)
            cgroup.set_cpu(self.config.worker_cpus)
            worker.oom_baseline = cgroup.oom_kills()
        config = WorkerConfig(
            worker_id=worker_id,
            endpoint=self.endpoint,
            heartbeat_interval=self.config.heartbeat_interval,
            limits=self.config.limits.to_dict(),
            profile=self.profile.to_dict(),
            policy=self._policy.to_dict(),
            cgroup_procs=tuple(str(p) for p in cgroup.procs_files()) if cgroup else (),
            offline=offline,
            limit_address_space=cgroup is None or "memory" not in cgroup.controllers,
        )
        self._counts["started"] += 1
        self._in_background(self._start_worker(worker, config))
        return worker

    async def _start_worker(self, worker: Worker, config: WorkerConfig) -> None:
        assert self._zygote is not None
        try:
            worker.pid = await self._zygote.spawn(
                worker.id, config.to_dict(), self.config.spawn_timeout
            )
            self._by_pid[worker.pid] = worker
            await asyncio.wait_for(asyncio.shield(worker.ready), self.config.spawn_timeout)
        except PoolError:
            pass  # it died while starting: _on_exit has dealt with it
        except (ZygoteError, TimeoutError) as exc:
            if worker.pid:
                await self._kill(worker, "it did not start in time")
            self._start_failed(worker, str(exc) or "it did not start in time")

    def _start_failed(self, worker: Worker, why: str) -> None:
        self._start_failures += 1
        log.error("worker %s failed to start: %s", worker.id, why)
        if not worker.ready.done():
            worker.ready.set_exception(PoolError(f"a worker failed to start: {why}"))
            worker.ready.exception()  # retrieved: the waiters get their own error
        self._forget(worker)
        if self._start_failures < 3:
            self._grow(worker.offline)  # try again for whoever waits
        else:
            # Starting more would fail the same way (a tool module that does not import…).
            self._fail_waiters(f"workers fail to start: {why}")

    def _fail_waiters(self, why: str) -> None:
        for waiters in self._waiters.values():
            while waiters:
                waiters.popleft().set_exception(PoolError(why))

    def _on_ready(self, worker: Worker, message: Ready) -> None:
        if message.version != PROTOCOL_VERSION:
            self._send(worker, Shutdown("protocol version mismatch"))
            self._start_failed(
                worker, f"it speaks protocol {message.version}, not {PROTOCOL_VERSION}"
            )
            return
        worker.ready_at = time.monotonic()
        if worker.replaces_exit_at is not None:
            self._replacement_ms.append((worker.ready_at - worker.replaces_exit_at) * 1000)
        self._start_failures = 0
        if not worker.ready.done():
            worker.ready.set_result(None)
        self._release(worker)

    def _release(self, worker: Worker) -> None:
        """The worker is free: give it to the first waiter of its kind, or idle it."""
        waiters = self._waiters[worker.offline]
        if waiters:
            worker.state = WorkerState.BUSY
            waiters.popleft().set_result(worker)
            return
        worker.state = WorkerState.IDLE
        # A waiter of the other kind may be stuck behind a full pool: make room.
        if self._waiters[not worker.offline]:
            self._grow(not worker.offline)

    def _after_call(self, worker: Worker) -> None:
        if worker.state in (WorkerState.DEAD, WorkerState.RETIRING):
            return
        if worker.calls >= self.config.max_calls_per_worker:
            self._retire(worker)
        elif worker.rss > self.config.max_worker_rss:
            log.info("recycling %s: %d bytes resident", worker.id, worker.rss)
            self._retire(worker)
        else:
            self._release(worker)

    def _retire(self, worker: Worker) -> None:
        """Shut the worker down once its call is over, and start its replacement."""
        if worker.state in (WorkerState.DEAD, WorkerState.RETIRING):
            return
        worker.state = WorkerState.RETIRING
        self._send(worker, Shutdown("retired"))
        self._replenish(worker.offline)

    def _replenish(self, offline: bool, exited_at: float | None = None) -> None:
        """Start a replacement when the pool is below its minimum or calls wait;
        ``exited_at`` (a death, not a retirement) times how long that takes."""
        if not self._open:
            return
        if len(self._live()) < self.config.min_workers:
            self._counts["replaced"] += 1
            self._spawn(offline).replaces_exit_at = exited_at
        elif self._waiters[offline]:
            self._counts["replaced"] += 1
            self._grow(offline)

    async def _kill(self, worker: Worker, reason: str) -> TerminationReport:
        """SIGKILL the worker and everything in its cgroup or under it."""
        worker.kill_reason = worker.kill_reason or reason
        targets: list[ProcessSet] = [ProcessTree(worker.pid)]
        if worker.cgroup is not None:
            targets.append(CgroupMembers(worker.cgroup.procs_files()))
        report = await asyncio.get_running_loop().run_in_executor(
            None, lambda: terminate(Together(*targets), grace=0)
        )
        if worker.cgroup is not None:
            worker.cgroup.kill_all()
        return report

    def _admits(self, pid: int) -> bool:
        """Whether a connection from ``pid`` may speak to the workers' socket: a child
        of our zygote that has not connected before (called from the ZAP thread)."""
        if pid in self._connected or self.zygote_pid is None:
            return False
        try:
            if psutil.Process(pid).ppid() != self.zygote_pid:
                return False
        except psutil.Error:
            return False
        self._connected.add(pid)
        return True

    def _on_exit(self, message: Exited) -> None:
        """The zygote reaped a worker: whatever it was doing is lost (D2)."""
        self._connected.discard(message.pid)  # the pid may come back as a new worker
        worker = self._by_pid.pop(message.pid, None)
        if worker is None:
            return
        oom = worker.cgroup is not None and worker.cgroup.oom_kills() > worker.oom_baseline
        planned = worker.state is WorkerState.RETIRING and message.exit_code == 0
        exit_ = WorkerExit(message.exit_code, message.signal, worker.kill_reason, oom)
        if not planned:
            log.warning("worker %s (pid %d) died: %s", worker.id, message.pid, exit_.describe())
        was_live = worker.state is not WorkerState.RETIRING
        worker.state = WorkerState.DEAD
        if not worker.exited.done():
            worker.exited.set_result(exit_)
        if not worker.ready.done():
            self._start_failed(worker, exit_.describe())
            return
        self._forget(worker)
        if was_live:
            self._replenish(worker.offline, exited_at=time.monotonic())

    def _forget(self, worker: Worker) -> None:
        worker.state = WorkerState.DEAD
        self._workers.pop(worker.id, None)
        self._by_pid.pop(worker.pid, None)
        if worker.cgroup is not None:
            worker.cgroup.kill_all()
            worker.cgroup.remove()

    def _on_zygote_death(self) -> None:
        """Every worker died with the zygote (parent death signal). Calls in flight
        are lost; the pool cannot go on."""
        self._open = False
        for worker in list(self._workers.values()):
            if not worker.exited.done():
                worker.exited.set_result(WorkerExit(None, signal.SIGKILL, "the zygote died"))
        self._fail_waiters("the zygote died")

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _apply_cgroup_limits(self, worker: Worker, limits: Limits) -> None:
        applied = (limits.memory_bytes, limits.processes)
        if worker.cgroup is None or worker.cgroup_limits == applied:
            return
        worker.cgroup.set_memory(limits.memory_bytes)
        worker.cgroup.set_pids(limits.processes)
        worker.cgroup_limits = applied

    # -- messages -----------------------------------------------------------------------

    def _send(self, worker: Worker, message: Message) -> None:
        if self._router is None or worker.state is WorkerState.DEAD:
            return
        try:
            self._router.send([worker.id.encode(), encode(message)])
        except zmq.ZMQError as exc:  # EHOSTUNREACH: it has not connected, or has gone
            log.info("could not send %s to %s: %s", message.type.value, worker.id, exc)

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("dropped a message of %d frames", len(frames))
            return
        identity, payload = frames
        worker = self._workers.get(identity.decode(errors="replace"))
        try:
            message = decode(payload)
        except ProtocolError as exc:
            log.warning("dropped a bad frame from %r: %s", identity, exc)
            return
        if worker is None:
            return
        worker.last_seen = time.monotonic()
        self._dispatch(worker, message)

    def _dispatch(self, worker: Worker, message: Message) -> None:
        flight = worker.flight
        match message:
            case Ready():
                self._on_ready(worker, message)
            case Heartbeat():
                worker.rss = message.rss
            case Progress() if flight is not None and flight.call_id == message.call_id:
                flight.on_progress(message.data)
            case Result() if flight is not None and flight.call_id == message.call_id:
                if not flight.result.done():
                    flight.result.set_result(message)
            case _:
                log.debug("ignored %s from %s", message.type.value, worker.id)

    async def _watch_heartbeats(self) -> None:
        """Kill workers that stopped heartbeating (hung: a tool holding the GIL in C,
        a stopped process…); their calls end as lost."""
        interval = self.config.heartbeat_interval
        silence = interval * self.config.heartbeat_misses
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for worker in list(self._workers.values()):
                watched = worker.state in (WorkerState.BUSY, WorkerState.IDLE, WorkerState.RETIRING)
                if watched and worker.kill_reason is None and now - worker.last_seen > silence:
                    reason = f"it hung (no heartbeat for {now - worker.last_seen:.1f} s)"
                    await self._kill(worker, reason)

    # -- looking in -------------------------------------------------------------------

    def statistics(self) -> PoolStatistics:
        states: dict[str, int] = {s.value: 0 for s in WorkerState if s is not WorkerState.DEAD}
        for worker in self._workers.values():
            if worker.state is not WorkerState.DEAD:
                states[worker.state.value] += 1
        return PoolStatistics(
            workers=states,
            queued=sum(len(waiters) for waiters in self._waiters.values()),
            started=self._counts["started"],
            replaced=self._counts["replaced"],
            calls=self._counts["calls"],
            profile=self.profile.to_dict(),
            replacement_ms=[round(ms, 3) for ms in self._replacement_ms],
        )

    def worker_pids(self) -> dict[str, int]:
        return {
            w.id: w.pid for w in self._workers.values() if w.pid and w.state is not WorkerState.DEAD
        }

    @property
    def cgroup_controllers(self) -> frozenset[str]:
        """The limits the workers' cgroups apply (memory, pids, cpu); empty without."""
        return frozenset() if self._cgroups is None else self._cgroups.controllers

    @property
    def zygote_pid(self) -> int | None:
        return None if self._zygote is None else self._zygote.pid

    def confines(self, pid: int) -> bool:
        """Whether ``pid`` is one of the pool's confined processes: the zygote, a
        worker, or anything they started (X2). Safe to call from any thread."""
        zygote = self.zygote_pid
        ancestors = {zygote} if zygote else set()
        marker = None if self._cgroups is None else f"/{self._cgroups.parent}/"
        return linux.lineage_includes(pid, ancestors, marker)

    def __repr__(self) -> str:
        s = self.statistics()
        w = s.workers
        return (
            f"<WorkerPool [{w['idle']} idle, {w['busy']} busy, {w['starting']} starting, "
            f"{w['retiring']} retiring; {s.queued} queued]>"
        )
