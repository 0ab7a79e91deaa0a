"""Stand-ins for the pool's ``WorkerProcesses`` (``WorkerPool(processes=…)``): the
pool's own bookkeeping — calls given, held, recalled, re-run — tried without a
process.

- ``ScriptedProcesses``: no process and no socket. What the pool sends each worker
  is recorded, as the ZeroMQ messages it sent (each a list of messages, one a part);
  the test answers for the workers (``reply``), in the order it chooses, and ends
  them (``die``). Tests of it run in milliseconds and decide every race.
- ``FakeWorkers`` (``fake_workers.py``): threads that speak the protocol over real
  ZeroMQ sockets, several calls to a message.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from toolpool.cancel import CancelToken
from toolpool.pool import PoolConfig, WorkerPool
from toolpool.pool.workers import Kind, PoolOutcome, Worker
from toolpool.protocol import (
    CallContext,
    CallStatus,
    Execute,
    Exited,
    Message,
    Ready,
    Result,
    decode,
    encode,
)
from toolpool.sandbox import Limits, SandboxProfile
from toolpool.sandbox.limits import CgroupLimits
from toolpool.worker.channel import CONTROL_SUFFIX

LIMITS = Limits(wall_seconds=30)


class ScriptedProcesses:
    """In-memory workers whose every answer the test gives (see the module)."""

    def __init__(
        self,
        config: PoolConfig,
        on_frames: Callable[[list[bytes]], None],
        on_exit: Callable[[Exited], None],
        on_zygote_death: Callable[[str], None],
    ) -> None:
        self.config = config
        self.on_frames = on_frames
        self.on_exit = on_exit
        self.on_zygote_death = on_zygote_death
        self.profile = SandboxProfile.nothing()
        self.policy = config.policy
        self.cgroups = None
        self.endpoint = "inproc://scripted"
        self.zygote_started = True
        self.zygote_pid = 1
        self.workers: dict[str, Worker] = {}
        # Per worker: the ZeroMQ messages sent on its call line (each a list of its
        # parts' messages), and those on its control line.
        self.sent: dict[str, list[list[Message]]] = defaultdict(list)
        self.control: dict[str, list[Message]] = defaultdict(list)
        self.terminated: list[tuple[str, str]] = []
        self.oom: set[str] = set()
        self.ready_at_once = True
        self._pids = itertools.count(1000)

    # -- what the pool calls -------------------------------------------------------------

    async def open(self) -> None:
        pass

    async def close(self, workers: Iterable[Worker]) -> None:
        pass

    def new_worker(self, worker_id: str, kind: Kind) -> Worker:
        return Worker.of_kind(worker_id, kind, asyncio.get_running_loop().create_future())

    async def prepare(self, worker: Worker) -> None:
        return None

    async def spawn(self, worker: Worker, config: object) -> int:
        pid = next(self._pids)
        worker.pid = pid
        self.workers[worker.id] = worker
        if self.ready_at_once:
            asyncio.get_running_loop().call_soon(self.ready, worker.id)
        return pid

    def apply_limits(self, worker: Worker, limits: Limits) -> str | None:
        worker.cgroup_limits = CgroupLimits.of(limits)
        return None

    def oom_killed(self, worker: Worker) -> bool:
        return worker.id in self.oom

    def exited(self, pid: int) -> None:
        pass

    def forget(self, worker: Worker) -> None:
        pass

    def send(self, worker: Worker, message: Message, *, control: bool = False) -> None:
        if control:
            self.control[worker.id].append(message)
        else:
            self.sent[worker.id].append([message])

    def send_parts(self, worker: Worker, parts: list[bytes]) -> None:
        self.sent[worker.id].append([decode(part) for part in parts])

    async def terminate(self, workers: Iterable[Worker], reason: str, *, grace: float = 0) -> None:
        for worker in list(workers):
            worker.kill_reason = worker.kill_reason or reason
            self.terminated.append((worker.id, reason))
            if worker.exit is None and worker.pid in self._alive():
                self.die(worker.id, sig=signal.SIGKILL)

    def zygote_silence(self) -> float | None:
        return None

    async def kill_zygote(self, reason: str) -> None:
        self.on_zygote_death(reason)

    async def restart_zygote(self) -> None:
        pass

    def confines(self, pid: int) -> bool:
        return False

    # -- what the test does for the workers ----------------------------------------------

    def _alive(self) -> set[int]:
        return {w.pid for w in self.workers.values() if w.exit is None}

    def ready(self, worker_id: str) -> None:
        """The worker connected both its lines."""
        pid = self.workers[worker_id].pid
        for identity in (worker_id, worker_id + CONTROL_SUFFIX):
            self.on_frames([identity.encode(), encode(Ready(worker_id, pid))])

    def reply(self, worker_id: str, *messages: Message, control: bool = False) -> None:
        """The worker sends ``messages`` in one ZeroMQ message (a part each)."""
        identity = worker_id + CONTROL_SUFFIX if control else worker_id
        self.on_frames([identity.encode(), *(encode(m) for m in messages)])

    def die(self, worker_id: str, *, code: int | None = None, sig: int | None = None) -> None:
        """The zygote reports the worker's end."""
        self.on_exit(Exited(self.workers[worker_id].pid, code, sig))

    def executes(self, worker_id: str) -> list[list[str]]:
        """The call ids sent to the worker, a list per ZeroMQ message."""
        return [
            [m.call_id for m in sent if isinstance(m, Execute)] for sent in self.sent[worker_id]
        ]


