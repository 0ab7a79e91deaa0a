"""The asyncio client.

    async with toolpool.AsyncClient() as client:
        async with client.session(workspace="/path/to/repo") as session:
            turn = await session.submit(calls)
            async for event in turn:
                print(event)
            results = await turn.results()

A reader task files what arrives: replies to the requests awaiting them, events to
their turns, approval requests to their sessions' handlers (sync or async).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from toolpool.client.core import (
    ApprovalRequested,
    ClientCore,
    TurnItem,
    TurnLog,
    call_payload,
    decision,
    resolve_endpoint,
    results_as,
    submit_message,
)
from toolpool.client.errors import (
    ClientError,
    ClientProtocolError,
    ClientTimeout,
    DaemonUnavailable,
    RequestFailed,
)
from toolpool.models import ToolResult
from toolpool.protocol import (
    Accepted,
    Append,
    ApprovalReply,
    ApprovalRequest,
    Bye,
    CancelCall,
    CloseSession,
    EndTurn,
    Hello,
    Message,
    OpenSession,
    ProtocolError,
    Reply,
    SessionOpened,
    Status,
    Steer,
    Tools,
    TurnEvent,
    Welcome,
    decode,
)

AsyncApprovalHandler = Callable[[ApprovalRequested], Any | Awaitable[Any]]
CLOSE_TIMEOUT = 2.0  # seconds a session's close waits for the daemon


class _Stream:
    """A turn's log plus a wake-up for those waiting on it."""

    def __init__(self, log: TurnLog) -> None:
        self.log = log
        self.changed = asyncio.Event()

    def add(self, item: TurnItem) -> None:
        self.log.add(item)
        self.changed.set()


