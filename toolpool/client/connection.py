"""One client's connection to the daemon, without I/O (sans-IO, as h11 and httpcore).

A ``Connection`` holds everything a client knows: its request ids, the requests
waiting for their replies, its sessions and their approval handlers, the turns whose
events are arriving, and whether the connection still works. Requests become frames
to send (``take_outgoing``); frames from the daemon (``receive``) become replies,
events in their turns' logs and approval requests. It touches no socket, thread or
event loop: a driver (``Client``, ``AsyncClient``) moves the bytes and waits, and
what it waits for is an ``Operation`` (``operation``), which says when it is done
and what came of it.

A frame the client cannot read (or an event it cannot rebuild) is a protocol error:
the connection fails with ``ClientProtocolError``, as it fails with
``DaemonUnavailable`` when the driver reports that the daemon hung up (``lost``) or
the client closes (``close``). Every operation then ends with that error, unless what
it waited for had arrived before.
"""

from __future__ import annotations

import inspect
import itertools
import os
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from toolpool import protocol as wire
from toolpool.client.core import (
    ApprovalRequested,
    TurnLog,
    call_payload,
    custom_calls_of,
    decision,
    submit_message,
)
from toolpool.client.errors import (
    ClientError,
    ClientProtocolError,
    DaemonUnavailable,
    RequestFailed,
)
from toolpool.client.operation import Deferred, Operation, TurnCursor
from toolpool.models import ToolResult
from toolpool.session_options import SessionOptionError, SessionOptions
from toolpool.tracing import TurnTracer, turn_tracer

T = TypeVar("T")
M = TypeVar("M")

ApprovalHandler = Callable[[ApprovalRequested], Any]
CLOSE_TIMEOUT = 2.0  # seconds a session's close waits for the daemon
ACK_BYTES = 256 * 1024  # the client acknowledges what it read this often (SPEC L5)
_ALL_EVENTS = wire.EventSelection.ALL


