"""The worker pool: pre-started, sandboxed processes that run tools (SPEC D2-D4).

Workers are forked by a zygote, connect to a ZeroMQ ROUTER socket in a private
runtime directory, announce themselves (``Ready``) and heartbeat (the processes:
``processes.py``; their life as the pool sees it: ``supervisor.py``). A call goes to
an idle worker; when none is idle and the pool is below its maximum, a new one
starts (the planner's decisions: ``planner.py``).

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
The pool keeps ``min_workers`` alive, and outlives its zygote: one that dies or
hangs is replaced with its workers, and the calls waiting meanwhile run on the new
ones (SPEC L1, ``supervisor.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from toolpool.cancel import CancelToken
from toolpool.pool.calls import await_call, call_end
from toolpool.pool.planner import (
    Action,
    CallEnd,
    FailWaiters,
    GiveUp,
    HandOver,
    Idle,
    PoolState,
    ReplaceZygote,
    RetireWorker,
    StartWorker,
)
from toolpool.pool.supervisor import Supervisor
from toolpool.pool.workers import (
    Flight,
    OutcomeStatus,
    PoolConfig,
    PoolError,
    PoolOutcome,
    PoolStatistics,
    Worker,
    WorkerState,
)
from toolpool.protocol import Execute, Shutdown
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.profile import SandboxProfile

log = logging.getLogger("toolpool.pool")


class WorkerPool(Supervisor):
    """Runs calls on workers. What to start, hand over and retire is the planner's
    decision, carried out by ``_perform``; the workers' and the zygote's life is the
    ``Supervisor``'s, the processes are ``WorkerProcesses``'."""

    def __init__(self, config: PoolConfig | None = None) -> None:
        super().__init__(config or PoolConfig())
        # Calls waiting for a worker, by kind (offline or not), first come first
        # served. Only pending futures are kept: whoever settles one removes it.
        self._waiters: dict[bool, deque[asyncio.Future[Worker | None]]] = {
            False: deque(),
            True: deque(),
        }
        self._broken: str | None = None  # why no zygote can be started any more

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
        """End the background shells; stop every worker (politely: a Shutdown, and
        ``shutdown_grace`` seconds to exit before the kill; else the kill at once),
        the zygote and the socket; remove the cgroups and the runtime directory.
        Nothing is left running."""
        self._open = False
        self._fail_waiters("the pool is closed")
        await self.shells.close()
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
        await self._stop_supervision()
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
        wake = asyncio.get_running_loop().create_future()
        flight = Flight(execute.call_id, on_progress, wake, execute.context, limits)
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
        if self._broken is not None:
            raise PoolError(self._broken)
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
        if worker is not None and worker.state is WorkerState.DEAD:
            return await self._acquire(offline, token)  # lost with its zygote meanwhile
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
            zygote_up=self._zygote_up,
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
                case ReplaceZygote(reason=reason, delay=delay):
                    log.warning("replacing the zygote in %.2f s: %s", delay, reason)
                    self._begin_zygote_replacement(delay)
                case GiveUp(reason=reason):
                    log.error("the pool gives up: %s", reason)
                    self._broken = reason
                    self._fail_waiters(reason)
        return started

    def _fail_waiters(self, why: str) -> None:
        for waiters in self._waiters.values():
            while waiters:
                waiters.popleft().set_exception(PoolError(why))

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
            zygotes_replaced=self._counts["zygotes_replaced"],
            zygote_recovery_ms=[round(ms, 3) for ms in self._recovery_ms],
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
        worker, anything they started, a background shell (X2). Safe to call from any
        thread."""
        return self.processes.confines(pid) or self.shells.confines(pid)

    def __repr__(self) -> str:
        s = self.statistics()
        w = s.workers
        return (
            f"<WorkerPool [{w['idle']} idle, {w['busy']} busy, {w['starting']} starting, "
            f"{w['retiring']} retiring; {s.queued} queued]>"
        )