def ok(call_id: str, text: str = "ok", **usage: Any) -> Result:
    """A worker's Result for a call that went well."""
    result = {
        "call_id": call_id,
        "tool_name": "t",
        "content": [{"type": "text", "text": text}],
        "is_error": False,
    }
    return Result(call_id, CallStatus.OK, result, usage)


def cancelled(call_id: str) -> Result:
    result = {
        "call_id": call_id,
        "tool_name": "t",
        "content": [{"type": "text", "text": "Tool execution cancelled."}],
        "is_error": True,
        "error_code": "cancelled",
    }
    return Result(call_id, CallStatus.CANCELLED, result)


class Calls:
    """Calls submitted to a pool, and every ``done`` each got, in order."""

    def __init__(self, pool: WorkerPool) -> None:
        self.pool = pool
        self.done: dict[str, list[PoolOutcome]] = defaultdict(list)
        self.order: list[str] = []
        self.tokens: dict[str, CancelToken] = {}

    def submit(
        self,
        call_id: str,
        *,
        holdable: bool = True,
        limits: Limits = LIMITS,
        network: bool = False,
    ) -> CancelToken:
        token = self.tokens[call_id] = CancelToken()
        context = CallContext(session_id="s", workspace="/nowhere")
        execute = Execute(call_id, "t", {}, context, limits.to_dict(), {}, self.pool.ticket())

        def done(outcome: PoolOutcome) -> None:
            self.done[call_id].append(outcome)
            self.order.append(call_id)

        self.pool.submit(
            execute,
            network=network,
            token=token,
            on_progress=lambda _: None,
            limits=limits,
            done=done,
            holdable=holdable,
        )
        return token

    def outcome(self, call_id: str) -> PoolOutcome:
        (outcome,) = self.done[call_id]
        return outcome

    def status(self, call_id: str) -> str:
        return self.outcome(call_id).status.value

    def text(self, call_id: str) -> str:
        result = self.outcome(call_id).result
        assert result is not None, self.outcome(call_id)
        return str(result["content"][0]["text"])


async def turn() -> None:
    """Let the event loop run what is due now (the pool flushes at a turn's end)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def scripted_pool(**settings: Any) -> tuple[WorkerPool, ScriptedProcesses]:
    """A started pool on scripted workers, every one ready."""
    settings = {"min_workers": 2, "max_workers": 2, "heartbeat_misses": 10**6, **settings}
    pool = WorkerPool(PoolConfig(**settings), processes=ScriptedProcesses)
    await pool.start()
    fake = pool.processes
    assert isinstance(fake, ScriptedProcesses)
    return pool, fake
