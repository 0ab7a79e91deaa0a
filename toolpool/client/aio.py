"""The asyncio client: a driver of the connection (``toolpool.client.connection``).

    async with toolpool.AsyncClient() as client:
        async with client.session(workspace="/path/to/repo") as session:
            turn = await session.submit(calls)
            async for event in turn:
                print(event)
            results = await turn.results()

The driver owns a plain ZeroMQ socket whose descriptor the event loop watches: when
it fires, every waiting frame goes to the connection, and the callers whose
operations are done are woken (their futures resolved). What the connection queues
(a request's frame, an approval's answer, given with or without ``await``, from this
loop or another thread) is sent at once; what cannot go yet (no daemon to send to)
is tried again every ``POLL_SECONDS``. The socket's monitor, watched the same way,
tells when the daemon hangs up.

Not zmq.asyncio: it wraps each receive in a future, a timer check and an extra turn
of the loop, and each of its flag tests is an ``enum.Flag`` operation in Python:
several times the cost of the frame itself. ZeroMQ's descriptor is edge-triggered
and consumed by sends too, so after a send the socket is checked again for input.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Generator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import zmq

from toolpool.client import branching
from toolpool.client.base import CLOSE_ERRORS, ClientBase, SessionBase, TurnBase
from toolpool.client.branching import Change, Checkpoint, Checkpoints, Rewound
from toolpool.client.core import ApprovalRequested, TurnItem, results_as
from toolpool.client.errors import DaemonUnavailable
from toolpool.client.operation import Deferred, Operation
from toolpool.models import ToolResult
from toolpool.protocol import EventSelection, SteerAction

T = TypeVar("T")
AsyncApprovalHandler = Callable[[ApprovalRequested], Any | Awaitable[Any]]
POLL_SECONDS = 0.1  # how often frames that could not be sent are tried again
_POLLIN = int(zmq.POLLIN)  # pyzmq's flags are enum.Flags: plain ints test faster
_NOBLOCK = int(zmq.NOBLOCK)

__all__ = ["AsyncApprovalHandler", "AsyncClient", "AsyncSession", "AsyncTurn"]


class AsyncClient(ClientBase[zmq.Socket[bytes]]):
    """A connection to the toolpool daemon for asyncio programs; an async context
    manager. Arguments as for ``toolpool.Client``."""

    default_name = "toolpool.AsyncClient"
    _loop: asyncio.AbstractEventLoop | None = None  # the driver's state from connect on
    _tasks: set[asyncio.Task[None]]  # the approvals' handlers
    _waiters: dict[asyncio.Future[bool], Operation[Any]]  # who waits, for what
    _retry: asyncio.TimerHandle | None  # the next try to send them
    _watched: list[int]  # the descriptors the loop watches

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def connect(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        self._tasks = set()
        self._waiters = {}
        self._retry = None
        self._watched = []
        self._conn.on_outgoing = self._wake_writer
        self._dial(zmq.Context())
        assert self._socket is not None and self._monitor is not None
        for socket, ready in ((self._socket, self._readable), (self._monitor, self._hung_up)):
            fd = socket.getsockopt(zmq.FD)
            assert isinstance(fd, int)
            loop.add_reader(fd, ready)
            self._watched.append(fd)
            loop.call_soon(ready)  # what waits already raised no edge
        try:
            await self._run(self._conn.hello(self._name, self.connect_timeout))
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Say goodbye (the daemon closes this client's sessions) and disconnect."""
        self._conn.close()
        if self._loop is None:
            return  # never connected
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        with contextlib.suppress(zmq.ZMQError):
            self._send()  # the goodbye, if it can go
        for fd in self._watched:
            self._loop.remove_reader(fd)
        self._watched = []
        self._hang_up()
        self._settle()  # whoever still waits learns that the client is closed

    # -- the wire ------------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _wake_writer(self) -> None:
        """The connection queued a frame (from this loop or, say, another thread)."""
        assert self._loop is not None
        try:
            here = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            here = False
        if here:
            self._flush()
        else:
            self._loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        """Send what the connection queued, now; what the socket does not take yet
        (no daemon to send to) is tried again in ``POLL_SECONDS``."""
        try:
            self._send()
        except zmq.Again:
            if self._retry is None and self._loop is not None:
                self._retry = self._loop.call_later(POLL_SECONDS, self._try_again)
        except zmq.ZMQError as exc:
            self._broken(exc)

    def _try_again(self) -> None:
        self._retry = None
        self._flush()

    def _send(self) -> None:
        socket = self._socket
        if socket is None:
            return
        outgoing = self._conn.outgoing  # a frame leaves it once the socket took it
        if not outgoing:
            return
        try:
            while outgoing:
                socket.send(outgoing[0], _NOBLOCK)
                outgoing.popleft()
        finally:
            if self._loop is not None and socket.getsockopt(zmq.EVENTS) & _POLLIN:  # type: ignore[operator]
                self._loop.call_soon(self._readable)

    def _readable(self) -> None:
        """File every frame that has arrived; wake whoever's operation is done."""
        socket = self._socket
        if socket is None:
            return
        try:
            while socket.getsockopt(zmq.EVENTS) & _POLLIN:  # type: ignore[operator]
                for deferred in self._conn.receive(socket.recv(_NOBLOCK)):
                    self._spawn(self._decide(deferred))
        except zmq.ZMQError as exc:
            self._broken(exc)
        self._settle()

    def _hung_up(self) -> None:
        """The monitor says the daemon closed the connection (it stopped or died):
        fail whoever waits, once what it sent before it went is filed."""
        monitor = self._monitor
        if monitor is None:
            return
        try:
            if not monitor.getsockopt(zmq.EVENTS) & _POLLIN:  # type: ignore[operator]
                return
            monitor.recv_multipart(_NOBLOCK)
        except zmq.ZMQError:
            return
        self._readable()
        self._conn.lost()
        self._settle()

    def _broken(self, exc: zmq.ZMQError) -> None:
        self._conn.fail(DaemonUnavailable(f"the connection to {self.endpoint} broke: {exc}"))
        self._settle()

    async def _decide(self, deferred: Deferred) -> None:
        """Await an async ``on_approval`` handler; its answer goes out."""
        self._conn.approvals.decide(deferred.item, await deferred.decision)
        self._settle()

    def _settle(self) -> None:
        """Wake the callers whose operations are done."""
        for future, operation in self._waiters.items():
            if not future.done() and operation.done():
                future.set_result(True)

    async def _run(self, operation: Operation[T]) -> T:
        """Wait until ``operation`` is done; its outcome."""
        if not operation.done():
            assert self._loop is not None, "the client is not connected"
            future: asyncio.Future[bool] = self._loop.create_future()
            self._waiters[future] = operation
            timer = None
            if operation.timeout is not None:
                timer = self._loop.call_later(operation.timeout, _expire, future)
            try:
                done = await future
            finally:
                del self._waiters[future]
                if timer is not None:
                    timer.cancel()
            if not done and not operation.done():
                raise operation.expired()
        return operation.outcome()

    # -- requests ------------------------------------------------------------------------

    def session(
        self,
        workspace: str | Path,
        *,
        on_approval: AsyncApprovalHandler | None = None,
        tools: Sequence[Any] = (),
        **options: Any,
    ) -> _SessionOpener:
        """Open a session (await it, or use it as an async context manager). Options
        (``toolpool.session_options.SessionOptions``, docs/sessions.md) and ``tools``
        as for ``toolpool.Client.session``; ``on_approval`` may be async."""
        return _SessionOpener(self, workspace, on_approval, options, tools)

    async def _open(
        self,
        workspace: str | Path,
        on_approval: AsyncApprovalHandler | None,
        options: dict[str, Any],
        tools: Sequence[Any],
    ) -> AsyncSession:
        opening = self._conn.open_session(workspace, options, on_approval, tools)
        return AsyncSession(self, await self._run(opening))

    async def status(self) -> dict[str, Any]:
        return await self._run(self._conn.status())

    async def tools(
        self, format: str = "toolpool", profile: str | None = "toolpool"
    ) -> list[dict[str, Any]]:
        """The tools a session of ``profile`` is offered, in ``format`` (None: all)."""
        return await self._run(self._conn.tools(format, profile))


