"""The blocking client.

    with toolpool.Client() as client:
        with client.session(workspace="/path/to/repo", gate="ask") as session:
            turn = session.submit([ToolCall("1", "read", {"path": "README.md"})])
            for event in turn:          # as they happen
                print(event)
            results = turn.results()    # in call order

One thread at a time: whoever waits reads the socket and files what arrives under
its request or turn (a lock keeps two threads from reading at once).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import zmq

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

ApprovalHandler = Callable[[ApprovalRequested], Any]
CLOSE_TIMEOUT = 2.0  # seconds a session's close waits for the daemon


class Client:
    """A connection to the toolpool daemon; a context manager.

    ``endpoint`` defaults to the running daemon's socket (runtime directory);
    ``timeout`` bounds each request's wait for its reply; ``curve`` is
    (server public key, client public key, client secret key) for a CURVE endpoint.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        runtime_dir: str | Path | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        curve: tuple[bytes, bytes, bytes] | None = None,
        name: str = "toolpool.Client",
    ) -> None:
        self.endpoint = resolve_endpoint(endpoint, runtime_dir).address
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._curve = curve
        self._name = name
        self._core = ClientCore()
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._socket: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._replies: dict[str, Message] = {}
        self._turns: dict[str, TurnLog] = {}
        self._accepted: dict[str, TurnLog] = {}  # request id → the log of its turn
        self._handlers: dict[str, ApprovalHandler | None] = {}
        self._lock = threading.RLock()
        self.daemon_pid: int | None = None
        self.tool_names: list[str] = []

    # -- connection --------------------------------------------------------------------

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def connect(self) -> None:
        self._context = zmq.Context()
        socket = self._context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 500)
        if self._curve is not None:
            server, public, secret = self._curve
            socket.curve_serverkey = server
            socket.curve_publickey = public
            socket.curve_secretkey = secret
        # The monitor tells us when the daemon closes the connection (it stopped or
        # died), so that nobody waits out a timeout for an answer that cannot come.
        self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(self.endpoint)
        self._socket = socket
        try:
            welcome = self._request(
                Hello(self._core.next_id(), client=self._name), self.connect_timeout
            )
        except ClientTimeout:
            self.close()
            raise DaemonUnavailable(f"no toolpool daemon answers at {self.endpoint}") from None
        except Exception:
            self.close()
            raise
        if not isinstance(welcome, Welcome):
            raise ClientProtocolError(f"expected welcome, got {welcome.type.value}")
        self.daemon_pid = welcome.daemon_pid
        self.tool_names = list(welcome.tools)

    def close(self) -> None:
        """Say goodbye (the daemon closes this client's sessions) and disconnect."""
        if self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._socket.send(self._core.frame(Bye()), zmq.NOBLOCK)
            self._socket.disable_monitor()
            self._socket.close()
            self._socket = None
        if self._monitor is not None:
            self._monitor.close()
            self._monitor = None
        if self._context is not None:
            self._context.term()
            self._context = None

    # -- the wire ------------------------------------------------------------------------

    def _send(self, message: Message) -> None:
        if self._socket is None:
            raise DaemonUnavailable("the client is not connected")
        self._socket.send(self._core.frame(message))

    def _request(self, message: Any, timeout: float | None = None) -> Message:
        request_id = message.request_id
        with self._lock:
            self._send(message)
            self._pump_until(lambda: request_id in self._replies, timeout or self.timeout)
            return self._core.reply_value(self._replies.pop(request_id))

    def _pump_until(self, done: Callable[[], bool], timeout: float | None) -> None:
        """Read and file messages until ``done()``; ClientTimeout after ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        assert self._socket is not None
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor, zmq.POLLIN)
        while not done():
            wait = 1000 if deadline is None else int(max(0.0, deadline - time.monotonic()) * 1000)
            if deadline is not None and wait == 0:
                raise ClientTimeout(f"no answer from the daemon within {timeout:g} s")
            ready = dict(poller.poll(wait))
            if self._socket in ready:
                self._read_waiting()
            elif self._monitor is not None and self._monitor in ready:
                self._monitor.recv_multipart()
                self._read_waiting()  # what the daemon sent before it went still counts
                if not done():
                    raise DaemonUnavailable(f"the daemon at {self.endpoint} closed the connection")

    def _read_waiting(self) -> None:
        """File every message that has arrived, without waiting for more."""
        assert self._socket is not None
        while True:
            try:
                frame = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = decode(frame)
            except ProtocolError as exc:
                raise ClientProtocolError(str(exc)) from None
            self._file(message)

    def _file(self, message: Message) -> None:
        kind, key = self._core.key(message)
        if kind == "reply":
            assert key is not None
            if isinstance(message, Accepted):
                # The turn's events may be right behind: its log must exist first.
                fresh = TurnLog(message.turn_id, list(message.call_ids))
                self._turns[message.turn_id] = fresh
                self._accepted[key] = fresh
            self._replies[key] = message
        elif kind == "event":
            assert isinstance(message, TurnEvent)
            log = self._turns.get(message.turn_id)
            if log is not None:
                for event in self._core.events(message):
                    log.add(event)
                if log.results is not None:
                    del self._turns[message.turn_id]  # the Turn keeps its log
        elif kind == "approval":
            assert isinstance(message, ApprovalRequest)
            self._approval(message)
        # pings and orphan errors need nothing

    def _approval(self, message: ApprovalRequest) -> None:
        item = ApprovalRequested(message, self._send)
        handler = self._handlers.get(message.session_id)
        if handler is not None:
            allowed, reason = decision(handler(item))
            self._send(ApprovalReply(message.approval_id, allowed, reason))
            item.answered = True
        log = self._turns.get(message.turn_id)
        if log is not None:
            log.add(item)

    # -- requests ------------------------------------------------------------------------

    def session(
        self,
        workspace: str | Path,
        *,
        on_approval: ApprovalHandler | None = None,
        **options: Any,
    ) -> Session:
        """Open a session on ``workspace``. Options: extra_roots, allow_network,
        max_tool_errors, limits, gate ("allow", "ask", "policy"), policy (rules),
        approval_timeout, max_tool_concurrency. ``on_approval(request)`` answers the
        gate's questions (True, False, or (False, "reason"))."""
        message = OpenSession(self._core.next_id(), os.path.abspath(workspace), options)
        opened = self._request(message)
        assert isinstance(opened, SessionOpened)
        self._handlers[opened.session_id] = on_approval
        return Session(self, opened.session_id)

    def status(self) -> dict[str, Any]:
        reply = self._request(Status(self._core.next_id()))
        assert isinstance(reply, Reply)
        return dict(reply.data)

    def tools(self, format: str = "toolpool") -> list[dict[str, Any]]:
        reply = self._request(Tools(self._core.next_id(), format))
        assert isinstance(reply, Reply)
        return list(reply.data)


