"""Workers bound to a policy session (SPEC N11): a policy session's calls run on
workers forked into its own network namespace, where only its proxy listens, so a
Python tool that opens a connection (``httpx``, ``urllib``) meets the session's rules
as its commands do. A shared worker cannot serve them: it lives in the host's
namespace or an empty one, and cannot switch (its seccomp filter and, unprivileged,
its user namespace forbid it).

A session's calls wait in a queue of its own; its workers take them one at a time
(nothing is held behind a running call), up to ``PER_SESSION`` workers, started when
its calls wait and none is idle, and retired when the session ends. They are not the
planner's: they do not count against ``max_workers`` (the planner would retire
them for the other kind), but all sessions' together are bounded by it.

Everything here runs on the event loop; only the session's namespace is made off it
(``SessionEgress.network``, in a thread, the first time).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from toolpool.pool.calls import failed
from toolpool.pool.egress import SessionEgress
from toolpool.pool.supervisor import Supervisor
from toolpool.pool.workers import Call, PoolOutcome, Worker, WorkerState
from toolpool.sandbox.session_box import SandboxStartError

log = logging.getLogger("toolpool.pool")

PER_SESSION = 4  # workers one policy session may have


class BoundWorkers:
    """The policy sessions' own workers and the calls that wait for them."""

    def __init__(
        self,
        supervisor: Supervisor,
        egress: SessionEgress,
        give: Callable[[Worker, list[Call]], None],
        end: Callable[[Call, PoolOutcome], None],
        shut_down: Callable[[Worker], None],
        max_total: int,
    ) -> None:
        self._supervisor = supervisor
        self._egress = egress
        self._give = give  # the dispatch's: a frame of calls to a worker
        self._end = end  # the dispatch's: a call's one end
        self._shut_down = shut_down  # the dispatch's: a retiring worker, once free
        self._max_total = max_total
        self.queues: dict[str, deque[Call]] = {}
        self._starting: dict[str, int] = {}  # sessions' namespaces being made
        self._tasks: set[asyncio.Task[None]] = set()
        egress.ending.append(self.end_session)
        egress.call_of_worker = self.call_of

    def __repr__(self) -> str:
        waiting = sum(len(q) for q in self.queues.values())
        return f"<BoundWorkers [{len(self._mine())} workers, {waiting} calls waiting]>"

    def call_of(self, worker_id: str) -> str:
        """The call a bound worker runs now ("" for none): its proxy token's call."""
        worker = self._supervisor.workers.get(worker_id)
        if worker is None or not worker.bound or not worker.given:
            return ""
        return worker.given[0].call_id

    def ending_call(self) -> None:
        """A bound worker's call ended: what the proxy sent meanwhile is read now,
        while the worker's token still names that call."""
        self._egress.drain()

    def add(self, call: Call) -> None:
        """A policy session's call waits for a worker of the session's."""
        queue = self.queues.setdefault(call.bound, deque())
        at = len(queue)
        while at and queue[at - 1].ticket > call.ticket:  # one given back goes first
            at -= 1
        queue.insert(at, call)
        self._flush(call.bound)

    def remove(self, call: Call) -> None:
        queue = self.queues.get(call.bound)
        if queue is not None and call in queue:
            queue.remove(call)

    def waiting(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def release(self, worker: Worker) -> None:
        """A worker of a session's is free: it takes the session's next call."""
        worker.state = WorkerState.IDLE
        self._flush(worker.bound)

    def exited(self, worker: Worker) -> None:
        """A worker of a session's ended: others start for its calls that wait."""
        self._flush(worker.bound)

    def start_failed(self, worker: Worker, why: str) -> None:
        """A worker of a session's did not start: its calls that wait end so (the next
        call tries again)."""
        self._fail(worker.bound, f"a worker for the session's network did not start: {why}")

    def end_session(self, session_id: str) -> None:
        """The session ended: its calls that wait end, its workers retire."""
        self._fail(session_id, "the session closed")
        for worker in self._mine(session_id):
            worker.state = WorkerState.RETIRING
            self._shut_down(worker)

    def fail_all(self, why: str) -> None:
        for session_id in list(self.queues):
            self._fail(session_id, why)

    def _fail(self, session_id: str, why: str) -> None:
        queue = self.queues.pop(session_id, None)
        while queue:
            self._end(queue.popleft(), failed(why))

    def _mine(self, session_id: str | None = None) -> list[Worker]:
        """The live bound workers (of ``session_id``)."""
        return [
            w
            for w in self._supervisor.workers.values()
            if w.bound
            and (session_id is None or w.bound == session_id)
            and w.state not in (WorkerState.DEAD, WorkerState.RETIRING)
        ]

    def _flush(self, session_id: str) -> None:
        queue = self.queues.get(session_id)
        if not queue:
            self.queues.pop(session_id, None)
            return
        mine = self._mine(session_id)
        for worker in mine:
            if not queue:
                break
            if worker.state is WorkerState.IDLE and not worker.given:
                self._give(worker, [queue.popleft()])
        if not queue:
            return
        # Workers to come: those whose namespace is being made, and those starting.
        coming = self._starting.get(session_id, 0)
        starting = coming + sum(1 for w in mine if w.state is WorkerState.STARTING)
        everyone = len(self._mine()) + sum(self._starting.values())
        room = min(PER_SESSION - len(mine) - coming, self._max_total - everyone)
        for _ in range(min(len(queue) - starting, room)):
            self._start(session_id)

    def _start(self, session_id: str) -> None:
        """A worker for the session, in its namespace (made first, in a thread)."""
        self._starting[session_id] = self._starting.get(session_id, 0) + 1

        async def start() -> None:
            loop = asyncio.get_running_loop()
            try:
                network = await loop.run_in_executor(None, self._egress.network, session_id)
            except SandboxStartError as exc:
                self._fail(session_id, exc.message)
                return
            finally:
                self._starting[session_id] -= 1
                if not self._starting[session_id]:
                    del self._starting[session_id]
            if session_id in self.queues:  # not ended meanwhile
                where = (network.path, network.inode)
                self._supervisor.spawn(True, bound=session_id, netns=where)

        task = asyncio.get_running_loop().create_task(start())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
