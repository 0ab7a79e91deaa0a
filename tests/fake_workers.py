"""Workers as threads that speak the pool ⇄ worker protocol over real ZeroMQ sockets,
as the worker is to: a message may carry several parts, one encoded message each —
several ``Execute`` to the worker, run in order; several ``Result`` back, a result
waiting at most 1 ms, and only while another call waits at the worker. A ``Cancel``
on the control line stops the call it names when it runs, withdraws it when it waits
(``Withdrawn``), and does nothing once it ended; after a cancelled call the worker
gives back every call given it (``Withdrawn``, on the call line).

Their tools, by name: ``nap`` (``seconds``; cancellable), ``crash`` (the worker dies
at once: what it had not sent is lost). Every start is counted (``FakeWorkers.starts``).
``WorkerPool(processes=FakeWorkers)`` runs on them; tests/pool_fakes.py has a
stand-in without sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable
from pathlib import Path

import zmq

from toolpool.pool import PoolConfig
from toolpool.pool.workers import Kind, Worker, WorkerState
from toolpool.protocol import (
    CallStatus,
    Cancel,
    Execute,
    Exited,
    Message,
    Ready,
    Result,
    Shutdown,
    Withdrawn,
    decode,
    encode,
)
from toolpool.sandbox import Limits, SandboxProfile
from toolpool.worker.channel import CONTROL_SUFFIX
from toolpool.zmqloop import LoopSocket

HOLD_RESULT = 0.001  # the most a finished call's Result waits for the next one's


class FakeWorkers:
    """``WorkerProcesses`` with thread workers (see the module). ``multipart_replies``:
    the workers answer several calls to a message."""

    multipart_replies = True

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
        self.profile = SandboxProfile.nothing()
        self.policy = config.policy
        self.cgroups = None
        self.zygote_started = True
        self.zygote_pid = 1
        self.starts: Counter[str] = Counter()  # call id → how often it started
        self._lock = threading.Lock()
        self._pids = itertools.count(1000)
        self._threads: dict[str, FakeWorker] = {}
        self._dir = tempfile.TemporaryDirectory(prefix="fake-workers-")
        self.endpoint = f"ipc://{Path(self._dir.name) / 'w.sock'}"
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._router: LoopSocket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        router.bind(self.endpoint)
        self._router = LoopSocket(router, self.on_frames)

    async def close(self, workers: Iterable[Worker]) -> None:
        for thread in list(self._threads.values()):
            thread.kill()
            thread.join(5)
        if self._router is not None:
            self._router.close()
        self._context.term()
        self._dir.cleanup()

    def new_worker(self, worker_id: str, kind: Kind) -> Worker:
        return Worker.of_kind(worker_id, kind, asyncio.get_running_loop().create_future())

    async def prepare(self, worker: Worker) -> None:
        return None

    async def spawn(self, worker: Worker, config: object) -> int:
        pid = next(self._pids)
        thread = FakeWorker(self, worker.id, pid)
        self._threads[worker.id] = thread
        thread.start()
        return pid

    def apply_limits(self, worker: Worker, limits: Limits) -> str | None:
        return None

    def oom_killed(self, worker: Worker) -> bool:
        return False

    def exited(self, pid: int) -> None:
        pass

    def forget(self, worker: Worker) -> None:
        pass

    def send(self, worker: Worker, message: Message, *, control: bool = False) -> None:
        identity = worker.id + CONTROL_SUFFIX if control else worker.id
        self._send([identity.encode(), encode(message)], worker)

    def send_parts(self, worker: Worker, parts: list[bytes]) -> None:
        self._send([worker.id.encode(), *parts], worker)

    def _send(self, frames: list[bytes], worker: Worker) -> None:
        if self._router is None or worker.state is WorkerState.DEAD:
            return
        with contextlib.suppress(zmq.ZMQError):  # gone: as the real pool, say nothing
            self._router.send(frames)

    async def terminate(self, workers: Iterable[Worker], reason: str, *, grace: float = 0) -> None:
        for worker in list(workers):
            worker.kill_reason = worker.kill_reason or reason
            thread = self._threads.get(worker.id)
            if thread is not None:
                thread.kill()
                await asyncio.get_running_loop().run_in_executor(None, thread.join, 5)

    def zygote_silence(self) -> float | None:
        return None

    def confines(self, pid: int) -> bool:
        return False

    # -- from the worker threads ---------------------------------------------------------

    def started(self, call_id: str) -> None:
        with self._lock:
            self.starts[call_id] += 1

    def ended(self, worker: FakeWorker, code: int | None, sig: int | None) -> None:
        assert self._loop is not None
        self._threads.pop(worker.worker_id, None)
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
            self._loop.call_soon_threadsafe(self.on_exit, Exited(worker.pid, code, sig))


class FakeWorker(threading.Thread):
    def __init__(self, owner: FakeWorkers, worker_id: str, pid: int) -> None:
        super().__init__(name=f"fake-{worker_id}", daemon=True)
        self.owner = owner
        self.worker_id = worker_id
        self.pid = pid
        self._killed = threading.Event()
        self._queue: deque[Execute] = deque()
        self._withdrawn: set[int] = set()
        self._ended: set[int] = set()
        self._running: Execute | None = None
        self._until = 0.0  # when the running call's nap ends
        self._cancelled = False
        self._unfit = False
        self._unsent: list[bytes] = []
        self._unsent_since = 0.0

    def kill(self) -> None:
        self._killed.set()

    def run(self) -> None:
        context = self.owner._context
        calls = context.socket(zmq.DEALER)
        calls.setsockopt(zmq.IDENTITY, self.worker_id.encode())
        control = context.socket(zmq.DEALER)
        control.setsockopt(zmq.IDENTITY, (self.worker_id + CONTROL_SUFFIX).encode())
        for socket in (calls, control):
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(self.owner.endpoint)
            socket.send(encode(Ready(self.worker_id, self.pid)))
        poller = zmq.Poller()
        poller.register(calls, zmq.POLLIN)
        poller.register(control, zmq.POLLIN)
        code: int | None = None
        sig: int | None = signal.SIGKILL
        try:
            while not self._killed.is_set():
                busy = self._running is not None or self._queue or self._unsent
                ready = dict(poller.poll(1 if busy else 10))
                if control in ready:
                    self._read_control(control)
                if calls in ready and self._read_calls(calls):
                    code, sig = 0, None  # told to shut down
                    break
                if self._step(calls):
                    sig = signal.SIGSEGV  # a crash: what was not sent is lost
                    break
        finally:
            calls.close(0)
            control.close(0)
            self.owner.ended(self, code, sig)

    def _read_control(self, control: zmq.Socket[bytes]) -> None:
        while True:
            try:
                message = decode(control.recv(zmq.NOBLOCK))
            except zmq.Again:
                return
            if not isinstance(message, Cancel):
                continue
            running = self._running
            if running is not None and running.ticket == message.ticket:
                self._cancelled = self._cancelled or message.running
            elif message.ticket not in self._ended and message.ticket not in self._withdrawn:
                self._withdrawn.add(message.ticket)
                control.send(encode(Withdrawn(message.ticket)))

    def _read_calls(self, calls: zmq.Socket[bytes]) -> bool:
        """Read what waits; True when told to shut down."""
        while True:
            try:
                parts = calls.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return False
            for part in parts:
                message = decode(part)
                if isinstance(message, Shutdown):
                    return True
                if isinstance(message, Execute):
                    self._queue.append(message)

    def _step(self, calls: zmq.Socket[bytes]) -> bool:
        """Run what is due; True when the worker crashed."""
        now = time.monotonic()
        running = self._running
        if running is not None and (self._cancelled or now >= self._until):
            status = CallStatus.CANCELLED if self._cancelled else CallStatus.OK
            self._finish(running, status)
            self._unfit = self._unfit or self._cancelled
            self._running, self._cancelled = None, False
        while self._running is None and self._queue:
            execute = self._queue.popleft()
            if execute.ticket in self._withdrawn:
                self._withdrawn.discard(execute.ticket)  # it may come again: it runs then
                continue
            if self._unfit:  # the call before left it unfit: given back, in order
                self._ended.add(execute.ticket)
                self._flush(calls)
                calls.send(encode(Withdrawn(execute.ticket)))
                continue
            self.owner.started(execute.call_id)
            if execute.tool == "crash":
                return True
            self._running = execute
            self._until = now + float(execute.arguments.get("seconds", 0))
        waiting = bool(self._queue) or self._running is not None
        if self._unsent and (not waiting or now - self._unsent_since > HOLD_RESULT):
            self._flush(calls)
        return False

    def _finish(self, execute: Execute, status: CallStatus) -> None:
        self._ended.add(execute.ticket)
        text = "cancelled" if status is CallStatus.CANCELLED else f"{execute.call_id} slept"
        result = {
            "call_id": execute.call_id,
            "tool_name": execute.tool,
            "content": [{"type": "text", "text": text}],
            "is_error": status is CallStatus.CANCELLED,
        }
        if not self._unsent:
            self._unsent_since = time.monotonic()
        self._unsent.append(encode(Result(execute.call_id, status, result)))

    def _flush(self, calls: zmq.Socket[bytes]) -> None:
        if not self._unsent:
            return
        if self.owner.multipart_replies:
            calls.send_multipart(self._unsent)
        else:
            for frame in self._unsent:
                calls.send(frame)
        self._unsent = []