class Connection:
    """Requests → frames, frames → replies and events; all a client's state."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        self.endpoint = endpoint
        self.timeout = timeout  # a request's default wait for its reply
        self.on_outgoing: Callable[[], None] = lambda: None  # the driver: frames to send
        self._reset(DaemonUnavailable("the client is not connected"))

    def _reset(self, failure: ClientError | None) -> None:
        self.failure = failure
        self.daemon_pid: int | None = None
        self.tool_names: list[str] = []
        self._ids = itertools.count(1)
        self._outgoing: deque[bytes] = deque()  # appended to from any thread
        self._waiting: set[str] = set()  # request ids whose replies are awaited
        self._replies: dict[str, wire.Message] = {}
        self._accepted: dict[str, TurnLog] = {}  # a Submit's request id → its turn's log
        self._selections: dict[str, wire.EventSelection] = {}  # a Submit's, by request id
        self._tracers: dict[str, TurnTracer] = {}  # a Submit's spans to be, by request id
        self._turns: dict[str, TurnLog] = {}  # turns still running, by id
        self._handlers: dict[str, ApprovalHandler | None] = {}  # by session id
        self._readers: dict[str, wire.EventReader] = {}  # running turns' event readers
        self._chunks = wire.Reassembly()
        self._received = 0  # bytes of frames from the daemon, acknowledged in steps
        self._acked = 0

    # -- life --------------------------------------------------------------------------

    def start(self) -> None:
        """The driver's socket is connected: a fresh state; say ``hello`` first."""
        self._reset(None)

    def close(self) -> None:
        """Say goodbye (queued); the client asks nothing more."""
        if self.failure is None:
            self._send(wire.Bye())
        self.fail(DaemonUnavailable("the client is closed"))

    def lost(self) -> None:
        """The driver saw the daemon close the connection (it stopped or died)."""
        self.fail(DaemonUnavailable(f"the daemon at {self.endpoint} closed the connection"))

    def fail(self, error: ClientError) -> None:
        """The connection is unusable: every operation ends with ``error``."""
        if self.failure is None:
            self.failure = error
            for log in self._turns.values():  # their spans end with the connection
                if log.tracer is not None:
                    log.tracer.finish()

    # -- frames out ----------------------------------------------------------------------

    @property
    def has_outgoing(self) -> bool:
        """Frames wait to be sent (``take_outgoing``)."""
        return bool(self._outgoing)

    def take_outgoing(self) -> list[bytes]:
        """The frames to send, in order; the driver sends them all."""
        frames = []
        while self._outgoing:
            frames.append(self._outgoing.popleft())
        return frames

    def _send(self, message: wire.Message) -> None:
        data = wire.encode(message)
        if len(data) > wire.MAX_FRAME_BYTES:
            raise RequestFailed(
                "too_large",
                f"a {message.type.value} of {len(data)} bytes is over the "
                f"{wire.MAX_FRAME_BYTES}-byte frame limit",
            )
        self._outgoing.append(data)
        self.on_outgoing()

    def _request(
        self,
        message: Any,
        finish: Callable[[wire.Message], T],
        timeout: float | None = None,
        late: str | ClientError = "",
    ) -> Operation[T]:
        if self.failure is not None:
            raise self.failure
        request_id: str = message.request_id
        self._waiting.add(request_id)  # first: the reply may come before _send returns
        try:
            self._send(message)
        except RequestFailed:
            self._waiting.discard(request_id)
            raise
        wait = timeout or self.timeout

        def value() -> T:
            self._waiting.discard(request_id)
            reply = self._replies.pop(request_id)
            if isinstance(reply, wire.Error):
                raise RequestFailed(reply.code, reply.message)
            return finish(reply)

        def abandon() -> None:
            self._waiting.discard(request_id)
            self._replies.pop(request_id, None)
            self._selections.pop(request_id, None)
            self._tracers.pop(request_id, None)
            log = self._accepted.pop(request_id, None)
            if log is not None:
                self._turns.pop(log.turn_id, None)
                self._readers.pop(log.turn_id, None)
                if log.tracer is not None:
                    log.tracer.finish()

        return Operation(
            self,
            lambda: request_id in self._replies,
            value,
            wait,
            late or (lambda: f"no answer from the daemon within {wait:g} s"),
            abandon,
        )

    def _next_id(self) -> str:
        return f"r{next(self._ids)}"

    # -- requests ------------------------------------------------------------------------

    def hello(self, name: str, timeout: float) -> Operation[None]:
        """The handshake: the daemon's pid and tools."""

        def welcomed(reply: wire.Message) -> None:
            welcome = expect(reply, wire.Welcome)
            self.daemon_pid = welcome.daemon_pid
            self.tool_names = list(welcome.tools)

        late = DaemonUnavailable(f"no toolpool daemon answers at {self.endpoint}")
        return self._request(wire.Hello(self._next_id(), client=name), welcomed, timeout, late)

    def open_session(
        self, workspace: str | os.PathLike[str], options: dict[str, Any], on: ApprovalHandler | None
    ) -> Operation[str]:
        """A session's id; ``on`` answers its approval requests."""

        def opened(reply: wire.Message) -> str:
            session_id = expect(reply, wire.SessionOpened).session_id
            self._handlers[session_id] = on
            return session_id

        try:  # the check the daemon makes too (E6): refused here, with its words
            checked = SessionOptions.parse(options)
        except SessionOptionError as exc:
            raise RequestFailed(wire.FailureCode.BAD_REQUEST.value, str(exc)) from None
        path = os.path.abspath(workspace)
        message = wire.OpenSession(self._next_id(), path, checked.to_wire())
        return self._request(message, opened)

    def close_session(self, session_id: str) -> Operation[None]:
        """Best effort: nothing to do on a connection that is gone."""
        self._handlers.pop(session_id, None)
        if self.failure is not None:
            return Operation(self, lambda: True, lambda: None)
        message = wire.CloseSession(self._next_id(), session_id)
        return self._request(message, _nothing, CLOSE_TIMEOUT)

    def submit(
        self,
        session_id: str,
        calls: Any,
        format: str | None,
        open: bool,
        events: wire.EventSelection | str = _ALL_EVENTS,
    ) -> Operation[TurnLog]:
        """A turn's log, which fills as its events arrive (those ``events`` selects)."""
        selection = events if type(events) is wire.EventSelection else wire.EventSelection(events)
        message = submit_message(self._next_id(), session_id, calls, format, open, selection)
        if selection is not _ALL_EVENTS:
            self._selections[message.request_id] = selection
        tracer = turn_tracer()  # under the caller's context, now (R3)
        if tracer is not None:
            self._tracers[message.request_id] = tracer

        def accepted(reply: wire.Message) -> TurnLog:
            expect(reply, wire.Accepted)
            log = self._accepted.pop(message.request_id)
            log.custom_calls = custom_calls_of(message.calls)
            return log

        return self._request(message, accepted)

    def steer(self, session_id: str, action: wire.SteerAction) -> Operation[None]:
        return self._request(wire.Steer(self._next_id(), session_id, action), _nothing)

    def append(self, log: TurnLog, calls: Any, format: str | None) -> Operation[list[str]]:
        """The ids of calls queued in an open turn (they join ``log.call_ids``)."""
        payload, format = call_payload(calls, format)

        def appended(reply: wire.Message) -> list[str]:
            ids = list(_data(reply)["call_ids"])
            log.call_ids.extend(ids)
            log.custom_calls |= custom_calls_of(payload)
            return ids

        return self._request(wire.Append(self._next_id(), log.turn_id, payload, format), appended)

    def cancel_call(self, turn_id: str, call_id: str) -> Operation[None]:
        return self._request(wire.CancelCall(self._next_id(), turn_id, call_id), _nothing)

    def end_turn(self, turn_id: str) -> Operation[None]:
        return self._request(wire.EndTurn(self._next_id(), turn_id), _nothing)

    def status(self) -> Operation[dict[str, Any]]:
        return self._request(wire.Status(self._next_id()), lambda r: dict(_data(r)))

    def tools(
        self, format: str, profile: str | None = "toolpool"
    ) -> Operation[list[dict[str, Any]]]:
        """The daemon's tools in ``format``: those a session of ``profile`` is offered
        (toolpool.profiles), every one when None."""
        from toolpool.profiles import check_profile, in_profile  # only when asked

        if profile is not None:
            check_profile(profile)

        def listed(reply: wire.Message) -> list[dict[str, Any]]:
            definitions = list(_data(reply))
            return definitions if profile is None else in_profile(definitions, profile)

        return self._request(wire.Tools(self._next_id(), format), listed)

    # -- waiting on turns ------------------------------------------------------------------

    def turn_end(self, log: TurnLog, timeout: float | None) -> Operation[tuple[ToolResult, ...]]:
        def results() -> tuple[ToolResult, ...]:
            assert log.results is not None
            return log.results

        def late() -> str:
            return f"the turn did not end within {timeout or 0:g} s"

        return Operation(self, lambda: log.results is not None, results, timeout, late)

    def call_end(self, log: TurnLog, call_id: str, timeout: float | None) -> Operation[ToolResult]:
        def late() -> str:
            return f"call {call_id} did not end within {timeout or 0:g} s"

        return Operation(
            self, lambda: call_id in log.ended, lambda: log.ended[call_id], timeout, late
        )

    def cursor(self, log: TurnLog, follow: bool) -> TurnCursor:
        return TurnCursor(self, log, follow)

    # -- frames in -----------------------------------------------------------------------

    def receive(self, frame: bytes) -> list[Deferred]:
        """File one frame from the daemon. What comes back are approvals whose handler
        is async: the driver awaits each and gives its value to ``decide``."""
        if self.failure is not None:
            return []  # what arrives after the end changes nothing
        self._received += len(frame)
        if self._received - self._acked >= ACK_BYTES:
            self._acked = self._received
            self._send(wire.Ack(self._received))
        try:
            message = wire.decode(frame)
            if type(message) is wire.Chunk or self._chunks.pending:
                whole = self._joined(message)
                if whole is None:
                    return []  # a stream's chunk, not its last
                message = whole
        except wire.ProtocolError as exc:
            self.fail(ClientProtocolError(str(exc)))
            return []
        match message:
            case wire.TurnEvent():  # first: nearly every frame is one
                self._events(message)
            case wire.ApprovalRequest():
                return self._approval(message)
            case wire.Ping():
                pass  # the daemon checks that we are there: a delivered ping says so
            case wire.Error() if _let_go(message):
                self.fail(DaemonUnavailable(message.message))
            case _:
                request_id = getattr(message, "request_id", None)
                if request_id in self._waiting:  # else: a reply nobody waits for now
                    self._reply(request_id, message)
        return []

    def _joined(self, message: wire.Message) -> wire.Message | None:
        """A chunk joins its stream: the whole message once the stream ends, else None.
        A stream is never interleaved with other frames, but for the daemon's last word
        (which cuts it short)."""
        if isinstance(message, wire.Chunk):
            whole = self._chunks.add(message)
            if whole is None:
                return None
            message = wire.decode(whole)
            if isinstance(message, wire.Chunk):
                raise wire.ProtocolError("a chunked message that is a chunk")
        elif not _let_go(message):
            raise wire.ProtocolError(f"a {message.type.value} amid a chunked message")
        return message

    def _reply(self, request_id: str, message: wire.Message) -> None:
        selection = self._selections.pop(request_id, _ALL_EVENTS)
        if isinstance(message, wire.Accepted):
            # The turn's events may be right behind its acceptance: its log comes first.
            log = TurnLog(message.turn_id, list(message.call_ids))
            log.tracer = self._tracers.pop(request_id, None)
            if log.tracer is not None:
                log.tracer.begin(message.turn_id, len(message.call_ids))
            self._turns[message.turn_id] = log
            self._readers[message.turn_id] = wire.EventReader(selection)
            self._accepted[request_id] = log
        self._replies[request_id] = message

    def _events(self, message: wire.TurnEvent) -> None:
        log = self._turns.get(message.turn_id)
        if log is None:
            return  # not a turn of this client's, or one it gave up on
        reader = self._readers[message.turn_id]
        try:
            events = reader.read_all(message.events)
        except (KeyError, ValueError, TypeError) as exc:
            self.fail(ClientProtocolError(f"unreadable event from the daemon: {exc}"))
            return
        log.extend(events)
        if log.results is not None:
            del self._turns[message.turn_id]  # ended; its Turn keeps the log
            del self._readers[message.turn_id]

    def _approval(self, message: wire.ApprovalRequest) -> list[Deferred]:
        item = ApprovalRequested(message, self._answer)
        handler = self._handlers.get(message.session_id)
        if handler is None:
            self._file(item)  # the turn's reader answers it (or nobody, and it times out)
            return []
        value = handler(item)
        if inspect.isawaitable(value):
            return [Deferred(item, value)]
        self.decide(item, value)
        return []

    def decide(self, item: ApprovalRequested, value: Any) -> None:
        """An ``on_approval`` handler returned ``value`` (True, False or (allowed,
        reason)): the answer is queued, and the request joins its turn's items."""
        if self.failure is None:
            allowed, reason = decision(value)
            item._reply(allowed, reason)  # nothing new when the handler answered itself
        self._file(item)

    def refuse(self, deferred: Deferred, reason: str) -> None:
        """A handler's awaitable that the driver cannot await: dropped, the call denied."""
        close = getattr(deferred.decision, "close", None)
        if callable(close):
            close()  # a coroutine that will not run says nothing about it
        self.decide(deferred.item, (False, reason))

    def _answer(self, reply: wire.ApprovalReply) -> None:
        if self.failure is not None:
            raise self.failure
        self._send(reply)

    def _file(self, item: ApprovalRequested) -> None:
        log = self._turns.get(item.request.turn_id)
        if log is not None:
            log.add(item)


def expect(reply: wire.Message, kind: type[M]) -> M:
    """``reply`` as the answer its request must get; ClientProtocolError if not."""
    if not isinstance(reply, kind):
        raise ClientProtocolError(f"expected {kind.__name__}, got {reply.type.value}")
    return reply


def _let_go(message: wire.Message) -> bool:
    """The daemon's last word to a client it disconnects (it stalled, SPEC L5)."""
    return (
        isinstance(message, wire.Error)
        and message.request_id is None
        and message.code is wire.FailureCode.DISCONNECTED
    )


def _data(reply: wire.Message) -> Any:
    return expect(reply, wire.Reply).data


def _nothing(reply: wire.Message) -> None:
    expect(reply, wire.Reply)


__all__ = ["CLOSE_TIMEOUT", "ApprovalHandler", "Connection", "expect"]
