"""The worker pool: pre-started, sandboxed processes that run tools (SPEC D2-D4).

Workers are forked by a zygote, connect to a ZeroMQ ROUTER socket in a private
runtime directory, announce themselves (``Ready``) and heartbeat: their processes
are ``processes.py``'s, their life and the zygote's the ``Supervisor``'s
(``supervisor.py``), which the pool holds and which tells it what happened. The pool
runs calls: each is a ``Call`` (``calls.py``), a small state machine driven by
callbacks — no task and no future per call. Calls that become ready in one turn of
the event loop are given to workers at the end of it, several to a frame where the
pool may hold calls at busy workers (``holding.py``, SPEC H4); when none can take a
call and the pool is below its maximum, the planner starts workers
(``planner.py``, which decides what to start, retire and replace).

How a call on a worker can end:
- its ``Result`` arrives: the result, with the worker's resource usage;
- it is cancelled (interrupt or abort): the worker is sent ``Cancel``, and has
  ``cancel_grace`` seconds to answer "cancelled" before it is killed;
- it runs past its wall time: the same, reported as a limit;
- the worker dies (crash, exit, OOM kill, CPU hard limit) or stops heartbeating
  (hung): an error result naming the cause — or, when the call is not known to have
  run to its end (held, or with a call held behind it), it runs again elsewhere.

A worker that was killed or died, or whose call was cancelled, overran a limit or
left processes behind, is replaced; a worker is also recycled after
``max_calls_per_worker`` calls or when its memory grows past ``max_worker_rss``.
The pool keeps ``min_workers`` alive, and outlives its zygote (SPEC L1).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from toolpool.cancel import CancelToken
from toolpool.pool.bindings import SessionBindings
from toolpool.pool.branch_changes import WorkspaceChanges
from toolpool.pool.branches import Branches
from toolpool.pool.calls import failed, unstarted
from toolpool.pool.dispatch import Dispatch
from toolpool.pool.egress import SessionEgress
from toolpool.pool.planner import (
    Action,
    CallEnd,
    FailWaiters,
    GiveUp,
    PoolPlanner,
    PoolState,
    ReplaceZygote,
    RetireWorker,
    StartWorker,
)
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.shell_bounds import ShellCaps
from toolpool.pool.shells import ShellSupervisor
from toolpool.pool.supervisor import ProcessesFactory, Supervisor
from toolpool.pool.workers import (
    Binding,
    Call,
    Done,
    Kind,
    OutcomeStatus,
    PoolConfig,
    PoolError,
    PoolOutcome,
    PoolStatistics,
    Worker,
    WorkerState,
)
from toolpool.protocol import EncodedExecute, Execute, Message
from toolpool.sandbox import command as sandbox_command
from toolpool.sandbox.limits import Limits
from toolpool.sandbox.profile import SandboxProfile

log = logging.getLogger("toolpool.pool")

# How often a read-only call runs again after a worker's death left it unknown whether
# it ran (SPEC H4): a call that crashes every worker it runs on ends worker_lost.
HOLD_RETRIES = 2


class WorkerPool:
    """Runs calls on workers (see the module): the calls' way is the ``dispatch``'s,
    the processes' and the zygote's life the ``supervisor``'s; what to start and
    retire is the planner's decision, carried out by ``_perform``."""

    def __init__(
        self, config: PoolConfig | None = None, *, processes: ProcessesFactory = WorkerProcesses
    ) -> None:
        self.config = config = config or PoolConfig()
        self.planner = PoolPlanner.from_config(config)
        self.supervisor = Supervisor(config, self, processes)
        # Background shells belong to sessions, not workers: the pool keeps them.
        caps = ShellCaps(
            per_client=config.max_background_shells_per_client,
            total=config.max_background_shells,
        )
        self.shells = ShellSupervisor(
            self.supervisor.processes,
            wall_seconds=config.background_wall_seconds,
            caps=caps,
        )
        # Checkpoints, rewinds and forks of the sessions' layers, and their changes out.
        self.branches = Branches(self.shells)
        self.workspace_changes = WorkspaceChanges(self.branches, self.shells.sandboxes)
        self.dispatch = Dispatch(config, self.supervisor, self.shells, self)
        self._workers = self.supervisor.workers  # the records, in start order
        self._tickets = itertools.count(1)
        # Sessions' own workers (A5, A6, N11): shipped tools, a network policy.
        self.bindings = SessionBindings(self.dispatch, self._workers, self.egress, self.retire)
        self.supervisor.netns_of = self.bindings.netns_of

    # -- life cycle ------------------------------------------------------------------

    async def start(self) -> None:
        """Probe the sandbox, open the socket, start the zygote and the minimum of
        workers, and wait until they are ready."""
        self.dispatch.loop = asyncio.get_running_loop()
        await self.supervisor.start()
        self.dispatch.open = True
        workers = self._perform(self.planner.initial(self.supervisor.offline_default))
        try:
            await asyncio.gather(*(w.ready for w in workers))
        except Exception:
            await self.close()
            raise

    async def close(self, *, polite: bool = True) -> None:
        """End the background shells; stop every worker (politely: a Shutdown, and
        ``shutdown_grace`` seconds to exit before the kill; else the kill at once),
        the zygote and the socket; remove the cgroups and the runtime directory.
        Nothing is left running, and every call has ended."""
        self.dispatch.open = False
        self.dispatch.fail_queued("the pool is closed")
        # What a branch thread does to a session's layers ends before the layers do.
        await asyncio.get_running_loop().run_in_executor(None, self.branches.close)
        await self.shells.close()
        await self.supervisor.close(polite=polite)
        await self.dispatch.settle()

    async def __aenter__(self) -> WorkerPool:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    @property
    def processes(self) -> WorkerProcesses:
        return self.supervisor.processes

    @property
    def egress(self) -> SessionEgress:
        """The policy sessions' network namespaces and their proxy (SPEC N3)."""
        return self.shells.sandboxes.egress

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

    def submit(
        self,
        execute: Execute | EncodedExecute,
        *,
        network: bool,
        token: CancelToken,
        on_progress: Callable[[Any], None],
        limits: Limits,
        done: Done,
        holdable: bool = False,
        on_preview: Callable[[Any, bool], None] | None = None,
        binding: Binding | None = None,
    ) -> Call:
        """Run ``execute`` (a message, or its frame: ``ExecuteFrames``) on a worker;
        returns at once. ``done(outcome)`` is called exactly once, from the event
        loop's thread (before ``submit`` returns when the answer is known at once):
        every way the call can end is an outcome — ``FAILED`` when the pool cannot run
        it (closed, no worker can start). ``limits`` are the call's (its wall time is
        counted here); ``holdable``: the call is read-only, so it may be held at a busy
        worker and run again elsewhere when a worker's death leaves it in doubt (SPEC
        H4). ``token`` cancels it: queued or held, it never starts. ``binding``: the
        call is of a session's shipped tools, for a worker of that binding
        (``bindings.bind``);
        every call of a policy session (its context's ``egress``) is its binding's.
        Returns the pool's record of the call."""
        encoded = execute if isinstance(execute, EncodedExecute) else EncodedExecute.of(execute)
        dispatch = self.dispatch
        offline = self.supervisor.offline_default and not network
        if binding is None and encoded.context.egress:
            # A policy session's calls run on its own workers, in its namespace (N11).
            binding = self.bindings.of_policy_session(encoded.context.session_id)
        kind: Kind = offline if binding is None else binding.kind(offline)
        call = Call(
            dispatch,
            encoded.call_id,
            encoded.ticket,
            encoded.frame,
            encoded.context,
            limits,
            kind=kind,
            holdable=holdable,
            token=token,
            on_progress=on_progress,
            on_preview=on_preview,
            done=done,
            retries=HOLD_RETRIES,
        )
        if not dispatch.open or dispatch.broken is not None:
            dispatch.end(call, failed(dispatch.broken or "the pool is not running"))
        elif encoded.context.egress and not (binding is not None and binding.egress):
            # Never outside its namespace: a binding made without saying so (a bug).
            dispatch.end(call, failed("the session's own workers are not in its network"))
        elif binding is not None and (binding.broken or binding.ended):
            dispatch.end(call, failed(binding.broken or "its session's tools were unbound"))
        elif token.requested:
            dispatch.end(call, unstarted())
        else:
            dispatch.add(call)
        return call

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
        """``submit``, awaited: the outcome; PoolError when the pool cannot run the
        call. Cancelling the awaiting task withdraws the call, as its token would."""
        future: asyncio.Future[PoolOutcome] = asyncio.get_running_loop().create_future()

        def done(outcome: PoolOutcome) -> None:
            if not future.done():
                future.set_result(outcome)

        call = self.submit(
            execute,
            network=network,
            token=token,
            on_progress=on_progress,
            limits=limits,
            done=done,
            holdable=holdable,
            on_preview=on_preview,
        )
        try:
            outcome = await future
        except asyncio.CancelledError:
            call.abandoned = True
            self.dispatch.cancel(call)
            raise
        if outcome.status is OutcomeStatus.FAILED:
            raise PoolError(outcome.cause or "the pool cannot run calls")
        return outcome

    # -- what the supervisor tells, and the planner's decisions -------------------------

    def worker_ready(self, worker: Worker) -> None:
        self.dispatch.release(worker)

    def worker_start_failed(self, worker: Worker, why: str, failures: int) -> None:
        binding, final = worker.binding, worker.load_failure is not None
        if binding is not None and worker.netns_failure is not None:
            # The calls that wait for it end so; the session's next call tries again.
            self._perform(self.planner.start_failed(self._state(), worker.kind, 0, why, final=True))
            return
        if binding is not None and final:
            # The payload does not load here; it will not load in the next worker.
            why = binding.broken = f"the session's tools could not be loaded in a worker: {why}"
        plan = self.planner.start_failed(self._state(), worker.kind, failures, why, final=final)
        self._perform(plan)

    def worker_exited(self, worker: Worker, replace: bool) -> None:
        self.dispatch.worker_exited(worker)
        if replace:
            plan = self.planner.replenish(self._state(), worker.kind)
            self._perform(plan, exited_at=time.monotonic())

    def worker_message(self, worker: Worker, message: Message) -> None:
        self.dispatch.worker_message(worker, message)

    def zygote_died(self, why: str, started: bool) -> None:
        self._perform(self.planner.zygote_died(self._state(), why, started))

    def zygote_start_failed(self, failures: int, why: str) -> None:
        self._perform(self.planner.zygote_start_failed(self._state(), failures, why))

    def zygote_started(self) -> None:
        self._perform(self.planner.zygote_started(self._state(), self.supervisor.offline_default))

    def retire_reason(self, worker: Worker, end: CallEnd) -> str | None:
        return self.planner.retire_reason(worker, end)

    def retire(self, worker: Worker, reason: str) -> None:
        self._perform(self.planner.retire(self._state(), worker.id, reason))

    def grow(self, kind: Kind) -> None:
        self._perform(self.planner.grow(self._state(), kind))

    def _state(self) -> PoolState:
        """The snapshot the planner decides on."""
        return PoolState(
            tuple(w for w in self._workers.values() if w.state is not WorkerState.DEAD),
            queued=self.dispatch.waiting_kinds(),
            open=self.dispatch.open,
            zygote_up=self.supervisor.zygote_up,
        )

    def _perform(self, actions: Iterable[Action], exited_at: float | None = None) -> list[Worker]:
        """Carry out the planner's actions, in order; the workers started.
        ``exited_at`` (a worker's death) times how long its replacement takes."""
        started: list[Worker] = []
        for action in actions:
            match action:
                case StartWorker(kind=kind, replacement=replacement):
                    worker = self.supervisor.spawn(
                        kind, replacement=replacement, exited_at=exited_at
                    )
                    started.append(worker)
                case RetireWorker(worker_id=worker_id, reason=reason):
                    worker = self._workers[worker_id]
                    log.debug("retiring %s: %s", worker_id, reason)
                    worker.state = WorkerState.RETIRING
                    self.dispatch.shut_down_when_free(worker)
                case FailWaiters(reason=reason, kind=kind):
                    self.dispatch.fail_queued(reason, kind)
                case ReplaceZygote(reason=reason, delay=delay):
                    log.warning("replacing the zygote in %.2f s: %s", delay, reason)
                    self.supervisor.replace_zygote(delay)
                case GiveUp(reason=reason):
                    log.error("the pool gives up: %s", reason)
                    self.dispatch.broken = reason
                    self.dispatch.fail_queued(reason)
        return started

    # -- looking in -------------------------------------------------------------------

    @property
    def sandbox_retries(self) -> int:
        """Confined starts tried again because the sandbox failed before its command
        (SPEC X12): a call's command in a worker, a background shell, or a session's
        sandbox (started in this process, which counts its own retries)."""
        own = sandbox_command.sandbox_retries()
        return self.dispatch.sandbox_retries + self.shells.sandbox_retries + own

    def statistics(self) -> PoolStatistics:
        dead = WorkerState.DEAD
        states: dict[str, int] = {s.value: 0 for s in WorkerState if s is not dead}
        for worker in self._workers.values():
            if worker.state is not dead:
                states[worker.state.value] += 1
        counts = self.supervisor.counts
        return PoolStatistics(
            workers=states,
            queued=sum(self.dispatch.waiting_kinds().values()),
            held=self.dispatch.held(),
            started=counts["started"],
            replaced=counts["replaced"],
            calls=self.dispatch.calls_done,
            profile=self.profile.to_dict(),
            replacement_ms=[round(ms, 3) for ms in self.supervisor.replacement_ms],
            zygotes_replaced=counts["zygotes_replaced"],
            zygote_recovery_ms=[round(ms, 3) for ms in self.supervisor.recovery_ms],
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
        worker, anything they started, a background shell, a command in a session's
        sandbox (X2). Safe to call from any
        thread."""
        return self.processes.confines(pid) or self.shells.confines(pid)

    def __repr__(self) -> str:
        s = self.statistics()
        w = s.workers
        return (
            f"<WorkerPool [{w['idle']} idle, {w['busy']} busy, {w['starting']} starting, "
            f"{w['retiring']} retiring; {s.queued} queued, {s.held} held]>"
        )
