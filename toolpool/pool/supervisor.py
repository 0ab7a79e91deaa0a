"""The pool's process side: workers starting, getting ready and ending; what the
workers and the zygote say (frames, heartbeats) and their silence; and the zygote's
death and replacement (SPEC D2, L1).

``WorkerPool`` (``pool.py``) builds on it: the call side (a call onto a worker and
back, the calls waiting for one) and ``_perform``, which carries out the planner's
actions. The planner decides here too — what replaces a worker or a zygote, when to
give up — and this side tells it what happened.

When the zygote dies (or is killed for not heartbeating), every worker it forked
dies with it (parent death signal): they are ended for sure, with whatever their
cgroups hold; their calls end as lost; a new zygote is started (retried with
backoff when it fails: ``PoolPlanner.zygote_start_failed``) and the minimum of
workers with it. Calls that wait meanwhile stay queued for the new workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from collections import deque
from collections.abc import Coroutine, Iterable
from typing import Any

from toolpool.pool.planner import Action, PoolPlanner, PoolState
from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.shell_bounds import ShellCaps
from toolpool.pool.shells import ShellSupervisor
from toolpool.pool.workers import (
    Flight,
    PoolConfig,
    PoolError,
    Worker,
    WorkerExit,
    WorkerState,
    drop_flight,
)
from toolpool.pool.zygote import ZygoteError
from toolpool.protocol import (
    PROTOCOL_VERSION,
    Exited,
    Heartbeat,
    Message,
    Preview,
    Progress,
    ProtocolError,
    Ready,
    Result,
    ShellRequest,
    Shutdown,
    Withdrawn,
    decode,
)
from toolpool.worker.channel import CONTROL_SUFFIX

log = logging.getLogger("toolpool.pool")


def _lost(worker: Worker) -> bool:
    """Whether the worker was lost (with its zygote) while we waited: a function, so
    that a check after an ``await`` is not taken for one made before it."""
    return worker.state is WorkerState.DEAD


class Supervisor:
    """The workers' records and their life, and the zygote's (see the module)."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        self.planner = PoolPlanner.from_config(config)
        self.processes = WorkerProcesses(
            config, self._on_frames, self._on_exit, self._on_zygote_death
        )
        # Background shells belong to sessions, not workers: the pool keeps them.
        caps = ShellCaps(
            per_client=config.max_background_shells_per_client,
            total=config.max_background_shells,
        )
        self.shells = ShellSupervisor(
            self.processes,
            wall_seconds=config.background_wall_seconds,
            cpus=config.worker_cpus,
            caps=caps,
        )
        self._workers: dict[str, Worker] = {}
        self._by_pid: dict[int, Worker] = {}
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Future[Any]] = set()
        self._endings: set[asyncio.Future[Any]] = set()  # lost workers being ended
        self._restart: asyncio.Task[None] | None = None  # a new zygote starting
        self._start_failures = 0
        self._zygote_failures = 0
        self._zygote_up = True
        self._zygote_lost_at: float | None = None  # until a new worker is ready
        self._counts = {"started": 0, "replaced": 0, "calls": 0, "zygotes_replaced": 0}
        self._worker_sandbox_retries = 0  # what the workers' results said (SPEC X12)
        self._replacement_ms: deque[float] = deque(maxlen=100)
        self._recovery_ms: deque[float] = deque(maxlen=100)
        self._open = False

    # -- what the call side provides -----------------------------------------------------

    def _state(self) -> PoolState:
        raise NotImplementedError

    def _perform(self, actions: Iterable[Action], exited_at: float | None = None) -> list[Worker]:
        raise NotImplementedError

    @property
    def _offline_default(self) -> bool:
        return self.processes.profile.active("netns")

    def _release(self, worker: Worker) -> None:
        self._perform(self.planner.release(self._state(), worker.id))

    @property
    def sandbox_retries(self) -> int:
        """Confined starts tried again because the sandbox failed before its command
        (SPEC X12): a call's command in a worker, or a background shell."""
        return self._worker_sandbox_retries + self.shells.sandbox_retries

    # -- a worker's life -------------------------------------------------------------------

    def _spawn(self, offline: bool) -> Worker:
        worker = self.processes.new_worker(f"w{next(self._ids)}", offline)
        self._workers[worker.id] = worker
        self._counts["started"] += 1
        self._in_background(self._start_worker(worker))
        return worker

    async def _start_worker(self, worker: Worker) -> None:
        try:
            config = await self.processes.prepare(worker)
        except OSError as exc:
            if not _lost(worker):
                self._start_failed(worker, f"its cgroup could not be made: {exc}")
            return
        if _lost(worker) or not self._open:
            # Lost (with its zygote), or the pool closes, while its cgroup was made:
            # never started (a closing pool removes the cgroup).
            return
        try:
            worker.pid = await self.processes.spawn(worker, config)
            self._by_pid[worker.pid] = worker
            await asyncio.wait_for(asyncio.shield(worker.ready), self.config.spawn_timeout)
        except PoolError:
            pass  # it died while starting: _on_exit (or the zygote's loss) has dealt with it
        except (ZygoteError, TimeoutError) as exc:
            if _lost(worker):
                return  # lost with its zygote
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

    def _on_ready(self, worker: Worker, message: Ready) -> None:
        if message.version != PROTOCOL_VERSION:
            self.processes.send(worker, Shutdown("protocol version mismatch"))
            self._start_failed(
                worker, f"it speaks protocol {message.version}, not {PROTOCOL_VERSION}"
            )
            return
        worker.lines_ready += 1
        if worker.lines_ready != 2:
            return  # its other line (calls, control) has not spoken yet
        worker.ready_at = time.monotonic()
        if worker.replaces_exit_at is not None:
            self._replacement_ms.append((worker.ready_at - worker.replaces_exit_at) * 1000)
        if self._zygote_lost_at is not None:
            self._recovery_ms.append((worker.ready_at - self._zygote_lost_at) * 1000)
            self._zygote_lost_at = None
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

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- the zygote's life (SPEC L1) -------------------------------------------------------

    def _on_zygote_death(self, why: str) -> None:
        """The zygote died (``why``: how); its workers died with it."""
        if not self._zygote_up:
            return  # a replacement that did not start: _replace_zygote hears of it
        self._zygote_up = False
        started = self.processes.zygote_started
        if started:
            self._zygote_lost_at = time.monotonic()
            self._lose_workers(f"the zygote that forked it died ({why})")
        self._perform(self.planner.zygote_died(self._state(), why, started))

    def _lose_workers(self, cause: str) -> None:
        """Every worker is gone with the zygote: their calls end as lost, their records
        go now, and whatever is left of their processes and cgroups is ended."""
        lost = [w for w in self._workers.values() if w.state is not WorkerState.DEAD]
        for worker in lost:
            worker.state = WorkerState.DEAD
            worker.kill_reason = worker.kill_reason or cause
            self._workers.pop(worker.id, None)
            self._by_pid.pop(worker.pid, None)
            self.processes.exited(worker.pid)
            if not worker.exited.done():
                worker.exited.set_result(WorkerExit(None, signal.SIGKILL, worker.kill_reason))
            if not worker.ready.done():
                worker.ready.set_exception(PoolError(f"a worker failed to start: {cause}"))
                worker.ready.exception()  # retrieved: its waiters stay queued
        ending = asyncio.ensure_future(self._end_lost(lost, cause))
        self._endings.add(ending)
        ending.add_done_callback(self._endings.discard)

    async def _end_lost(self, workers: list[Worker], cause: str) -> None:
        await self.processes.terminate([w for w in workers if w.pid], cause)
        for worker in workers:
            self.processes.forget(worker)

    def _begin_zygote_replacement(self, delay: float) -> None:
        self._restart = asyncio.ensure_future(self._replace_zygote(delay))

    async def _replace_zygote(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self.processes.restart_zygote()
        except Exception as exc:  # ZygoteError, or anything else: the calls must not hang
            self._zygote_failures += 1
            log.error("a new zygote failed to start (%d in a row): %s", self._zygote_failures, exc)
            failures = self._zygote_failures
            self._perform(self.planner.zygote_start_failed(self._state(), failures, str(exc)))
            return
        log.warning("a new zygote (pid %s) replaced the one that died", self.processes.zygote_pid)
        self._zygote_up = True
        self._zygote_failures = 0
        self._counts["zygotes_replaced"] += 1
        self._perform(self.planner.zygote_started(self._state(), self._offline_default))

    async def _stop_supervision(self) -> None:
        """Stop the watch and a zygote's replacement; wait for lost workers' ends."""
        for task in [*self._tasks, *([self._restart] if self._restart else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*self._endings)

    # -- messages --------------------------------------------------------------------------

    def _on_frames(self, frames: list[bytes]) -> None:
        if len(frames) != 2:
            log.warning("dropped a message of %d frames", len(frames))
            return
        identity, payload = frames
        name = identity.decode(errors="replace")
        control = name.endswith(CONTROL_SUFFIX)
        worker = self._workers.get(name.removesuffix(CONTROL_SUFFIX) if control else name)
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
        # The worker runs its calls in order, and its messages come in order: the
        # first flight is the one a Progress, Result or ShellRequest is from.
        flights = worker.flights
        flight = flights[0] if flights else None
        match message:
            case Ready():
                self._on_ready(worker, message)
            case Heartbeat():
                worker.rss = message.rss
            case Progress() if flight is not None and flight.call_id == message.call_id:
                flight.on_progress(message.data)
            case Preview() if flight is not None and flight.call_id == message.call_id:
                if flight.on_preview is not None:
                    flight.on_preview(message.data, message.truncated)
            case Result() if flight is not None and flight.call_id == message.call_id:
                self._worker_sandbox_retries += int(message.usage.get("sandbox_retries", 0))
                flights.popleft()
                flight.answer(message)
                if flights:
                    flights[0].promote()  # it started as this one ended
            case Withdrawn():
                taken = next((f for f in flights if f.ticket == message.ticket), None)
                if taken is not None:
                    drop_flight(worker, taken)
                    taken.give_back()
            case ShellRequest() if flight is not None and flight.call_id == message.call_id:
                self._in_background(self._answer_shell(worker, flight, message))
            case _:
                log.debug("ignored %s from %s", message.type.value, worker.id)

    async def _answer_shell(self, worker: Worker, flight: Flight, request: ShellRequest) -> None:
        """A call's background shell request, for the session of that call."""
        reply = await self.shells.answer(request, flight.context, flight.limits)
        self.processes.send(worker, reply)

    async def _watch_heartbeats(self) -> None:
        """Kill workers that stopped heartbeating (hung: a tool holding the GIL in C,
        a stopped process…), whose calls end as lost; and a zygote that did, which is
        then replaced with its workers."""
        interval = self.config.heartbeat_interval
        silence = interval * self.config.heartbeat_misses
        tick = time.monotonic()
        while True:
            await asyncio.sleep(interval)
            # After a stall of the loop, the zygote's frames may still wait in its pipe
            # reader's queue: no judgment until they are read.
            stalled, tick = time.monotonic() - tick > 2 * interval, time.monotonic()
            quiet = self.processes.zygote_silence()
            if self._zygote_up and not stalled and quiet is not None and quiet > silence:
                log.error("the zygote hung (no heartbeat for %.1f s): killing it", quiet)
                await self.processes.kill_zygote(f"it hung: no heartbeat for {quiet:.1f} s")
                continue
            now = time.monotonic()
            for worker in list(self._workers.values()):
                watched = worker.state in (WorkerState.BUSY, WorkerState.IDLE, WorkerState.RETIRING)
                if watched and worker.kill_reason is None and now - worker.last_seen > silence:
                    reason = f"it hung (no heartbeat for {now - worker.last_seen:.1f} s)"
                    await self.processes.terminate([worker], reason)