class _SessionOpener:
    def __init__(
        self,
        client: AsyncClient,
        workspace: str | Path,
        on_approval: AsyncApprovalHandler | None,
        options: dict[str, Any],
        tools: Sequence[Any],
    ) -> None:
        self._args = (workspace, on_approval, options, tools)
        self._client = client
        self._session: AsyncSession | None = None

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._client._open(*self._args).__await__()

    async def __aenter__(self) -> AsyncSession:
        self._session = await self._client._open(*self._args)
        return self._session

    async def __aexit__(self, *_: object) -> None:
        if self._session is not None:
            await self._session.close()


class AsyncSession(SessionBase[AsyncClient]):
    __doc__ = SessionBase.__doc__

    async def submit(
        self,
        calls: Any,
        *,
        format: str | None = None,
        open: bool = False,
        events: EventSelection | str = EventSelection.ALL,
    ) -> AsyncTurn:
        """As ``Session.submit``."""
        submitting = self._conn.submit(self.id, calls, format, open, events)
        return AsyncTurn(self, await self.client._run(submitting))

    async def interrupt(self) -> None:
        await self.client._run(self._conn.steer(self.id, SteerAction.INTERRUPT))

    async def abort(self) -> None:
        await self.client._run(self._conn.steer(self.id, SteerAction.ABORT))

    async def close(self) -> None:
        """End the session in the daemon; best effort, as for the blocking client."""
        with contextlib.suppress(*CLOSE_ERRORS):
            await self.client._run(self._conn.close_session(self.id))

    # -- branches (SPEC B1–B10): as ``Session``'s

    async def checkpoint(
        self, label: str | None = None, *, timeout: float | None = None
    ) -> Checkpoint:
        return await self.client._run(branching.checkpoint(self._conn, self.id, label, timeout))

    async def checkpoints(self, *, timeout: float | None = None) -> Checkpoints:
        return await self.client._run(branching.checkpoints(self._conn, self.id, timeout))

    async def rewind(self, checkpoint_id: str, *, timeout: float | None = None) -> Rewound:
        rewinding = branching.rewind(self._conn, self.id, checkpoint_id, timeout)
        return await self.client._run(rewinding)

    async def fork(
        self, n: int = 1, at: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> list[AsyncSession]:
        made = branching.fork(self._conn, self.id, n, at, options, timeout)
        return [
            AsyncSession(self.client, session_id) for session_id in await self.client._run(made)
        ]

    async def changes(
        self, since: str | None = None, *, timeout: float | None = None
    ) -> list[Change]:
        return await self.client._run(branching.changes(self._conn, self.id, since, timeout))

    async def diff(self, since: str | None = None, *, timeout: float | None = None) -> str:
        return await self.client._run(branching.diff(self._conn, self.id, since, timeout))

    async def export(self, path: str | Path, *, timeout: float | None = None) -> int:
        return await self.client._run(branching.export(self._conn, self.id, path, timeout))

    async def commit(self, *, timeout: float | None = None) -> list[str]:
        return await self.client._run(branching.commit(self._conn, self.id, timeout))


class AsyncTurn(TurnBase[AsyncSession]):
    __doc__ = TurnBase.__doc__

    def __aiter__(self) -> AsyncIterator[TurnItem]:
        """Every event (and unanswered approval request), ending with turn_end."""
        return self._iterate(follow=False)

    def follow(self) -> AsyncIterator[TurnItem]:
        """As ``Turn.follow``: what has been yielded is let go of."""
        return self._iterate(follow=True)

    async def _iterate(self, follow: bool) -> AsyncIterator[TurnItem]:
        cursor = self._cursor(follow)
        while not cursor.finished:
            yield await self.session.client._run(cursor.next())

    async def results(self, timeout: float | None = None) -> tuple[ToolResult, ...]:
        return await self.session.client._run(self._conn.turn_end(self._log, timeout))

    async def results_as(self, format: str, timeout: float | None = None) -> Any:
        return results_as(await self.results(timeout), format, self._log.custom_calls)

    async def result(self, call_id: str, timeout: float | None = None) -> ToolResult:
        """Wait for one call's end; its result."""
        return await self.session.client._run(self._conn.call_end(self._log, call_id, timeout))

    async def add(self, calls: Any, *, format: str | None = None) -> list[str]:
        """Queue more calls in an open turn; their ids."""
        return await self.session.client._run(self._conn.append(self._log, calls, format))

    async def cancel(self, call_id: str) -> None:
        """Stop one call (running: cancelled; queued: never started)."""
        await self.session.client._run(self._conn.cancel_call(self.id, call_id))

    async def close(self) -> None:
        """An open turn takes no more calls; it ends after its last one."""
        await self.session.client._run(self._conn.end_turn(self.id))

    async def interrupt(self) -> None:
        await self.session.interrupt()

    async def abort(self) -> None:
        await self.session.abort()


def _expire(future: asyncio.Future[bool]) -> None:
    """A wait's time is up (False: not done)."""
    if not future.done():
        future.set_result(False)
