"""What the daemon does with each client request (SPEC D1, D5): hello, sessions,
turns, steering, approvals, status. ``Server`` (server.py) is the transport that
feeds it decoded messages and sends what it answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import Mapping
from typing import Any

from toolpool.daemon.audit import Auditor
from toolpool.daemon.records import (
    Address,
    BadRequest,
    ClientState,
    SessionEntry,
)
from toolpool.daemon.status import daemon_status, tool_definitions
from toolpool.engine.approvals import make_gate
from toolpool.engine.coordinator import Coordinator
from toolpool.engine.gate import Gate, GateDecision, GateRequest
from toolpool.models import Event, ToolCall, ToolEnd, ToolStart, TurnEnd
from toolpool.policy import GateMode
from toolpool.pool import WorkerPool
from toolpool.protocol import (
    PROTOCOL_VERSION,
    Accepted,
    Append,
    ApprovalReply,
    ApprovalRequest,
    Bye,
    CancelCall,
    CloseSession,
    EndTurn,
    EventSelection,
    FailureCode,
    Hello,
    Message,
    OpenSession,
    Reply,
    SessionOpened,
    Status,
    Steer,
    SteerAction,
    Submit,
    Tools,
    Welcome,
    event_to_wire,
)
from toolpool.providers import parse_tool_calls
from toolpool.session_options import SessionOptionError, SessionOptions

log = logging.getLogger("toolpool.daemon")


class Requests:
    """The request handlers; the transport (``Server``) provides ``send`` and
    ``send_event`` and the state below."""

    coordinator: Coordinator
    pool: WorkerPool | None
    approval_timeout: float
    clients: dict[Address, ClientState]
    sessions: dict[str, SessionEntry]
    approvals: dict[str, tuple[asyncio.Future[GateDecision], Address]]
    draining: bool
    started_at: float
    max_sessions_per_client: int
    max_sessions: int
    auditor: Auditor | None  # the audit log's (R1), when there is one
    _closing: set[asyncio.Task[None]]

    def send(self, address: Address, message: Message) -> None:
        raise NotImplementedError

    def client_state(self, address: Address, name: str) -> ClientState:
        raise NotImplementedError

    def send_event(self, address: Address, turn_id: str, event: dict[str, Any]) -> None:
        raise NotImplementedError

    def handle(self, address: Address, message: Message) -> None:
        if isinstance(message, Hello):
            self._hello(address, message)
            return
        client = self.clients.get(address)
        if client is None:
            raise BadRequest(
                FailureCode.PROTOCOL, "say hello first (the handshake checks versions)"
            )
        match message:
            case OpenSession():
                self._open(client, message)
            case CloseSession():
                self._close(client, message)
            case Submit():
                self._submit(client, message)
            case Append() | CancelCall() | EndTurn():
                self._turn_request(client, message)
            case Steer():
                self._steer(client, message)
            case ApprovalReply():
                self._approval_reply(client, message)
            case Status():
                self.send(address, Reply(message.request_id, self.status()))
            case Tools():
                self.send(address, Reply(message.request_id, self.tools(message.format)))
            case Bye():
                self.forget_client(address)
            case _:
                raise BadRequest(
                    FailureCode.PROTOCOL, f"a client does not send {message.type.value}"
                )

    def _hello(self, address: Address, message: Hello) -> None:
        if message.version != PROTOCOL_VERSION:
            raise BadRequest(
                FailureCode.VERSION,
                f"the daemon speaks protocol {PROTOCOL_VERSION}, the client {message.version}",
            )
        if address not in self.clients:
            self.clients[address] = self.client_state(address, message.client)
        log.info("client connected: %s", message.client, extra={"client": address[1].hex()})
        names = self.coordinator.registry.names()
        self.send(address, Welcome(message.request_id, PROTOCOL_VERSION, os.getpid(), names))

    def _entry(self, client: ClientState, session_id: str) -> SessionEntry:
        entry = self.sessions.get(session_id)
        if entry is None or entry.owner != client.address:
            raise BadRequest(
                FailureCode.UNKNOWN_SESSION,
                f"no session {session_id!r} (never opened, closed, or another client's)",
            )
        return entry

    def _open(self, client: ClientState, message: OpenSession) -> None:
        if len(client.sessions) >= self.max_sessions_per_client:
            raise BadRequest(
                FailureCode.LIMIT,
                f"this client has {len(client.sessions)} sessions open, the most that "
                f"max_sessions_per_client allows: close one first",
            )
        if len(self.sessions) >= self.max_sessions:
            raise BadRequest(
                FailureCode.LIMIT,
                f"the daemon has {len(self.sessions)} sessions open, the most that "
                f"max_sessions allows",
            )
        try:  # the daemon's own check: never the client's alone (E6)
            options = SessionOptions.parse(message.options)
        except SessionOptionError as exc:
            raise BadRequest(FailureCode.BAD_REQUEST, str(exc)) from None
        try:
            # The gate is the daemon's to carry out (it asks the client): the engine's
            # session has the rest.
            session = self.coordinator.open_session(
                message.workspace,
                options=dataclasses.replace(
                    options, gate=GateMode.ALLOW, policy=(), approval_timeout=None
                ),
            )
        except (ValueError, TypeError, OSError) as exc:
            raise BadRequest(FailureCode.BAD_REQUEST, str(exc)) from None
        timeout = (
            self.approval_timeout if options.approval_timeout is None else options.approval_timeout
        )
        entry = SessionEntry(session, client.address, None, timeout)
        gate = make_gate(options.gate, options.policy, lambda request: self._ask(entry, request))
        if gate is not None and self.auditor is not None:
            gate = _audited(gate, entry, self.auditor)
        entry.gate = gate
        self.sessions[session.id] = entry
        client.sessions.add(session.id)
        log.info(
            "session opened on %s (gate %s)",
            session.workspace,
            options.gate.value,
            extra={"session": session.id, "client": client.address[1].hex()},
        )
        self.send(client.address, SessionOpened(message.request_id, session.id))

    def _close(self, client: ClientState, message: CloseSession) -> None:
        entry = self._entry(client, message.session_id)
        self._end_session(entry)
        self.send(client.address, Reply(message.request_id))

    def _end_session(self, entry: SessionEntry) -> None:
        """Abort the session's turns; once they have ended, end its background shells
        and close it (its scratch directory, their output with it, goes then)."""
        session_id = entry.session.id
        self.sessions.pop(session_id, None)
        owner = self.clients.get(entry.owner)
        if owner is not None:
            owner.sessions.discard(session_id)
        turns = list(entry.turns.values())
        for turn in turns:
            turn.abort()

        async def close_when_done() -> None:
            for turn in turns:
                with contextlib.suppress(Exception):
                    await turn.results()
            if self.pool is not None:
                await self.pool.shells.end_session(session_id)
            self.coordinator.close_session(entry.session)
            log.info("session closed", extra={"session": session_id})

        task = asyncio.ensure_future(close_when_done())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    def _calls(payload: Any, format: str | None) -> list[ToolCall]:
        try:
            calls = parse_tool_calls(payload, format)
        except ValueError as exc:
            raise BadRequest(FailureCode.BAD_REQUEST, f"cannot read the calls: {exc}") from None
        ids = [c.id for c in calls]
        if len(set(ids)) != len(ids):
            raise BadRequest(FailureCode.BAD_REQUEST, "call ids within a turn must be unique")
        return calls

    def _turn_request(self, client: ClientState, message: Append | CancelCall | EndTurn) -> None:
        """The requests about one turn of one of the client's sessions."""
        found = next(
            (
                (entry, entry.turns[message.turn_id])
                for entry in self.sessions.values()
                if entry.owner == client.address and message.turn_id in entry.turns
            ),
            None,
        )
        if found is None:
            raise BadRequest(
                FailureCode.UNKNOWN_TURN, f"no running turn {message.turn_id!r} of yours"
            )
        entry, turn = found
        data: Any = None
        match message:
            case Append():
                calls = self._calls(message.calls, message.format)
                try:
                    turn.add(calls)
                except ValueError as exc:
                    raise BadRequest(FailureCode.BAD_REQUEST, str(exc)) from None
                entry.turn_of_call.update(dict.fromkeys((c.id for c in calls), turn.id))
                data = {"call_ids": [c.id for c in calls]}
            case CancelCall():
                try:
                    turn.cancel(message.call_id)
                except KeyError as exc:
                    raise BadRequest(FailureCode.BAD_REQUEST, str(exc.args[0])) from None
            case EndTurn():
                turn.close()
        self.send(client.address, Reply(message.request_id, data))

    def _submit(self, client: ClientState, message: Submit) -> None:
        if self.draining:
            raise BadRequest(FailureCode.SHUTTING_DOWN, "the daemon is shutting down; no new turns")
        entry = self._entry(client, message.session_id)
        calls = self._calls(message.calls, message.format)
        ids = [c.id for c in calls]
        turn_id = os.urandom(6).hex()
        address = client.address

        # A client that asked for results only (Submit.events) is sent tool_end and
        # turn_end: the events results() reads, in fewer and smaller frames.
        everything = message.events is not EventSelection.RESULTS

        auditor = self.auditor
        gated = entry.gate is not None

        def emit(event: Event) -> None:
            if address in self.clients and (everything or isinstance(event, (ToolEnd, TurnEnd))):
                self.send_event(address, turn_id, event_to_wire(event))
            if auditor is not None:
                if isinstance(event, ToolStart):
                    auditor.started(turn_id, event, gate=gated)
                elif isinstance(event, ToolEnd):
                    auditor.ended(entry.session.id, turn_id, event)
            # Per-call and per-turn records are debug lines (the audit log is the
            # record of every call): a formatted line per call cost a third of the
            # daemon's CPU per one-call turn.
            if isinstance(event, ToolEnd):
                if log.isEnabledFor(logging.DEBUG):  # its fields cost more than the check
                    _log_call_end(entry.session.id, turn_id, event)
            elif isinstance(event, TurnEnd):
                entry.turns.pop(turn_id, None)
                for result in event.results:
                    entry.turn_of_call.pop(result.call_id, None)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "turn ended: %d results, %d errors",
                        len(event.results),
                        sum(r.is_error for r in event.results),
                        extra={"session": entry.session.id, "turn": turn_id},
                    )

        self.send(address, Accepted(message.request_id, turn_id, ids))
        turn = self.coordinator.submit(
            entry.session,
            calls,
            on_event=emit,
            gate=entry.gate,
            turn_id=turn_id,
            open=message.open,
            hold=client.hold,
        )
        entry.turns[turn_id] = turn
        entry.turn_of_call.update(dict.fromkeys(ids, turn_id))
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "turn submitted: %d calls",
                len(calls),
                extra={"session": entry.session.id, "turn": turn_id},
            )

    def _steer(self, client: ClientState, message: Steer) -> None:
        entry = self._entry(client, message.session_id)
        for turn in list(entry.turns.values()):
            match message.action:
                case SteerAction.INTERRUPT:
                    turn.interrupt()
                case SteerAction.ABORT:
                    turn.abort()
        log.info("%s", message.action.value, extra={"session": entry.session.id})
        self.send(client.address, Reply(message.request_id))

    # -- approvals -------------------------------------------------------------------------

    async def _ask(self, entry: SessionEntry, request: GateRequest) -> GateDecision:
        """Put the call to the session's client; no answer in time is a denial."""
        approval_id = uuid.uuid4().hex[:12]
        future: asyncio.Future[GateDecision] = asyncio.get_running_loop().create_future()
        self.approvals[approval_id] = (future, entry.owner)
        self.send(
            entry.owner,
            ApprovalRequest(
                approval_id=approval_id,
                session_id=entry.session.id,
                turn_id=entry.turn_of_call.get(request.call.id, ""),
                call=request.call.to_dict(),
                label=request.label,
                preview=request.preview,
                read_only=request.read_only,
                permissions=list(request.permissions),
                timeout=entry.approval_timeout,
                preview_truncated=request.preview_truncated,
            ),
        )
        try:
            return await asyncio.wait_for(asyncio.shield(future), entry.approval_timeout)
        except TimeoutError:
            return GateDecision.deny(
                f"Not approved: no answer within {entry.approval_timeout:g} s.", "timeout"
            )
        finally:
            self.approvals.pop(approval_id, None)

    def _approval_reply(self, client: ClientState, message: ApprovalReply) -> None:
        pending = self.approvals.get(message.approval_id)
        if pending is None or pending[1] != client.address:
            return  # answered too late, or not this client's to answer
        future, _ = pending
        if not future.done():
            reason = message.reason or "The user did not approve this call."
            future.set_result(
                GateDecision.allow("client")
                if message.allowed
                else GateDecision.deny(reason, "client")
            )

    # -- clients going away -------------------------------------------------------------------

    def forget_client(self, address: Address) -> None:
        """The client said Bye or is gone: its approvals are denied, its turns
        aborted, its sessions closed."""
        client = self.clients.pop(address, None)
        if client is None:
            return
        client.outbox.close()
        for future, owner in list(self.approvals.values()):
            if owner == address and not future.done():
                future.set_result(GateDecision.deny("The client disconnected.", "disconnect"))
        for session_id in list(client.sessions):
            entry = self.sessions.get(session_id)
            if entry is not None:
                self._end_session(entry)
        log.info("client left", extra={"client": address[1].hex()})

    # -- looking in -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return daemon_status(
            self.coordinator,
            self.pool,
            self.sessions,
            self.clients,
            draining=self.draining,
            started_at=self.started_at,
            closing=len(self._closing),
            approvals=len(self.approvals),
        )

    def tools(self, format: str) -> list[dict[str, Any]]:
        try:
            return tool_definitions(self.coordinator, format)
        except ValueError as exc:
            raise BadRequest(FailureCode.BAD_REQUEST, str(exc)) from None


def _audited(gate: Gate, entry: SessionEntry, auditor: Auditor) -> Gate:
    """``gate``, telling the audit log what it decided for each call."""

    async def audited(request: GateRequest) -> GateDecision | None:
        decision = await gate(request)
        turn_id = entry.turn_of_call.get(request.call.id, "")
        auditor.decided(turn_id, request.call.id, decision)
        return decision

    return audited


def _request_id(message: Message) -> str | None:
    return getattr(message, "request_id", None)


def _log_call_end(session_id: str, turn_id: str, event: ToolEnd) -> None:
    result = event.result
    usage: Mapping[str, Any] = result.details.get("usage") or {}
    wall = usage.get("wall_seconds")
    log.debug(
        "call ended: %s",
        result.error_code.value if result.error_code else "ok",
        extra={
            "session": session_id,
            "turn": turn_id,
            "call": event.call_id,
            "tool": event.tool_name,
            "worker": result.details.get("worker"),
            "error": result.error_code.value if result.error_code else None,
            "ms": None if wall is None else round(wall * 1000, 3),
        },
    )
