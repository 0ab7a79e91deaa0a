"""The pool's process side: workers starting, getting ready and ending; what the
workers and the zygote say (frames, heartbeats) and their silence; and the zygote's
death and replacement (SPEC D2, L1).

``Supervisor`` knows nothing of calls, waiters or the planner. ``WorkerPool``
(``pool.py``) holds one and tells it what to do (start a worker, send it frames,
end it, replace the zygote); it tells the pool what happened, through the
``WorkerEvents`` the pool gives it: a worker is ready, failed to start or ended, a
worker's message about a call came, the zygote died, a new one started or failed to.
The dependency runs one way: this module imports nothing of the call side.

When the zygote dies (or is killed for not heartbeating), every worker it forked
dies with it (parent death signal): they are ended for sure, with whatever their
cgroups hold, and each is reported ended; then the zygote's death is reported, and
the pool decides (the planner: ``zygote_died``) to start a new one.
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
from typing import Any, Protocol

from toolpool.pool.processes import WorkerProcesses
from toolpool.pool.workers import Kind, PoolConfig, PoolError, Worker, WorkerExit, WorkerState
from toolpool.pool.zygote import ZygoteError
from toolpool.protocol import (
    PROTOCOL_VERSION,
    Exited,
    Heartbeat,
    Message,
    ProtocolError,
    Ready,
    Shutdown,
    decode,
)
from toolpool.sandbox.session_box import SandboxStartError
from toolpool.worker.channel import CONTROL_SUFFIX

log = logging.getLogger("toolpool.pool")

# How a WorkerProcesses is made: its settings, and where its frames, the workers'
# exits and the zygote's death go (a test gives a stand-in).
ProcessesFactory = Callable[
    [PoolConfig, Callable[[list[bytes]], None], Callable[[Exited], None], Callable[[str], None]],
    WorkerProcesses,
]


class WorkerEvents(Protocol):
    """What the supervisor tells its pool."""

    def worker_ready(self, worker: Worker) -> None:
        """``worker`` connected both its lines: it is idle."""

    def worker_start_failed(self, worker: Worker, why: str, failures: int) -> None:
        """``worker`` never got ready (``failures``: in a row); it is forgotten."""

    def worker_exited(self, worker: Worker, replace: bool) -> None:
        """``worker`` ended (``worker.exit`` says how); whatever it ran is lost.
        ``replace``: it was live (not retiring, not lost with its zygote)."""

    def worker_message(self, worker: Worker, message: Message) -> None:
        """A message of ``worker``'s about its calls (neither Ready nor Heartbeat)."""

    def zygote_died(self, why: str, started: bool) -> None:
        """The zygote died (its workers were reported ended first); ``started``: it
        had imported its tool modules."""

    def zygote_start_failed(self, failures: int, why: str) -> None: ...

    def zygote_started(self) -> None: ...


def _lost(worker: Worker) -> bool:
    """Whether the worker was lost (with its zygote) while we waited: a function, so
    that a check after an ``await`` is not taken for one made before it."""
    return worker.state is WorkerState.DEAD


