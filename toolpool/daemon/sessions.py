"""What the daemon does with sessions and their turns (SPEC D1, D5, E6, L6): open and
close them, submit turns and send their events to the session's client, append to
an open turn, cancel one call, end a turn, interrupt and abort.

A session belongs to the client that opened it; its gate asks that client
(``Approvals``). A turn's events go to ``Clients.send_event`` as they happen — a
client that asked for results only is sent ``tool_end`` and ``turn_end`` alone (H1)
— and to the audit log (R1) when there is one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any

from toolpool.daemon.approvals import Approvals
from toolpool.daemon.audit import Auditor
from toolpool.daemon.branching import Branching
from toolpool.daemon.clients import Clients
from toolpool.daemon.network import SessionNetworks
from toolpool.daemon.records import Address, BadRequest, ClientState, SessionEntry
from toolpool.daemon.shipped import SessionTools, admit
from toolpool.egress.rules import NetworkPolicy
from toolpool.engine.approvals import make_gate
from toolpool.engine.coordinator import Coordinator
from toolpool.engine.gate import Gate, GateDecision, GateRequest
from toolpool.engine.turn import Turn, new_turn_id
from toolpool.errors import ToolDefinitionError
from toolpool.images import ImageError
from toolpool.models import (
    ToolCall,
    ToolEnd,
    ToolStart,
    TurnEnd,
)
from toolpool.pool import WorkerPool
from toolpool.protocol import (
    Accepted,
    Append,
    CancelCall,
    CloseSession,
    EndTurn,
    EventSelection,
    FailureCode,
    OpenSession,
    Reply,
    SessionOpened,
    Steer,
    SteerAction,
    Submit,
    event_to_wire,
)
from toolpool.providers import parse_tool_calls
from toolpool.registry import ToolSpec
from toolpool.session_options import ImageRoot, SessionOptionError, SessionOptions

log = logging.getLogger("toolpool.daemon")


class Sessions:
    def __init__(
        self,
        coordinator: Coordinator,
        pool: WorkerPool | None,
        clients: Clients,
        *,
        approval_timeout: float,
        max_sessions_per_client: int,
        max_sessions: int,
        auditor: Auditor | None,
        network: str = "open",
        session_tools: SessionTools = SessionTools.LOCAL,
        is_local: Callable[[Address], bool] = lambda _: True,
    ) -> None:
        """``session_tools``: who may ship tools with a session (SPEC A6);
        ``is_local(address)``: whether a client came over the daemon's Unix socket."""
        self.coordinator = coordinator
        self.pool = pool
        self.clients = clients
        self.approvals = Approvals(clients, _turn_of)
        self.approval_timeout = approval_timeout
        self.max_sessions_per_client = max_sessions_per_client
        self.max_sessions = max_sessions
        self.auditor = auditor
        self.session_tools = session_tools
        self.is_local = is_local
        self.table: dict[str, SessionEntry] = {}
        self.draining = False
        self.closing: set[asyncio.Task[None]] = set()  # sessions closing after their turns
        self.branching = Branching(self, coordinator, pool, clients, auditor)
        self.networks = SessionNetworks(self.table, pool, self.approvals, auditor, network)

    def owner(self, session_id: str) -> Address | None:
        """The client whose session ``session_id`` is (None: no such session)."""
        entry = self.table.get(session_id)
        return None if entry is None else entry.owner

    def entry(self, client: ClientState, session_id: str) -> SessionEntry:
        entry = self.table.get(session_id)
        if entry is None or entry.owner != client.address:
            raise BadRequest(
                FailureCode.UNKNOWN_SESSION,
                f"no session {session_id!r} (never opened, closed, or another client's)",
            )
        return entry

    # -- opening and closing ---------------------------------------------------------------

    def open(self, client: ClientState, message: OpenSession) -> None:
        if len(client.sessions) >= self.max_sessions_per_client:
            raise BadRequest(
                FailureCode.LIMIT,
                f"this client has {len(client.sessions)} sessions open, the most that "
                f"max_sessions_per_client allows: close one first",
            )
        if len(self.table) >= self.max_sessions:
            raise BadRequest(
                FailureCode.LIMIT,
                f"the daemon has {len(self.table)} sessions open, the most that "
                f"max_sessions allows",
            )
        try:  # the daemon's own check: never the client's alone (E6)
            options = SessionOptions.parse(message.options)
        except SessionOptionError as exc:
            raise BadRequest(FailureCode.BAD_REQUEST, str(exc)) from None
        self._admit_environment(options)
        self.networks.admit(options, message.options)
        shipped = self._admit_tools(client, message)
        payload = None if message.tools is None else message.tools.payload
        entry = self.add(client, message.workspace, options, shipped=(shipped, payload))
        self.clients.send(client.address, SessionOpened(message.request_id, entry.session.id))

    def add(
        self,
        client: ClientState,
        workspace: str,
        options: SessionOptions,
        *,
        forked_from: SessionEntry | None = None,
        shipped: tuple[list[ToolSpec], bytes | None] = ([], None),
    ) -> SessionEntry:
        """A new session of ``client``'s on ``workspace`` with ``options`` (checked),
        in the tables; a fork's layers are its branches' (B3); ``shipped``: the tools
        the client ships with it, admitted, and their pickle (A6). Raises BadRequest."""
        shipped_specs, payload = shipped
        try:
            # The gate is the daemon's to carry out (it asks the client): the engine's
            # session has the rest.
            session = self.coordinator.open_session(
                workspace, options=options.for_engine(), tools=shipped_specs
            )
        except ToolDefinitionError as exc:  # a shipped tool's name is the daemon's
            raise BadRequest(FailureCode.BAD_REQUEST, f"session tools refused: {exc}") from None
        except (ValueError, TypeError, OSError) as exc:
            raise BadRequest(FailureCode.BAD_REQUEST, str(exc)) from None
        timeout = (
            self.approval_timeout if options.approval_timeout is None else options.approval_timeout
        )
        entry = SessionEntry(session, client.address, None, timeout, options)
        gate = make_gate(
            options.gate, options.policy, lambda request: self.approvals.ask(entry, request)
        )
        if gate is not None and self.auditor is not None:
            gate = _audited(gate, entry, self.auditor)
        entry.gate = gate
        if shipped_specs and self.pool is not None and payload is not None:
            # Their calls run on workers of their own, which load the pickle (A6).
            # A policy session's run in its network namespace (N11), as its calls do.
            egress = isinstance(options.network, NetworkPolicy)
            entry.binding = self.pool.bindings.bind(session.id, payload, egress=egress)
            for spec in shipped_specs:
                spec.binding = entry.binding
        self.table[session.id] = entry
        self.networks.opened(entry)
        client.sessions.add(session.id)
        if forked_from is None:
            self.branching.opened(entry)
        log.info(
            "session opened on %s (gate %s%s)",
            session.workspace,
            options.gate.value,
            f"; shipped tools: {', '.join(s.name for s in shipped_specs)}" if shipped_specs else "",
            extra={"session": session.id, "client": client.address[1].hex()},
        )
        return entry

    def _admit_tools(self, client: ClientState, message: OpenSession) -> list[ToolSpec]:
        """The specs of the tools the client ships with the session (none: none), or
        ``BadRequest`` saying why not (SPEC A6): its way in, the Python that pickled
        them, each name and schema. Nothing of their code is run or unpickled."""
        if message.tools is None:
            return []
        if self.pool is None:
            raise BadRequest(
                FailureCode.BAD_REQUEST, "session tools refused: they need a worker pool"
            )
        local = self.is_local(client.address)
        return admit(message.tools, self.session_tools, local=local)

    def _admit_environment(self, options: SessionOptions) -> None:
        """Refuse, at open, an image root this daemon would not use (V13): images
        off, a path outside ``image_dirs`` or at a denied one, no pool to run it."""
        if not isinstance(options.root, ImageRoot):
            return
        shown = f"session option root = {{'image': {options.root.image!r}}}"
        if self.pool is None:
            raise BadRequest(FailureCode.BAD_REQUEST, f"{shown}: image roots need worker pools")
        try:
            self.pool.shells.sandboxes.layers.admit_image(options.root.image)
        except ImageError as exc:
            raise BadRequest(FailureCode.BAD_REQUEST, f"{shown}: {exc}") from None

    def close(self, client: ClientState, message: CloseSession) -> None:
        self.end(self.entry(client, message.session_id))
        self.clients.send(client.address, Reply(message.request_id))

    def end(self, entry: SessionEntry) -> None:
        """Abort the session's turns; once they have ended, end its background shells
        and close it (its scratch directory, their output with it, goes then)."""
        session_id = entry.session.id
        self.table.pop(session_id, None)
        owner = self.clients.table.get(entry.owner)
        if owner is not None:
            owner.sessions.discard(session_id)
        turns = list(entry.turns.values())
        for turn in turns:
            turn.abort()

        async def close_when_done() -> None:
            for turn in turns:
                with contextlib.suppress(Exception):
                    await turn.results()
            for between in list(entry.between):  # a checkpoint, a fork under way
                with contextlib.suppress(BaseException):
                    await between.done
            self.branching.closed(entry)
            if self.pool is not None:
                await self.pool.shells.end_session(session_id)
                if entry.binding is not None:  # its bound workers retire (A6)
                    self.pool.bindings.unbind(entry.binding)
            self.coordinator.close_session(entry.session)
            log.info("session closed", extra={"session": session_id})

        task = asyncio.ensure_future(close_when_done())
        self.closing.add(task)
        task.add_done_callback(self.closing.discard)

    def forget(self, client: ClientState) -> None:
        """The client is gone: its sessions end."""
        for session_id in list(client.sessions):
            entry = self.table.get(session_id)
            if entry is not None:
                self.end(entry)

    # -- turns --------------------------------------------------------------------------------

    def submit(self, client: ClientState, message: Submit) -> None:
        if self.draining:
            raise BadRequest(FailureCode.SHUTTING_DOWN, "the daemon is shutting down; no new turns")
        entry = self.entry(client, message.session_id)
        calls = _calls(message.calls, message.format)
        ids = [c.id for c in calls]
        turn_id = new_turn_id()
        turn = self.coordinator.submit(
            entry.session,
            calls,
            on_event=self._events(
                client.address, entry, turn_id, message.events is not EventSelection.RESULTS
            ),
            gate=entry.gate,
            turn_id=turn_id,
            open=message.open,
            hold=client.hold,
            # Not made here (SPEC L2): the client's EventReader makes them at turn_end.
            message_events=False,
        )
        entry.turns[turn_id] = turn
        entry.turn_of_call.update(dict.fromkeys(ids, turn_id))
        # Accepted leaves ahead of the turn's events, with the first of them in one
        # message: queued now, its flush comes after the turn's begin (a callback the
        # coordinator queued), which emits the first tool_start.
        self.clients.send_before_events(client.address, Accepted(message.request_id, turn_id, ids))
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "turn submitted: %d calls",
                len(calls),
                extra={"session": entry.session.id, "turn": turn_id},
            )

    def _events(self, address: Address, entry: SessionEntry, turn_id: str, everything: bool) -> Any:
        """The turn's event sink: each event to the client (those it asked for), to
        the audit log, and the turn's bookkeeping at its end."""
        send = self.clients.send_event
        hold = self.clients.hold_event
        table = self.clients.table
        auditor = self.auditor
        gated = entry.gate is not None
        session_id = entry.session.id

        def emit(event: Any) -> None:
            kind = type(event)
            if kind is ToolEnd:
                if address in table:
                    send(address, turn_id, event.to_dict())
                if auditor is not None:
                    auditor.ended(session_id, turn_id, event)
                # Per-call and per-turn records are debug lines (the audit log is the
                # record of every call): a formatted line per call cost a third of
                # the daemon's CPU per one-call turn.
                if log.isEnabledFor(logging.DEBUG):
                    _log_call_end(session_id, turn_id, event)
            elif kind is TurnEnd:
                if address in table:
                    send(address, turn_id, event_to_wire(event))
                entry.turns.pop(turn_id, None)
                if entry.checkpoints:  # the turn's end is a checkpoint, made next (B1)
                    self.branching.turn_ended(entry, turn_id)
                for result in event.results:
                    entry.turn_of_call.pop(result.call_id, None)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "turn ended: %d results, %d errors",
                        len(event.results),
                        sum(r.is_error for r in event.results),
                        extra={"session": session_id, "turn": turn_id},
                    )
            else:
                if kind is ToolStart and auditor is not None:
                    auditor.started(turn_id, event, gate=gated)
                if everything and address in table:
                    hold(address, turn_id, event.to_dict())  # it may wait for what follows

        return emit

    def turn_request(self, client: ClientState, message: Append | CancelCall | EndTurn) -> None:
        """The requests about one turn of one of the client's sessions."""
        found = next(
            (
                (entry, entry.turns[message.turn_id])
                for entry in self.table.values()
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
                calls = _calls(message.calls, message.format)
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
        self.clients.send(client.address, Reply(message.request_id, data))

    def steer(self, client: ClientState, message: Steer) -> None:
        entry = self.entry(client, message.session_id)
        for turn in list(entry.turns.values()):
            match message.action:
                case SteerAction.INTERRUPT:
                    turn.interrupt()
                case SteerAction.ABORT:
                    turn.abort()
        log.info("%s", message.action.value, extra={"session": entry.session.id})
        self.clients.send(client.address, Reply(message.request_id))

    def unfinished_turns(self) -> list[Turn]:
        return [t for entry in self.table.values() for t in entry.turns.values()]


def _turn_of(entry: SessionEntry, call_id: str) -> str:
    return entry.turn_of_call.get(call_id, "")


def _calls(payload: Any, format: str | None) -> list[ToolCall]:
    try:
        calls = parse_tool_calls(payload, format)
    except ValueError as exc:
        raise BadRequest(FailureCode.BAD_REQUEST, f"cannot read the calls: {exc}") from None
    ids = [c.id for c in calls]
    if len(set(ids)) != len(ids):
        raise BadRequest(FailureCode.BAD_REQUEST, "call ids within a turn must be unique")
    return calls


def _audited(gate: Gate, entry: SessionEntry, auditor: Auditor) -> Gate:
    """``gate``, telling the audit log what it decided for each call."""

    async def audited(request: GateRequest) -> GateDecision | None:
        decision = await gate(request)
        auditor.decided(_turn_of(entry, request.call.id), request.call.id, decision)
        return decision

    return audited


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