class Session:
    """A session in the daemon; its turns run one after another. A context manager."""

    def __init__(self, client: Client, session_id: str) -> None:
        self.client = client
        self.id = session_id

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def submit(self, calls: Any, *, format: str | None = None, open: bool = False) -> Turn:
        """Start a turn: ToolCalls (or their dicts), or model output in ``format``.
        An ``open`` turn takes more calls (``Turn.add``) until ``Turn.close``."""
        client = self.client
        message = submit_message(client._core.next_id(), self.id, calls, format, open)
        try:
            accepted = client._request(message)
        finally:
            log = client._accepted.pop(message.request_id, None)
        assert isinstance(accepted, Accepted)
        assert log is not None
        return Turn(self, log)

    def interrupt(self) -> None:
        """S4: the user sent a new message. "cancel" calls stop, the queued are skipped."""
        self.client._request(Steer(self.client._core.next_id(), self.id, "interrupt"))

    def abort(self) -> None:
        """S5: cancel everything the session is running or has queued."""
        self.client._request(Steer(self.client._core.next_id(), self.id, "abort"))

    def close(self) -> None:
        """End the session in the daemon. Best effort: a daemon that is gone or
        stopping has ended it already, so waiting long or raising would help no one."""
        client = self.client
        client._handlers.pop(self.id, None)
        if client._socket is None:
            return
        with contextlib.suppress(ClientTimeout, RequestFailed, DaemonUnavailable):
            client._request(CloseSession(client._core.next_id(), self.id), CLOSE_TIMEOUT)


class Turn:
    """A submitted turn: iterate its events as they happen; ``results()`` waits."""

    def __init__(self, session: Session, log: TurnLog) -> None:
        self.session = session
        self._log = log
        self.id = log.turn_id
        self.call_ids = log.call_ids

    def __iter__(self) -> Iterator[TurnItem]:
        """Every event (and unanswered approval request), ending with turn_end."""
        return self._iterate(forget=False)

    def follow(self) -> Iterator[TurnItem]:
        """Like iterating, but the turn lets go of what has been yielded (``events``
        then holds only what is not read yet): for open turns that live long."""
        return self._iterate(forget=True)

    def _iterate(self, forget: bool) -> Iterator[TurnItem]:
        client = self.session.client
        log = self._log
        seen = log.first
        while True:

            def arrived(wanted: int = seen + 1) -> bool:
                return log.count >= wanted

            with client._lock:
                client._pump_until(arrived, None)
            item = log.item(seen)
            seen += 1
            if forget:
                log.forget_before(seen)
            yield item
            if log.results is not None and seen == log.count:
                return

    def results(self, timeout: float | None = None) -> tuple[ToolResult, ...]:
        """Wait for the turn's end; its results, in call order (S6)."""
        client = self.session.client
        with client._lock:
            client._pump_until(lambda: self._log.results is not None, timeout)
        assert self._log.results is not None
        return self._log.results

    def results_as(self, format: str, timeout: float | None = None) -> Any:
        """The results in a provider's shape ("openai", "anthropic", …)."""
        return results_as(self.results(timeout), format)

    def result(self, call_id: str, timeout: float | None = None) -> ToolResult:
        """Wait for one call's end; its result."""
        client = self.session.client
        with client._lock:
            client._pump_until(lambda: call_id in self._log.ended, timeout)
        return self._log.ended[call_id]

    def add(self, calls: Any, *, format: str | None = None) -> list[str]:
        """Queue more calls in an open turn; their ids."""
        client = self.session.client
        payload, format = call_payload(calls, format)
        reply = client._request(Append(client._core.next_id(), self.id, payload, format))
        assert isinstance(reply, Reply)
        ids = list(reply.data["call_ids"])
        self.call_ids.extend(ids)
        return ids

    def cancel(self, call_id: str) -> None:
        """Stop one call (running: cancelled; queued: never started)."""
        client = self.session.client
        client._request(CancelCall(client._core.next_id(), self.id, call_id))

    def close(self) -> None:
        """An open turn takes no more calls; it ends after its last one."""
        client = self.session.client
        client._request(EndTurn(client._core.next_id(), self.id))

    @property
    def events(self) -> list[TurnItem]:
        """What arrived so far (but what ``follow()`` let go of)."""
        return list(self._log.items)

    def interrupt(self) -> None:
        self.session.interrupt()

    def abort(self) -> None:
        self.session.abort()
