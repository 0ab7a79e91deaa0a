"""The daemon's core, sans-IO (SPEC D1, D5): frames from clients in, frames to them
out through a ``Transport``; the sockets are ``Server``'s (server.py).

It is three parts, composed: ``Clients`` (the client table and everything that goes
out to a client: replies, a turn's events in batches, the outbox window, chunks,
pings), ``Sessions`` (sessions and their turns, with ``Approvals``), and this module,
which reads a client's frames, says hello, answers status and tools, and forgets a
client that left. Bad input — garbage frames, unknown types, unknown sessions — gets
an ``Error``, and the core goes on.

``defer`` runs a callback once the callbacks already waiting have run (the event
loop's ``call_soon``): a turn's events that happen together leave together. ``hold``
runs one a little later (the server's: ``EVENT_HOLD_SECONDS``): a turn's ``Accepted``,
``tool_start`` and ``tool_update`` wait that long for what follows them, so that a call
that ends soon reaches its client in one frame; a result or a turn's end never waits.
Without ``hold`` they leave as the rest do.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from toolpool.daemon.audit import AuditLog, Auditor
from toolpool.daemon.clients import Cancellable, Clients, Transport
from toolpool.daemon.records import Address, BadRequest
from toolpool.daemon.sessions import Sessions
from toolpool.daemon.shipped import SessionTools
from toolpool.daemon.status import daemon_status, tool_definitions
from toolpool.engine.coordinator import Coordinator
from toolpool.engine.turn import Turn
from toolpool.pool import WorkerPool
from toolpool.protocol import (
    PROTOCOL_VERSION,
    Ack,
    Append,
    ApprovalReply,
    Branch,
    Bye,
    CancelCall,
    CloseSession,
    EndTurn,
    Error,
    FailureCode,
    Hello,
    Message,
    OpenSession,
    ProtocolError,
    Reply,
    Status,
    Steer,
    Submit,
    Tools,
    Welcome,
    decode,
)

log = logging.getLogger("toolpool.daemon")


class DaemonCore:
    def __init__(
        self,
        coordinator: Coordinator,
        pool: WorkerPool | None,
        transport: Transport,
        *,
        defer: Callable[[Callable[[], None]], object],
        hold: Callable[[Callable[[], None]], Cancellable] | None = None,
        spill_dir: Path,
        approval_timeout: float = 120.0,
        client_buffer_bytes: int = 64 * 1024 * 1024,
        max_sessions_per_client: int = 64,
        max_sessions: int = 1024,
        audit: AuditLog | None = None,
        network: str = "open",
        session_tools: SessionTools = SessionTools.LOCAL,
        is_local: Callable[[Address], bool] = lambda _: True,
        mcp_left_out: Sequence[Mapping[str, str]] = (),
    ) -> None:
        """``session_tools`` and ``is_local``: who may ship tools with a session, and
        whether a client came over the Unix socket (``Sessions``, SPEC A6);
        ``mcp_left_out``: the MCP servers and tools left out at start, which
        ``status`` tells (SPEC E9)."""
        self.coordinator = coordinator
        self.mcp_left_out = [dict(item) for item in mcp_left_out]
        self.pool = pool
        self.auditor = None if audit is None else Auditor(audit)
        self.clients = Clients(
            transport,
            defer=defer,
            hold=hold,
            spill_dir=spill_dir,
            window=client_buffer_bytes,
            on_gone=self.forget_client,
        )
        self.sessions = Sessions(
            coordinator,
            pool,
            self.clients,
            approval_timeout=approval_timeout,
            max_sessions_per_client=max_sessions_per_client,
            max_sessions=max_sessions,
            auditor=self.auditor,
            network=network,
            session_tools=session_tools,
            is_local=is_local,
        )
        self.started_at = time.time()
        if pool is not None:  # its background shells are capped per client too (L9)
            pool.shells.client_of = self.sessions.owner

    # -- frames in -----------------------------------------------------------------------

    def receive(self, address: Address, frames: list[bytes]) -> None:
        """One message from a client: its frames as they came."""
        if len(frames) != 1:
            log.warning("dropped a message of %d frames", len(frames))
            self.clients.send(
                address, Error(None, FailureCode.PROTOCOL, "expected one frame per message")
            )
            return
        try:
            message = decode(frames[0])
        except ProtocolError as exc:
            log.warning("bad frame: %s", exc, extra={"client": address[1].hex()})
            self.clients.send(address, Error(exc.request_id, FailureCode.PROTOCOL, str(exc)))
            return
        if type(message) is Ack:
            self.clients.acknowledged(address, message.received)
            return
        try:
            self.handle(address, message)
        except BadRequest as exc:
            self.clients.send(address, Error(_request_id(message), exc.code, exc.message))
        except Exception as exc:
            log.exception("failed on a %s", message.type.value)
            self.clients.send(address, Error(_request_id(message), FailureCode.INTERNAL, repr(exc)))

    def handle(self, address: Address, message: Message) -> None:
        if type(message) is Hello:
            self._hello(address, message)
            return
        client = self.clients.table.get(address)
        if client is None:
            raise BadRequest(
                FailureCode.PROTOCOL, "say hello first (the handshake checks versions)"
            )
        sessions = self.sessions
        match message:
            case Submit():
                sessions.submit(client, message)
            case OpenSession():
                sessions.open(client, message)
            case CloseSession():
                sessions.close(client, message)
            case Append() | CancelCall() | EndTurn():
                sessions.turn_request(client, message)
            case Steer():
                sessions.steer(client, message)
            case Branch():
                sessions.branching.request(client, message)
            case ApprovalReply():
                sessions.approvals.reply(address, message)
            case Status():
                self.clients.send(address, Reply(message.request_id, self.status()))
            case Tools():
                self.clients.send(address, Reply(message.request_id, self.tools(message.format)))
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
        self.clients.add(address, message.client)
        log.info("client connected: %s", message.client, extra={"client": address[1].hex()})
        names = self.coordinator.registry.names()
        self.clients.send(
            address, Welcome(message.request_id, PROTOCOL_VERSION, os.getpid(), names)
        )

    # -- clients going away ------------------------------------------------------------------

    def forget_client(self, address: Address) -> None:
        """The client said Bye or is gone: its approvals are denied, its turns
        aborted, its sessions closed."""
        client = self.clients.remove(address)
        if client is None:
            return
        self.sessions.approvals.forget(address)
        self.sessions.forget(client)
        log.info("client left", extra={"client": address[1].hex()})

    # -- the daemon's life --------------------------------------------------------------------

    def unfinished_turns(self) -> list[Turn]:
        return self.sessions.unfinished_turns()

    def abort_everything(self) -> None:
        for turn in self.unfinished_turns():
            turn.abort()

    def end_sessions(self) -> None:
        for entry in list(self.sessions.table.values()):
            self.sessions.end(entry)

    # -- looking in -------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return daemon_status(
            self.coordinator,
            self.pool,
            self.sessions.table,
            self.clients.table,
            draining=self.sessions.draining,
            started_at=self.started_at,
            closing=len(self.sessions.closing),
            approvals=len(self.sessions.approvals),
            mcp_left_out=self.mcp_left_out,
        )

    def tools(self, format: str) -> list[dict[str, Any]]:
        try:
            return tool_definitions(self.coordinator, format)
        except ValueError as exc:
            raise BadRequest(FailureCode.BAD_REQUEST, str(exc)) from None


def _request_id(message: Message) -> str | None:
    return getattr(message, "request_id", None)