class AsyncClient:
    """A connection to the toolpool daemon for asyncio programs; an async context
    manager. Arguments as for ``toolpool.Client``."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        runtime_dir: str | Path | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        curve: tuple[bytes, bytes, bytes] | None = None,
        name: str = "toolpool.AsyncClient",
    ) -> None:
        self.endpoint = resolve_endpoint(endpoint, runtime_dir).address
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._curve = curve
        self._name = name
        self._core = ClientCore()
        self._context: zmq.asyncio.Context | None = None
        self._socket: zmq.asyncio.Socket | None = None
        self._reader: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Future[Message]] = {}
        self._streams: dict[str, _Stream] = {}
        self._accepted: dict[str, _Stream] = {}  # request id → the stream of its turn
        self._handlers: dict[str, AsyncApprovalHandler | None] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._failure: ClientError | None = None
        self.daemon_pid: int | None = None
        self.tool_names: list[str] = []

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def connect(self) -> None:
        self._context = zmq.asyncio.Context()
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 500)
        if self._curve is not None:
            server, public, secret = self._curve
            socket.curve_serverkey = server
            socket.curve_publickey = public
            socket.curve_secretkey = secret
        monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(self.endpoint)
        self._socket = socket
        self._reader = asyncio.ensure_future(self._read())
        self._watcher = asyncio.ensure_future(self._watch(monitor))
        try:
            welcome = await self._request(
                Hello(self._core.next_id(), client=self._name), self.connect_timeout
            )
        except ClientTimeout:
            await self.close()
            raise DaemonUnavailable(f"no toolpool daemon answers at {self.endpoint}") from None
        except BaseException:
            await self.close()
            raise
        if not isinstance(welcome, Welcome):
            raise ClientProtocolError(f"expected welcome, got {welcome.type.value}")
        self.daemon_pid = welcome.daemon_pid
        self.tool_names = list(welcome.tools)

    async def close(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                await self._socket.send(self._core.frame(Bye()), zmq.NOBLOCK)
        for task in (self._reader, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reader = self._watcher = None
        for task in list(self._tasks):
            task.cancel()
        if self._socket is not None:
            self._socket.disable_monitor()
            self._socket.close()
            self._socket = None
        if self._context is not None:
            self._context.term()
            self._context = None

    # -- the wire ------------------------------------------------------------------------

    async def _send(self, message: Message) -> None:
        if self._socket is None:
            raise DaemonUnavailable("the client is not connected")
        await self._socket.send(self._core.frame(message))

    async def _request(self, message: Any, timeout: float | None = None) -> Message:
        if self._failure is not None:
            raise self._failure
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._waiting[message.request_id] = future
        try:
            await self._send(message)
            reply = await asyncio.wait_for(future, timeout or self.timeout)
        except TimeoutError:
            raise ClientTimeout(
                f"no answer from the daemon within {timeout or self.timeout:g} s"
            ) from None
        finally:
            self._waiting.pop(message.request_id, None)
        return self._core.reply_value(reply)

    async def _read(self) -> None:
        assert self._socket is not None
        try:
            while True:
                frame = await self._socket.recv()
                try:
                    message = decode(frame)
                except ProtocolError as exc:
                    raise ClientProtocolError(str(exc)) from None
                self._file(message)
        except ClientError as exc:
            self._fail(exc)

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """The daemon closed the connection (it stopped or died): fail whoever waits."""
        try:
            await monitor.recv_multipart()
            # What the daemon sent before it went still counts: let the reader file it.
            pending = self._socket is not None and await self._socket.poll(timeout=0)
            while pending:  # a yield to the reader, not a wait for a condition
                await asyncio.sleep(0)
                pending = self._socket is not None and await self._socket.poll(timeout=0)
            self._fail(DaemonUnavailable(f"the daemon at {self.endpoint} closed the connection"))
        finally:
            monitor.close()

    def _fail(self, error: ClientError) -> None:
        """The connection is unusable: wake everyone who waits, with the error."""
        self._failure = error
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(error)
        for stream in self._streams.values():
            stream.changed.set()

    def _file(self, message: Message) -> None:
        kind, key = self._core.key(message)
        if kind == "reply":
            assert key is not None
            if isinstance(message, Accepted):
                # The turn's events may be right behind: its stream must exist first.
                fresh = _Stream(TurnLog(message.turn_id, list(message.call_ids)))
                self._streams[message.turn_id] = fresh
                self._accepted[key] = fresh
            future = self._waiting.get(key)
            if future is not None and not future.done():
                future.set_result(message)
        elif kind == "event":
            assert isinstance(message, TurnEvent)
            stream = self._streams.get(message.turn_id)
            if stream is not None:
                for event in self._core.events(message):
                    stream.add(event)
                if stream.log.results is not None:
                    del self._streams[message.turn_id]  # the Turn keeps its stream
        elif kind == "approval":
            assert isinstance(message, ApprovalRequest)
            task = asyncio.ensure_future(self._approval(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _approval(self, message: ApprovalRequest) -> None:
        def answer(reply: ApprovalReply) -> Awaitable[None]:
            return self._send(reply)

        item = ApprovalRequested(message, answer)
        handler = self._handlers.get(message.session_id)
        if handler is not None:
            value = handler(item)
            if inspect.isawaitable(value):
                value = await value
            allowed, reason = decision(value)
            await self._send(ApprovalReply(message.approval_id, allowed, reason))
            item.answered = True
        stream = self._streams.get(message.turn_id)
        if stream is not None:
            stream.add(item)

    # -- requests ------------------------------------------------------------------------

    def session(
        self,
        workspace: str | Path,
        *,
        on_approval: AsyncApprovalHandler | None = None,
        **options: Any,
    ) -> _SessionOpener:
        """Open a session (await it, or use it as an async context manager). Options
        as for ``toolpool.Client.session``; ``on_approval`` may be async."""
        return _SessionOpener(self, os.path.abspath(workspace), on_approval, options)

    async def _open(
        self,
        workspace: str | Path,
        on_approval: AsyncApprovalHandler | None,
        options: dict[str, Any],
    ) -> AsyncSession:
        message = OpenSession(self._core.next_id(), str(workspace), options)
        opened = await self._request(message)
        assert isinstance(opened, SessionOpened)
        self._handlers[opened.session_id] = on_approval
        return AsyncSession(self, opened.session_id)

    async def status(self) -> dict[str, Any]:
        reply = await self._request(Status(self._core.next_id()))
        assert isinstance(reply, Reply)
        return dict(reply.data)

    async def tools(self, format: str = "toolpool") -> list[dict[str, Any]]:
        reply = await self._request(Tools(self._core.next_id(), format))
        assert isinstance(reply, Reply)
        return list(reply.data)


class _SessionOpener:
    def __init__(
        self,
        client: AsyncClient,
        workspace: str | Path,
        on_approval: AsyncApprovalHandler | None,
        options: dict[str, Any],
    ) -> None:
        self._args = (workspace, on_approval, options)
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


class AsyncSession:
    def __init__(self, client: AsyncClient, session_id: str) -> None:
        self.client = client
        self.id = session_id

    async def submit(
        self, calls: Any, *, format: str | None = None, open: bool = False
    ) -> AsyncTurn:
        client = self.client
        message = submit_message(client._core.next_id(), self.id, calls, format, open)
        try:
            accepted = await client._request(message)
        finally:
            filed = client._accepted.pop(message.request_id, None)
        assert isinstance(accepted, Accepted)
        assert filed is not None
        return AsyncTurn(self, filed)

    async def interrupt(self) -> None:
        await self.client._request(Steer(self.client._core.next_id(), self.id, "interrupt"))

    async def abort(self) -> None:
        await self.client._request(Steer(self.client._core.next_id(), self.id, "abort"))

    async def close(self) -> None:
        """End the session in the daemon; best effort, as for the blocking client."""
        client = self.client
        client._handlers.pop(self.id, None)
        if client._socket is None or client._failure is not None:
            return
        with contextlib.suppress(ClientTimeout, RequestFailed, DaemonUnavailable):
            await client._request(CloseSession(client._core.next_id(), self.id), CLOSE_TIMEOUT)


class AsyncTurn:
    def __init__(self, session: AsyncSession, stream: _Stream) -> None:
        self.session = session
        self._stream = stream
        self.id = stream.log.turn_id
        self.call_ids = stream.log.call_ids

    def __aiter__(self) -> AsyncIterator[TurnItem]:
        """Every event (and unanswered approval request), ending with turn_end."""
        return self._iterate(forget=False)

    def follow(self) -> AsyncIterator[TurnItem]:
        """Like iterating, but the turn lets go of what has been yielded (``events``
        then holds only what is not read yet): for open turns that live long."""
        return self._iterate(forget=True)

    async def _iterate(self, forget: bool) -> AsyncIterator[TurnItem]:
        log = self._stream.log
        seen = log.first
        while True:
            while log.count <= seen:
                self._check()
                self._stream.changed.clear()
                await self._stream.changed.wait()
            item = log.item(seen)
            seen += 1
            if forget:
                log.forget_before(seen)
            yield item
            if log.results is not None and seen == log.count:
                return

    def _check(self) -> None:
        failure = self.session.client._failure
        if failure is not None:
            raise failure

    async def results(self, timeout: float | None = None) -> tuple[ToolResult, ...]:
        async def ended() -> tuple[ToolResult, ...]:
            while self._stream.log.results is None:
                self._check()
                self._stream.changed.clear()
                await self._stream.changed.wait()
            return self._stream.log.results

        try:
            return await asyncio.wait_for(ended(), timeout)
        except TimeoutError:
            raise ClientTimeout(f"the turn did not end within {timeout:g} s") from None

    async def results_as(self, format: str, timeout: float | None = None) -> Any:
        return results_as(await self.results(timeout), format)

    async def result(self, call_id: str, timeout: float | None = None) -> ToolResult:
        """Wait for one call's end; its result."""

        async def ended() -> ToolResult:
            while call_id not in self._stream.log.ended:
                self._check()
                self._stream.changed.clear()
                await self._stream.changed.wait()
            return self._stream.log.ended[call_id]

        try:
            return await asyncio.wait_for(ended(), timeout)
        except TimeoutError:
            raise ClientTimeout(f"call {call_id} did not end within {timeout:g} s") from None

    async def add(self, calls: Any, *, format: str | None = None) -> list[str]:
        """Queue more calls in an open turn; their ids."""
        client = self.session.client
        payload, format = call_payload(calls, format)
        reply = await client._request(Append(client._core.next_id(), self.id, payload, format))
        assert isinstance(reply, Reply)
        ids = list(reply.data["call_ids"])
        self.call_ids.extend(ids)
        return ids

    async def cancel(self, call_id: str) -> None:
        """Stop one call (running: cancelled; queued: never started)."""
        client = self.session.client
        await client._request(CancelCall(client._core.next_id(), self.id, call_id))

    async def close(self) -> None:
        """An open turn takes no more calls; it ends after its last one."""
        client = self.session.client
        await client._request(EndTurn(client._core.next_id(), self.id))

    @property
    def events(self) -> list[TurnItem]:
        return list(self._stream.log.items)

    async def interrupt(self) -> None:
        await self.session.interrupt()

    async def abort(self) -> None:
        await self.session.abort()
