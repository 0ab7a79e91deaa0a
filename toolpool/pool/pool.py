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
import itertools
import logging
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from toolpool.cancel import CancelToken
from toolpool.pool.calls import await_call, call_end
from toolpool.pool.calls import lost as lost_outcome
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
    drop_flight,
)
from toolpool.protocol import Cancel, Execute, Shutdown
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.profile import SandboxProfile

log = logging.getLogger("toolpool.pool")

# How often a read-only call runs again after a worker's death left it unknown whether
# it ran (SPEC H4): a call that crashes every worker it runs on ends worker_lost.
HOLD_RETRIES = 2


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
        # Waiters that may be held at a busy worker: their cgroup limits.
        self._holdable: dict[asyncio.Future[Worker | None], tuple[int, int]] = {}
        self._tickets = itertools.count(1)

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

    def ticket(self) -> int:
        """A new call's number, unique in the pool (``Execute.ticket``)."""
        return next(self._tickets)

    async def run(
        self,
        execute: Execute,
        *,
        network: bool,
        token: CancelToken,
        on_progress: Callable[[Any], None],
        limits: Limits,
        holdable: bool = False,
        on_preview: Callable[[Any, bool], None] | None = None,
    ) -> PoolOutcome:
        """Run ``execute`` on a worker; every way it can end is an outcome, not an
        exception (PoolError only when the pool itself cannot work). ``holdable``: the
        call may be held at a busy worker (it is read-only: should that worker die
        before the call is known to have started, it runs again elsewhere)."""
        offline = self._offline_default and not network
        holding = holdable and self.config.hold_calls
        hold = (limits.memory_bytes, limits.processes) if holding else None
        # Runs elsewhere after a worker's death that leaves it unknown whether the call
        # ran (held, or with a call held behind it): read-only calls only, and this often.
        retries = HOLD_RETRIES
        while True:
            worker = await self._acquire(offline, token, hold)
            if worker is None:
                return PoolOutcome(OutcomeStatus.UNSTARTED)
            wake = asyncio.get_running_loop().create_future()
            flight = Flight(
                execute.call_id,
                on_progress,
                wake,
                execute.context,
                limits,
                ticket=execute.ticket,
                held=bool(worker.flights),
                holdable=holdable,
                on_preview=on_preview,
            )
            if flight.held:
                worker.flights[0].behind = True
            worker.flights.append(flight)
            ran = False
            end = CallEnd()
            try:
                if not flight.held:
                    self.processes.apply_limits(worker, limits)
                self.processes.send(worker, execute)
                ended = await await_call(
                    worker, flight, token, limits, self.config.cancel_grace, self.processes
                )
                lost = ended is not None and ended[0].status is OutcomeStatus.LOST
                in_doubt = (ended is None and worker.exited.done()) or (lost and flight.behind)
                if in_doubt and retries and not token.requested:
                    retries -= 1
                    log.info("running %s again: its worker died, not known when", flight.call_id)
                    continue
                if ended is None:
                    if not worker.exited.done():
                        continue  # given back unstarted: run it elsewhere
                    ended = lost_outcome(worker, limits), False
                ran = True
                outcome, stopped = ended
                end = call_end(outcome, stopped)
                return outcome
            finally:
                drop_flight(worker, flight)
                worker.assigned -= 1
                self._shut_down_when_free(worker)
                if ran:
                    self._counts["calls"] += 1
                    worker.calls += 1
                    self._after_call(worker, end)
                elif not worker.assigned:
                    self._release(worker)

    def _after_call(self, worker: Worker, end: CallEnd) -> None:
        """A call on the worker ended: retire or release it — or, when another call
        has it still (held, now running), retire it after that one, or offer its free
        place to a waiter."""
        if not worker.assigned:
            self._perform(self.planner.after_call(self._state(), worker.id, end))
            return
        reason = self.planner.retire_reason(worker, end)
        if reason is not None:
            self._perform(self.planner.retire(self._state(), worker.id, reason))
        else:
            self._offer_place(worker)

    def _shut_down_when_free(self, worker: Worker) -> None:
        """Tell a retiring worker to shut down once no call is given it any more: not
        while a held call runs there, whose Result the exit could overtake (the
        zygote reports exits on another channel than the worker's frames)."""
        if worker.state is WorkerState.RETIRING and not worker.assigned:
            self.processes.send(worker, Shutdown("retired"))

    def _take(self, worker: Worker) -> Worker:
        """``worker`` is given to a call."""
        worker.state = WorkerState.BUSY
        worker.assigned += 1
        return worker

    def _untake(self, worker: Worker) -> None:
        """A call given ``worker`` will not run there after all."""
        worker.assigned -= 1
        if not worker.assigned:
            self._release(worker)

    # -- holding calls at busy workers (SPEC H4) ------------------------------------------

    def _can_hold(self, worker: Worker, hold: tuple[int, int]) -> bool:
        """Whether ``worker`` may take a call to hold behind its running one: it runs
        one, which no cancel has reached; it will not be recycled before the held
        call runs; and its cgroup already has the held call's limits."""
        return (
            worker.state is WorkerState.BUSY
            and worker.assigned == 1
            and len(worker.flights) == 1
            and worker.flights[0].holdable  # it too may run again, should the held one crash
            and not worker.flights[0].cancel_sent
            and worker.kill_reason is None
            and worker.calls + 1 < self.config.max_calls_per_worker
            and (worker.cgroup is None or worker.cgroup_limits == hold)
        )

    def _holder(self, offline: bool, hold: tuple[int, int]) -> Worker | None:
        """A busy worker of this kind to hold the call, when the pool is at its
        maximum (else a new worker is the better place) and no worker of the kind is
        starting."""
        live = [w for w in self._workers.values() if w.state is not WorkerState.DEAD]
        if len([w for w in live if w.state is not WorkerState.RETIRING]) < self.config.max_workers:
            return None
        if any(w.state is WorkerState.STARTING and w.offline == offline for w in live):
            return None
        for worker in live:
            if worker.offline == offline and self._can_hold(worker, hold):
                return worker
        return None

    def _offer_place(self, worker: Worker) -> None:
        """The worker's held call became its running one: the first waiter of its kind
        that may be held there gets the place."""
        waiters = self._waiters[worker.offline]
        for future in waiters:
            hold = self._holdable.get(future)
            if hold is not None and self._can_hold(worker, hold):
                waiters.remove(future)
                future.set_result(self._take(worker))
                return

    def _recall_held(self, idle: Worker) -> None:
        """``idle`` has nothing to do while a call is held behind a running one
        elsewhere: that worker is asked to give it back (``Cancel`` with
        ``running=False``), to run here."""
        for worker in self._workers.values():
            if worker is idle or worker.offline != idle.offline or len(worker.flights) < 2:
                continue
            held = worker.flights[1]
            if held.held and not held.recalled and not held.cancel_sent:
                held.recalled = True
                self.processes.send(worker, Cancel(held.ticket, running=False), control=True)
                return

    # -- workers ------------------------------------------------------------------------

    async def _acquire(
        self, offline: bool, token: CancelToken, hold: tuple[int, int] | None = None
    ) -> Worker | None:
        """An idle worker of the right kind — or, for a call that may be held (its
        cgroup limits: ``hold``), a busy one to hold it — waiting for one if need be;
        None when the token fires first."""
        if not self._open:
            raise PoolError("the pool is not running")
        if self._broken is not None:
            raise PoolError(self._broken)
        idle = self.planner.idle_worker(self._state(), offline)
        if idle is not None:
            return self._take(self._workers[idle])
        if hold is not None:
            holder = self._holder(offline, hold)
            if holder is not None:
                return self._take(holder)
        future: asyncio.Future[Worker | None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters[offline]
        waiters.append(future)
        if hold is not None:
            self._holdable[future] = hold
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
                    self._untake(given)  # handed over just as our task was cancelled
            raise
        finally:
            untrack()
            self._holdable.pop(future, None)
        if worker is not None and worker.state is WorkerState.DEAD:
            worker.assigned -= 1
            return await self._acquire(offline, token, hold)  # lost with its zygote meanwhile
        if worker is not None and token.requested:
            self._untake(worker)
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
                    self._shut_down_when_free(worker)
                case HandOver(worker_id=worker_id):
                    worker = self._workers[worker_id]
                    self._waiters[worker.offline].popleft().set_result(self._take(worker))
                case Idle(worker_id=worker_id):
                    worker = self._workers[worker_id]
                    worker.state = WorkerState.IDLE
                    self._recall_held(worker)
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
            held=sum(1 for w in self._workers.values() for flight in w.flights if flight.held),
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