class Supervisor:
    """The workers' records and their life, and the zygote's (see the module)."""

    def __init__(
        self,
        config: PoolConfig,
        events: WorkerEvents,
        processes: ProcessesFactory = WorkerProcesses,
    ) -> None:
        self.config = config
        self.events = events
        self.processes = processes(config, self._on_frames, self._on_exit, self._on_zygote_death)
        self.workers: dict[str, Worker] = {}  # not dead, in start order
        self._by_pid: dict[int, Worker] = {}
        self._lines: dict[bytes, Worker] = {}  # a worker's two ZeroMQ identities
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Future[Any]] = set()
        self._endings: set[asyncio.Future[Any]] = set()  # lost workers being ended
        self._restart: asyncio.Task[None] | None = None  # a new zygote starting
        self._start_failures = 0
        self._zygote_failures = 0
        self.zygote_up = True  # False from a zygote's death until a new one started
        self._zygote_lost_at: float | None = None  # until a new worker is ready
        self.counts = {"started": 0, "replaced": 0, "zygotes_replaced": 0}
        self.replacement_ms: deque[float] = deque(maxlen=100)
        self.recovery_ms: deque[float] = deque(maxlen=100)
        self.open = False
        # Whether workers of network-less sessions live in a namespace of their own
        # (the sandbox profile's, once probed).
        self.offline_default = False
        # (In a thread.) A policy session's network namespace: its path and inode
        # (the pool's, which owns the sessions' networks; N11).
        self.netns_of: Callable[[str], tuple[str, int]] = _no_netns

    async def start(self) -> None:
        """Probe the sandbox, open the socket, start the zygote and the watch."""
        await self.processes.open()
        self.offline_default = self.processes.profile.active("netns")
        self.open = True
        self._tasks = [asyncio.ensure_future(self._watch_heartbeats())]

    async def close(self, *, polite: bool = True) -> None:
        """Stop every worker (politely: a Shutdown, and ``shutdown_grace`` seconds to
        exit before the kill; else the kill at once), the zygote and the socket;
        remove the cgroups and the runtime directory. Nothing is left running."""
        self.open = False
        live = [w for w in self.workers.values() if w.state is not WorkerState.DEAD]
        for worker in live if polite else ():
            if worker.state is WorkerState.STARTING:
                continue  # not connected yet: it cannot hear a Shutdown
            worker.state = WorkerState.RETIRING
            self.processes.send(worker, Shutdown("pool closing"))
        running = [w for w in live if w.pid and w.exit is None]
        told = [w for w in running if polite and w.state is WorkerState.RETIRING]
        await asyncio.gather(
            self.processes.terminate(told, "the pool closed", grace=self.config.shutdown_grace),
            self.processes.terminate([w for w in running if w not in told], "the pool closed"),
        )
        for task in [*self._tasks, *([self._restart] if self._restart else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await asyncio.gather(*self._endings)
        await self.processes.close(self.workers.values())

    # -- what the pool asks ------------------------------------------------------------

    def spawn(
        self, kind: Kind, *, replacement: bool = False, exited_at: float | None = None
    ) -> Worker:
        """Start a worker of ``kind``; ``replacement``: in place of one that ended (at
        ``exited_at``, when known) or retired."""
        worker = self.processes.new_worker(f"w{next(self._ids)}", kind)
        self.workers[worker.id] = worker
        self._lines[worker.id.encode()] = worker
        self._lines[(worker.id + CONTROL_SUFFIX).encode()] = worker
        self.counts["started"] += 1
        if replacement:
            self.counts["replaced"] += 1
            worker.replaces_exit_at = exited_at
        self._in_background(self._start_worker(worker))
        return worker

    def send(self, worker: Worker, message: Message, *, control: bool = False) -> None:
        self.processes.send(worker, message, control=control)

    def send_calls(self, worker: Worker, frames: list[bytes]) -> None:
        """Send encoded ``Execute`` messages to the worker's call line: one ZeroMQ
        message of several parts (``multipart_frames``), or one message each."""
        if self.config.multipart_frames or len(frames) == 1:
            self.processes.send_parts(worker, frames)
        else:
            for frame in frames:
                self.processes.send_parts(worker, [frame])

    def terminate(self, workers: Iterable[Worker], reason: str) -> asyncio.Future[Any]:
        """End the workers at once (SIGKILL, whole trees and cgroups)."""
        return asyncio.ensure_future(self.processes.terminate(workers, reason))

    def replace_zygote(self, delay: float) -> None:
        """Start a new zygote ``delay`` seconds from now."""
        self._restart = asyncio.ensure_future(self._replace_zygote(delay))

    # -- a worker's life -------------------------------------------------------------------

    async def _start_worker(self, worker: Worker) -> None:
        binding = worker.binding
        if binding is not None and binding.egress:
            # A policy session's: forked into its network namespace, made in a thread
            # the first time (N11).
            loop = asyncio.get_running_loop()
            try:
                where = await loop.run_in_executor(None, self.netns_of, binding.session_id)
            except SandboxStartError as exc:
                if not _lost(worker):
                    worker.netns_failure = exc.message
                    self._start_failed(worker, f"the session's network: {exc.message}")
                return
            worker.netns, worker.netns_inode = where
        try:
            config = await self.processes.prepare(worker)
        except OSError as exc:
            if not _lost(worker):
                self._start_failed(worker, f"its cgroup could not be made: {exc}")
            return
        if _lost(worker) or not self.open:
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
        self.events.worker_start_failed(worker, why, self._start_failures)

    def _on_ready(self, worker: Worker, message: Ready) -> None:
        if message.version != PROTOCOL_VERSION:
            self.processes.send(worker, Shutdown("protocol version mismatch"))
            self._start_failed(
                worker, f"it speaks protocol {message.version}, not {PROTOCOL_VERSION}"
            )
            return
        if message.failure:  # its binding's tools did not load (SPEC A5)
            if worker.load_failure is None and not worker.ready.done():
                worker.load_failure = message.failure
                self.processes.send(worker, Shutdown("its session's tools did not load"))
                self._start_failed(worker, message.failure)
            return
        worker.lines_ready += 1
        if worker.lines_ready != 2:
            return  # its other line (calls, control) has not spoken yet
        worker.ready_at = time.monotonic()
        if worker.replaces_exit_at is not None:
            self.replacement_ms.append((worker.ready_at - worker.replaces_exit_at) * 1000)
        if self._zygote_lost_at is not None:
            self.recovery_ms.append((worker.ready_at - self._zygote_lost_at) * 1000)
            self._zygote_lost_at = None
        self._start_failures = 0
        if not worker.ready.done():
            worker.ready.set_result(None)
        self.events.worker_ready(worker)

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
        worker.exit = worker.exit or exit_
        if not worker.ready.done():
            self._start_failed(worker, exit_.describe())
            return
        self._forget(worker)
        self.events.worker_exited(worker, replace=was_live)

    def _forget(self, worker: Worker) -> None:
        worker.state = WorkerState.DEAD
        self._unlist(worker)
        self.processes.forget(worker)

    def _unlist(self, worker: Worker) -> None:
        self.workers.pop(worker.id, None)
        self._by_pid.pop(worker.pid, None)
        self._lines.pop(worker.id.encode(), None)
        self._lines.pop((worker.id + CONTROL_SUFFIX).encode(), None)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # -- the zygote's life (SPEC L1) -------------------------------------------------------

    def _on_zygote_death(self, why: str) -> None:
        """The zygote died (``why``: how); its workers died with it."""
        if not self.zygote_up:
            return  # a replacement that did not start: _replace_zygote hears of it
        self.zygote_up = False
        started = self.processes.zygote_started
        if started:
            self._zygote_lost_at = time.monotonic()
            self._lose_workers(f"the zygote that forked it died ({why})")
        self.events.zygote_died(why, started)

    def _lose_workers(self, cause: str) -> None:
        """Every worker is gone with the zygote: each is reported ended, its record
        goes now, and whatever is left of its processes and cgroup is ended."""
        lost = [w for w in self.workers.values() if w.state is not WorkerState.DEAD]
        for worker in lost:
            worker.state = WorkerState.DEAD
            worker.kill_reason = worker.kill_reason or cause
            self._unlist(worker)
            self.processes.exited(worker.pid)
            worker.exit = worker.exit or WorkerExit(None, signal.SIGKILL, worker.kill_reason)
            if not worker.ready.done():
                worker.ready.set_exception(PoolError(f"a worker failed to start: {cause}"))
                worker.ready.exception()  # retrieved: its waiters stay queued
            self.events.worker_exited(worker, replace=False)
        ending = asyncio.ensure_future(self._end_lost(lost, cause))
        self._endings.add(ending)
        ending.add_done_callback(self._endings.discard)

    async def _end_lost(self, workers: list[Worker], cause: str) -> None:
        await self.processes.terminate([w for w in workers if w.pid], cause)
        for worker in workers:
            self.processes.forget(worker)

    async def _replace_zygote(self, delay: float) -> None:
        await asyncio.sleep(delay)
        try:
            await self.processes.restart_zygote()
        except Exception as exc:  # ZygoteError, or anything else: the calls must not hang
            self._zygote_failures += 1
            log.error("a new zygote failed to start (%d in a row): %s", self._zygote_failures, exc)
            self.events.zygote_start_failed(self._zygote_failures, str(exc))
            return
        log.warning("a new zygote (pid %s) replaced the one that died", self.processes.zygote_pid)
        self.zygote_up = True
        self._zygote_failures = 0
        self.counts["zygotes_replaced"] += 1
        self.events.zygote_started()

    # -- messages --------------------------------------------------------------------------

    def _on_frames(self, frames: list[bytes]) -> None:
        """A message from the workers' socket: the sender's identity, then one encoded
        message per part, in the order they were sent (a worker may answer several
        calls in one message)."""
        if len(frames) < 2:
            log.warning("dropped a message of %d frame", len(frames))
            return
        worker = self._lines.get(frames[0])
        if worker is None:
            return  # a worker forgotten meanwhile: what it said no longer matters
        worker.last_seen = time.monotonic()
        for part in itertools.islice(frames, 1, None):
            try:
                message = decode(part)
            except ProtocolError as exc:
                log.warning("dropped a bad frame from %s: %s", worker.id, exc)
                continue
            match message:
                case Heartbeat():
                    worker.rss = message.rss
                case Ready():
                    self._on_ready(worker, message)
                case _:
                    self.events.worker_message(worker, message)
            if worker.state is WorkerState.DEAD:
                return  # what it said after was said by a worker already given up

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
            if self.zygote_up and not stalled and quiet is not None and quiet > silence:
                log.error("the zygote hung (no heartbeat for %.1f s): killing it", quiet)
                await self.processes.kill_zygote(f"it hung: no heartbeat for {quiet:.1f} s")
                continue
            now = time.monotonic()
            for worker in list(self.workers.values()):
                watched = worker.state in (WorkerState.BUSY, WorkerState.IDLE, WorkerState.RETIRING)
                if watched and worker.kill_reason is None and now - worker.last_seen > silence:
                    reason = f"it hung (no heartbeat for {now - worker.last_seen:.1f} s)"
                    await self.processes.terminate([worker], reason)


def _no_netns(session_id: str) -> tuple[str, int]:
    raise SandboxStartError(f"no network namespace for session {session_id} here")
