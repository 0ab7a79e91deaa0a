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

import itertools
import os
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from toolpool import protocol as wire
from toolpool.client.approvals import ApprovalHandler, Approvals
from toolpool.client.core import TurnLog, call_payload, custom_calls_of
from toolpool.client.errors import (
    ClientError,
    ClientProtocolError,
    DaemonUnavailable,
    RequestFailed,
)
from toolpool.client.operation import (
    Answer,
    CallEnded,
    Condition,
    Deferred,
    Operation,
    TurnCursor,
    TurnEnded,
)
from toolpool.models import ToolResult
from toolpool.session_options import SessionOptionError, SessionOptions
from toolpool.tracing import turn_tracer

T = TypeVar("T")
M = TypeVar("M")

CLOSE_TIMEOUT = 2.0  # seconds a session's close waits for the daemon
# The client acknowledges what it read once this much is unacknowledged (SPEC L5): a
# 32nd of the smallest window, so a client that reads never lets the window fill, and
# a stream of small turns sends an Ack every few thousand frames, not one per frame.
ACK_BYTES = 256 * 1024
# By value, from a string or a member (an enum's call costs more than a submit's frame).
_SELECTIONS = {selection.value: selection for selection in wire.EventSelection}
# The classes receive() tells apart, looked up once.
_TURN_EVENT, _ACCEPTED, _CHUNK, _ERROR = wire.TurnEvent, wire.Accepted, wire.Chunk, wire.Error
_APPROVAL_REQUEST, _PING = wire.ApprovalRequest, wire.Ping
_NOTHING: tuple[Deferred, ...] = ()


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
        # The frames to send, in order, appended to from any thread; a driver pops
        # each once its socket took it.
        self.outgoing: deque[bytes] = deque()
        self._waiting: set[str] = set()  # request ids whose replies are awaited
        self.replies: dict[str, wire.Message] = {}  # that came, by request id, not taken
        self._submits: dict[str, TurnLog] = {}  # a Submit's log, by request id, to be
        self._turns: dict[str, TurnLog] = {}  # turns still running, by id
        # The sessions' on_approval handlers, and the requests routed to them.
        self.approvals = Approvals(self._turns, self._send, lambda: self.failure)
        self._handlers: dict[str, ApprovalHandler | None] = self.approvals.handlers
        # The tools each session shipped (SPEC A5), by session id: what a toolbox lists.
        self.shipped: dict[str, tuple[wire.ShippedTool, ...]] = {}
        self._chunks = wire.Reassembly()
        self._chunking = False  # a stream of chunks has begun and not ended
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

    def take_outgoing(self) -> list[bytes]:
        """The frames to send, in order, taken off ``outgoing``."""
        frames = []
        while self.outgoing:
            frames.append(self.outgoing.popleft())
        return frames

    def _send(self, message: wire.Message) -> None:
        data = wire.encode(message)
        if len(data) > wire.MAX_FRAME_BYTES:
            raise RequestFailed(
                "too_large",
                f"a {message.type.value} of {len(data)} bytes is over the "
                f"{wire.MAX_FRAME_BYTES}-byte frame limit",
            )
        self.outgoing.append(data)
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
            self.forget(request_id)
            raise
        return Answer(self, request_id, finish, timeout or self.timeout, late)

    def take_reply(self, request_id: str) -> wire.Message:
        """The reply to ``request_id``, which came (``replies``); RequestFailed when it
        is the daemon's refusal."""
        self._waiting.discard(request_id)
        reply = self.replies.pop(request_id)
        if type(reply) is _ERROR:
            assert isinstance(reply, wire.Error)
            raise RequestFailed(reply.code, reply.message)
        return reply

    def forget(self, request_id: str) -> None:
        """A request nobody waits for any more: what was kept for it goes."""
        self._waiting.discard(request_id)
        self.replies.pop(request_id, None)
        log = self._submits.pop(request_id, None)
        if log is not None:
            self._turns.pop(log.turn_id, None)
            if log.tracer is not None:
                log.tracer.finish()

    def _next_id(self) -> str:
        return f"r{next(self._ids)}"

    next_id = _next_id  # for the requests made elsewhere (``branching``)

    def request(
        self, message: Any, finish: Callable[[wire.Message], T], timeout: float | None = None
    ) -> Operation[T]:
        """A request made elsewhere (``branching``): sent, its reply awaited."""
        return self._request(message, finish, timeout)

    def adopt(self, session_id: str, parent: str) -> None:
        """``session_id`` (a fork of ``parent``) is answered as its parent's approvals are."""
        self._handlers[session_id] = self._handlers.get(parent)

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
        self,
        workspace: str | os.PathLike[str],
        options: dict[str, Any],
        on: ApprovalHandler | None,
        tools: Sequence[Any] = (),
    ) -> Operation[str]:
        """A session's id; ``on`` answers its approval requests; ``tools`` are
        functions of this program, shipped for the session alone (SPEC A5: a
        ``ShippingError`` when one cannot be, before anything is sent)."""
        packed: wire.ShippedTools | None = None

        def opened(reply: wire.Message) -> str:
            session_id = expect(reply, wire.SessionOpened).session_id
            self._handlers[session_id] = on
            if packed is not None:
                self.shipped[session_id] = packed.tools
            return session_id

        try:  # the check the daemon makes too (E6): refused here, with its words
            checked = SessionOptions.parse(options)
        except SessionOptionError as exc:
            raise RequestFailed(wire.FailureCode.BAD_REQUEST.value, str(exc)) from None
        if tools:
            from toolpool.client.shipping import pack  # dill, only for a client that ships

            packed = pack(tools)
        path = os.path.abspath(workspace)
        message = wire.OpenSession(self._next_id(), path, checked.to_wire(), packed)
        return self._request(message, opened)

    def close_session(self, session_id: str) -> Operation[None]:
        """Best effort: nothing to do on a connection that is gone."""
        self._handlers.pop(session_id, None)
        self.shipped.pop(session_id, None)
        if self.failure is not None:
            return Condition(self, lambda: True, lambda: None)
        message = wire.CloseSession(self._next_id(), session_id)
        return self._request(message, _nothing, CLOSE_TIMEOUT)

    def submit(
        self,
        session_id: str,
        calls: Any,
        format: str | None,
        open: bool,
        events: wire.EventSelection | str = wire.EventSelection.ALL,
    ) -> Operation[TurnLog]:
        """A turn's log, which fills as its events arrive (those ``events`` selects)."""
        if self.failure is not None:
            raise self.failure
        selection = _SELECTIONS.get(events) or wire.EventSelection(events)
        payload, format = call_payload(calls, format)
        message = wire.Submit(self._next_id(), session_id, payload, format, open, selection)
        # Its log waits for its acceptance: the turn's events may be right behind it.
        log = TurnLog("", [], wire.EventReader(selection), tracer=turn_tracer())  # now (R3)
        log.custom_calls = custom_calls_of(payload, format)
        self._submits[message.request_id] = log
        return self._request(message, self._accepted)

    def _accepted(self, reply: wire.Message) -> TurnLog:
        return self._submits.pop(expect(reply, wire.Accepted).request_id)

    def steer(self, session_id: str, action: wire.SteerAction) -> Operation[None]:
        return self._request(wire.Steer(self._next_id(), session_id, action), _nothing)

    def append(self, log: TurnLog, calls: Any, format: str | None) -> Operation[list[str]]:
        """The ids of calls queued in an open turn (they join ``log.call_ids``)."""
        payload, format = call_payload(calls, format)

        def appended(reply: wire.Message) -> list[str]:
            ids = list(_data(reply)["call_ids"])
            log.call_ids.extend(ids)
            log.custom_calls |= custom_calls_of(payload, format)
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
        return TurnEnded(self, log, timeout)

    def call_end(self, log: TurnLog, call_id: str, timeout: float | None) -> Operation[ToolResult]:
        return CallEnded(self, log, call_id, timeout)

    def cursor(self, log: TurnLog, follow: bool) -> TurnCursor:
        return TurnCursor(self, log, follow)

    # -- frames in -----------------------------------------------------------------------

    def receive(self, frame: bytes) -> Sequence[Deferred]:
        """File one frame from the daemon: a message, or one part of a message of
        several parts (the daemon sends some replies and events together), each part
        read as if it had come alone, in order. What comes back are approvals whose
        handler is async: the driver awaits each and gives its value to ``decide``."""
        if self.failure is not None:
            return _NOTHING  # what arrives after the end changes nothing
        self._received += len(frame)
        if self._received - self._acked >= ACK_BYTES:
            self._acked = self._received
            self._send(wire.Ack(self._received))
        try:
            message = wire.decode(frame)
            if self._chunking or type(message) is _CHUNK:
                whole = self._joined(message)
                if whole is None:
                    return _NOTHING  # a stream's chunk, not its last
                message = whole
        except wire.ProtocolError as exc:
            self.fail(ClientProtocolError(str(exc)))
            return _NOTHING
        kind = type(message)
        if kind is _TURN_EVENT:  # first: nearly every frame is one
            assert isinstance(message, wire.TurnEvent)
            log = self._turns.get(message.turn_id)
            if log is None:
                return _NOTHING  # not a turn of this client's, or one it gave up on
            try:
                log.read(message.events)
            except (KeyError, ValueError, TypeError) as exc:
                self.fail(ClientProtocolError(f"unreadable event from the daemon: {exc}"))
                return _NOTHING
            if log.results is not None:
                del self._turns[message.turn_id]  # ended; its Turn keeps the log
        elif kind is _APPROVAL_REQUEST:
            assert isinstance(message, wire.ApprovalRequest)
            return self.approvals.request(message)
        elif kind is _PING:
            pass  # the daemon checks that we are there: a delivered ping says so
        elif kind is _ERROR and _let_go(message):
            assert isinstance(message, wire.Error)
            self.fail(DaemonUnavailable(message.message))
        else:
            request_id = getattr(message, "request_id", None)
            if request_id in self._waiting:  # else: a reply nobody waits for now
                self._reply(request_id, message)
        return _NOTHING

    def _joined(self, message: wire.Message) -> wire.Message | None:
        """A chunk joins its stream: the whole message once the stream ends, else None.
        A stream is never interleaved with other frames, but for the daemon's last word
        (which cuts it short)."""
        if isinstance(message, wire.Chunk):
            whole = self._chunks.add(message)
            self._chunking = self._chunks.pending
            if whole is None:
                return None
            message = wire.decode(whole)
            if isinstance(message, wire.Chunk):
                raise wire.ProtocolError("a chunked message that is a chunk")
        elif not _let_go(message):
            raise wire.ProtocolError(f"a {message.type.value} amid a chunked message")
        return message

    def _reply(self, request_id: str, message: wire.Message) -> None:
        log = self._submits.get(request_id)
        if log is not None:
            if type(message) is _ACCEPTED:
                assert isinstance(message, wire.Accepted)
                log.turn_id, log.call_ids = message.turn_id, message.call_ids
                self._turns[message.turn_id] = log
                if log.tracer is not None:
                    log.tracer.begin(message.turn_id, len(message.call_ids))
            else:  # refused: no turn
                del self._submits[request_id]
        self.replies[request_id] = message


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
