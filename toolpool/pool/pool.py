"""The worker pool: pre-started, sandboxed processes that run tools (SPEC D2-D4).

Workers are forked by a zygote, connect to a ZeroMQ ROUTER socket in a private
runtime directory, announce themselves (``Ready``) and heartbeat (all of which is
``processes.py``). A call goes to an idle worker; when none is idle and the pool is
below its maximum, a new one starts (the planner's decisions: ``planner.py``).

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
import itertools
import logging
import signal
import time
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from toolpool.cancel import CancelToken
from toolpool.pool.calls import await_call, call_end
from toolpool.pool.planner import (
    Action,
    CallEnd,
    FailWaiters,
    HandOver,
    Idle,
    PoolPlanner,
    PoolState,
    RetireWorker,
    StartWorker,
)
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.workers import (
    Flight,
    OutcomeStatus,
    PoolConfig,
    PoolError,
    PoolOutcome,
    PoolStatistics,
    Worker,
    WorkerExit,
    WorkerState,
)
from toolpool.pool.zygote import ZygoteError
from toolpool.protocol import (
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
)
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.profile import SandboxProfile
from toolpool.worker.main import WorkerConfig

log = logging.getLogger("toolpool.pool")


class WorkerPool:
    """Runs calls on workers. What to start, hand over and retire is the planner's
    decision, carried out by ``_perform``; the processes are ``WorkerProcesses``'."""

    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self.planner = PoolPlanner.from_config(self.config)
        self.processes = WorkerProcesses(
            self.config, self._on_frames, self._on_exit, self._on_zygote_death
        )
        self._workers: dict[str, Worker] = {}
        self._by_pid: dict[int, Worker] = {}
        # Calls waiting for a worker, by kind (offline or not), first come first
        # served. Only pending futures are kept: whoever settles one removes it.
        self._waiters: dict[bool, deque[asyncio.Future[Worker | None]]] = {
            False: deque(),
            True: deque(),
        }
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Future[Any]] = set()
        self._start_failures = 0
        self._counts = {"started": 0, "replaced": 0, "calls": 0}
        self._replacement_ms: deque[float] = deque(maxlen=100)
        self._open = False

    # -- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Probe the sandbox, open the socket, start the zygote and the minimum of
        workers, and wait until they are ready."""
        await self.processes.open()
        self._open = True
        self._tasks = [asyncio.ensure_future(self._watch_heartbeats())]
        workers = self._perform(self.planner.initial(self._offline_default))
        try:
            await asyncio.gather(*(w.ready for w in workers))
        except Exception:
            await self.close()
            raise

    async def close(self, *, polite: bool = True) -> None:
        """Stop every worker (politely: a Shutdown, and ``shutdown_grace`` seconds to
        exit before the kill; else the kill at once), the zygote and the socket;
        remove the cgroups and the runtime directory. Nothing is left running."""
        self._open = False
        self._fail_waiters("the pool is closed")
        live = [w for w in self._workers.values() if w.state is not WorkerState.DEAD]
        for worker in live if polite else ():
            if worker.state is WorkerState.STARTING:
                continue  # not connected yet: it cannot hear a Shutdown
            worker.state = WorkerState.RETIRING
            self.processes.send(worker, Shutdown("pool closing"))
        running = [w for w in live if w.pid and not w.exited.done()]
        told = [w for w in running if polite and w.state is WorkerState.RETIRING]
        await asyncio.gather(
            self.processes.terminate(told, "the pool closed", grace=self.config.shutdown_grace),
            self.processes.terminate([w for w in running if w not in told], "the pool closed"),
        )
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.processes.close(self._workers.values())

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def profile(self) -> SandboxProfile:
        return self.processes.profile

    @property
    def endpoint(self) -> str:
        return self.processes.endpoint

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
            return PoolOutcome(OutcomeStatus.UNSTARTED)
        flight = Flight(execute.call_id, on_progress, asyncio.get_running_loop().create_future())
        worker.flight = flight
        self._counts["calls"] += 1
        end = CallEnd()
        try:
            self.processes.apply_limits(worker, limits)
            self.processes.send(worker, execute)
            outcome, stopped = await await_call(
                worker, flight, token, limits, self.config.cancel_grace, self.processes
            )
            end = call_end(outcome, stopped)
            return outcome
        finally:
            worker.flight = None
            worker.calls += 1
            self._perform(self.planner.after_call(self._state(), worker.id, end))

    # -- workers ------------------------------------------------------------------------

    async def _acquire(self, offline: bool, token: CancelToken) -> Worker | None:
        """An idle worker of the right kind, waiting for one if need be; None when
        the token fires first."""
        if not self._open:
            raise PoolError("the pool is not running")
        idle = self.planner.idle_worker(self._state(), offline)
        if idle is not None:
            self._workers[idle].state = WorkerState.BUSY
            return self._workers[idle]
        future: asyncio.Future[Worker | None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters[offline]
        waiters.append(future)
        self._perform(self.planner.grow(self._state(), offline))

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

    def _state(self) -> PoolState:
        """The snapshot the planner decides on."""
        return PoolState(
            tuple(w for w in self._workers.values() if w.state is not WorkerState.DEAD),
            waiting_online=len(self._waiters[False]),
            waiting_offline=len(self._waiters[True]),
            open=self._open,
        )

    def _perform(self, actions: Iterable[Action], exited_at: float | None = None) -> list[Worker]:
        """Carry out the planner's actions, in order; the workers started.
        ``exited_at`` (a worker's death) times how long its replacement takes."""
        started: list[Worker] = []
        for action in actions:
            match action:
                case StartWorker(offline=offline, replacement=replacement):
                    worker = self._spawn(offline)
                    if replacement:
                        self._counts["replaced"] += 1
                        worker.replaces_exit_at = exited_at
                    started.append(worker)
                case RetireWorker(worker_id=worker_id, reason=reason):
                    worker = self._workers[worker_id]
                    log.debug("retiring %s: %s", worker_id, reason)
                    worker.state = WorkerState.RETIRING
                    self.processes.send(worker, Shutdown("retired"))
                case HandOver(worker_id=worker_id):
                    worker = self._workers[worker_id]
                    worker.state = WorkerState.BUSY
                    self._waiters[worker.offline].popleft().set_result(worker)
                case Idle(worker_id=worker_id):
                    self._workers[worker_id].state = WorkerState.IDLE
                case FailWaiters(reason=reason):
                    self._fail_waiters(reason)
        return started

    def _release(self, worker: Worker) -> None:
        self._perform(self.planner.release(self._state(), worker.id))

    def _spawn(self, offline: bool) -> Worker:
        worker, config = self.processes.new_worker(f"w{next(self._ids)}", offline)
        self._workers[worker.id] = worker
        self._counts["started"] += 1
        self._in_background(self._start_worker(worker, config))
        return worker

    async def _start_worker(self, worker: Worker, config: WorkerConfig) -> None:
        try:
            worker.pid = await self.processes.spawn(worker, config)
            self._by_pid[worker.pid] = worker
            await asyncio.wait_for(asyncio.shield(worker.ready), self.config.spawn_timeout)
        except PoolError:
            pass  # it died while starting: _on_exit has dealt with it
        except (ZygoteError, TimeoutError) as exc:
            if worker.pid:
                await self.processes.terminate([worker], "it did not start in time")
            self._start_failed(worker, str(exc) or "it did not start in time")

    def _start_failed(self, worker: Worker, why: str) -> None:
        self._start_failures += 1
        log.error("worker %s failed to start: %s", worker.id, why)
        if not worker.ready.done():
            worker.ready.set_exception(PoolError(f"a worker failed to start: {why}"))
            worker.ready.exception()  # retrieved: the waiters get their own error
        self._forget(worker)
        self._perform(
            self.planner.start_failed(self._state(), worker.offline, self._start_failures, why)
        )

    def _fail_waiters(self, why: str) -> None:
        for waiters in self._waiters.values():
            while waiters:
                waiters.popleft().set_exception(PoolError(why))

    def _on_ready(self, worker: Worker, message: Ready) -> None:
        if message.version != PROTOCOL_VERSION:
            self.processes.send(worker, Shutdown("protocol version mismatch"))
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

    def _on_exit(self, message: Exited) -> None:
        """The zygote reaped a worker: whatever it was doing is lost (D2)."""
        self.processes.exited(message.pid)
        worker = self._by_pid.pop(message.pid, None)
        if worker is None:
            return
        oom = self.processes.oom_killed(worker)
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
            plan = self.planner.replenish(self._state(), worker.offline)
            self._perform(plan, exited_at=time.monotonic())

    def _forget(self, worker: Worker) -> None:
        worker.state = WorkerState.DEAD
        self._workers.pop(worker.id, None)
        self._by_pid.pop(worker.pid, None)
        self.processes.forget(worker)

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

    # -- messages -----------------------------------------------------------------------

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
                    await self.processes.terminate([worker], reason)

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
        cgroups = self.processes.cgroups
        return frozenset() if cgroups is None else cgroups.controllers

    @property
    def zygote_pid(self) -> int | None:
        return self.processes.zygote_pid

    def confines(self, pid: int) -> bool:
        """Whether ``pid`` is one of the pool's confined processes: the zygote, a
        worker, or anything they started (X2). Safe to call from any thread."""
        return self.processes.confines(pid)

    def __repr__(self) -> str:
        s = self.statistics()
        w = s.workers
        return (
            f"<WorkerPool [{w['idle']} idle, {w['busy']} busy, {w['starting']} starting, "
            f"{w['retiring']} retiring; {s.queued} queued]>"
        )
