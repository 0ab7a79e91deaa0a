"""The daemon's side of the client protocol: sessions, turns, events and approvals
over ZeroMQ ROUTER sockets (SPEC D1, D5).

Clients say ``Hello``, open sessions, submit turns and receive each turn's events as
they happen; they answer approval requests, interrupt and abort. A session belongs
to the connection that opened it: when that client says ``Bye`` or is found gone (a
send to it fails: ROUTER_MANDATORY), its turns are aborted and its sessions closed.
Bad input — garbage frames, unknown types, unknown sessions — gets an ``Error``, and
the server goes on.

What goes to a client that said hello leaves through its ``Outbox`` (outbox.py): at
most ``client_buffer_bytes`` unacknowledged, the rest waiting on disk while the
client's turns are held; a client stalled for ``client_stall_seconds`` is let go
(SPEC L5). Messages larger than a chunk leave as chunks (L3).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from toolpool.daemon.audit import AuditLog, Auditor
from toolpool.daemon.outbox import Outbox
from toolpool.daemon.records import Address, BadRequest, ClientState, SessionEntry
from toolpool.daemon.requests import Requests, _request_id
from toolpool.engine.coordinator import Coordinator
from toolpool.engine.gate import GateDecision
from toolpool.engine.turn import Turn
from toolpool.pool import WorkerPool
from toolpool.protocol import (
    CHUNK_BYTES,
    MAX_FRAME_BYTES,
    Ack,
    Error,
    FailureCode,
    Message,
    Ping,
    ProtocolError,
    TurnEvent,
    chunked,
    decode,
    encode,
)
from toolpool.zmqloop import LoopSocket

log = logging.getLogger("toolpool.daemon")


class Server(Requests):
    """The transport: bound ROUTER sockets driven by the loop, frames in, replies and
    batched turn events out; what each request does is ``Requests``'."""

    def __init__(
        self,
        coordinator: Coordinator,
        pool: WorkerPool | None = None,
        *,
        approval_timeout: float = 120.0,
        ping_interval: float = 2.0,
        client_buffer_bytes: int = 64 * 1024 * 1024,
        client_stall_seconds: float = 120.0,
        max_sessions_per_client: int = 64,
        max_sessions: int = 1024,
        spill_dir: Path | None = None,
        audit: AuditLog | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.auditor = None if audit is None else Auditor(audit)
        self.pool = pool
        self.approval_timeout = approval_timeout
        self.ping_interval = ping_interval
        self.client_buffer_bytes = client_buffer_bytes
        self.client_stall_seconds = client_stall_seconds
        self.max_sessions_per_client = max_sessions_per_client
        self.max_sessions = max_sessions
        # Where frames wait for clients that do not read (L5); made here when not given.
        self._own_spill_dir = spill_dir is None
        self.spill_dir = spill_dir or Path(tempfile.mkdtemp(prefix="toolpool-spill-"))
        self._streams = itertools.count(1)  # chunked messages' stream ids
        self.clients: dict[Address, ClientState] = {}
        self.sessions: dict[str, SessionEntry] = {}
        self.approvals: dict[str, tuple[asyncio.Future[GateDecision], Address]] = {}
        self.draining = False
        self.started_at = time.time()
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._raw: list[zmq.Socket[bytes]] = []  # bound, not yet driven by the loop
        self._sockets: list[LoopSocket] = []
        # Events wait here until the end of the loop's turn, so that those emitted
        # together (a call's end, its messages, the turn's end) go in one frame.
        self._pending: dict[Address, list[tuple[str, dict[str, Any]]]] = {}
        self._flush_scheduled = False
        self._tasks: list[asyncio.Task[None]] = []
        self._closing: set[asyncio.Task[None]] = set()  # sessions closing after their turns
        self.endpoints: list[str] = []
        if pool is not None:  # its background shells are capped per client too (L9)
            pool.shells.client_of = self.session_owner

    def session_owner(self, session_id: str) -> Address | None:
        """The client whose session ``session_id`` is (None: no such session)."""
        entry = self.sessions.get(session_id)
        return None if entry is None else entry.owner

    # -- life cycle ----------------------------------------------------------------------

    def bind(
        self,
        endpoint: str,
        *,
        curve: tuple[bytes, bytes] | None = None,
        zap_domain: str | None = None,
    ) -> str:
        """Listen on ``endpoint`` (with CURVE when given (public, secret) keys); return
        the endpoint actually bound (a TCP port of 0 is chosen by the system)."""
        socket = self._context.socket(zmq.ROUTER)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.ROUTER_MANDATORY, 1)
        socket.setsockopt(zmq.SNDHWM, 0)  # events wait in memory for slow readers
        # Frames a little over the protocol's limit still arrive, to be refused with a
        # clear error; far bigger ones drop the connection before we allocate them.
        socket.setsockopt(zmq.MAXMSGSIZE, 2 * MAX_FRAME_BYTES)
        if zap_domain is not None:
            socket.zap_domain = zap_domain.encode()  # every connection asks the ZAP handler
        if curve is not None:
            public, secret = curve
            socket.curve_server = True
            socket.curve_publickey = public
            socket.curve_secretkey = secret
        socket.bind(endpoint)
        bound = socket.getsockopt_string(zmq.LAST_ENDPOINT)
        if bound.startswith("ipc://"):
            os.chmod(bound[len("ipc://") :], 0o600)
        self._raw.append(socket)
        self.endpoints.append(bound)
        return bound

    def start(self) -> None:
        """Serve the bound sockets on the running loop."""
        for index, socket in enumerate(self._raw):
            self._sockets.append(LoopSocket(socket, functools.partial(self._on_frames, index)))
        self._tasks = [asyncio.ensure_future(self._ping())]

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        return self._context

    async def drain(self, grace: float) -> None:
        """Accept no new turns; give running ones ``grace`` seconds, then abort them."""
        self.draining = True
        pending = self.unfinished_turns()
        if pending:
            log.info("draining: %d turns running", len(pending))
            await asyncio.wait([asyncio.ensure_future(t.results()) for t in pending], timeout=grace)
        self.abort_everything()
        remaining = self.unfinished_turns()
        if remaining:
            await asyncio.wait([asyncio.ensure_future(t.results()) for t in remaining])

    def abort_everything(self) -> None:
        for turn in self.unfinished_turns():
            turn.abort()

    def unfinished_turns(self) -> list[Turn]:
        return [t for entry in self.sessions.values() for t in entry.turns.values()]

    async def close(self) -> None:
        for entry in list(self.sessions.values()):
            self._end_session(entry)
        if self._closing:
            await asyncio.wait(set(self._closing))
        self._flush()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for socket in self._sockets:
            socket.close(linger=1000)  # the last events still reach their clients
        self._context.term()
        for client in self.clients.values():
            client.outbox.close()
        if self._own_spill_dir:
            shutil.rmtree(self.spill_dir, ignore_errors=True)

    # -- the wire ------------------------------------------------------------------------

    def client_state(self, address: Address, name: str) -> ClientState:
        """A new client's record, with its outbox and spill file."""
        spill = self.spill_dir / f"{address[0]}-{address[1].hex()}.frames"
        outbox = Outbox(
            functools.partial(self._send_frame, address), self.client_buffer_bytes, spill
        )
        return ClientState(address, name, outbox)

    def send(self, address: Address, message: Message) -> None:
        """Send now, after the events still waiting for this client (so an approval
        request never overtakes the tool_start of its call)."""
        if self._pending.get(address):
            self._flush(address)
        self._send_out(address, encode(message))

    def _send_out(self, address: Address, frame: bytes) -> None:
        """Through the client's outbox, in chunks when large; straight out to an
        address that has not said hello (errors only)."""
        client = self.clients.get(address)
        if client is None:
            self._send_frame(address, frame)
            return
        try:
            if len(frame) <= CHUNK_BYTES:
                client.outbox.push(frame)
            else:
                for part in chunked(frame, next(self._streams)):
                    client.outbox.push(part)
        except OSError as exc:  # the spill file cannot take it (disk full…): no silent loss
            log.error("cannot keep what waits for client %s: %s", client.name, exc)
            self._disconnect(client, f"the daemon could not keep what waits for it ({exc})")
            return
        client.hold.set(client.outbox.held)

    def send_event(self, address: Address, turn_id: str, event: dict[str, Any]) -> None:
        """Queue a turn's event. The events go out in one frame per client and turn
        once the callbacks that were waiting on the loop, and those they schedule, have
        run: so a call's ``tool_end`` and the ``turn_end`` it brings (its turn's task
        wakes in the next callback) share one frame, not two sends and two reads."""
        self._pending.setdefault(address, []).append((turn_id, event))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_next)

    def _flush_next(self) -> None:
        """Flush after the callbacks scheduled until now (see ``send_event``)."""
        asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self, only: Address | None = None) -> None:
        if only is None:
            self._flush_scheduled = False
        for address in [only] if only is not None else list(self._pending):
            events = self._pending.pop(address, [])
            if address not in self.clients:
                continue  # gone, or let go: nobody reads these
            batch: list[dict[str, Any]] = []
            for i, (turn_id, event) in enumerate(events):
                batch.append(event)
                if i + 1 == len(events) or events[i + 1][0] != turn_id:
                    self._send_events(address, turn_id, batch)
                    batch = []

    def _send_events(self, address: Address, turn_id: str, events: list[dict[str, Any]]) -> None:
        """One frame, or halves when the batch would pass a chunk (many large results
        that ended in one turn of the loop); one large event goes as chunks."""
        frame = encode(TurnEvent(turn_id, events))
        if len(frame) <= CHUNK_BYTES or len(events) == 1:
            self._send_out(address, frame)
            return
        half = len(events) // 2
        self._send_events(address, turn_id, events[:half])
        self._send_events(address, turn_id, events[half:])

    def _send_frame(self, address: Address, frame: bytes) -> None:
        if address[0] >= len(self._sockets):
            return
        try:
            self._sockets[address[0]].send([address[1], frame])
        except zmq.ZMQError as exc:
            # EHOSTUNREACH: the client's connection is gone.
            log.info("client gone (%s)", exc.strerror, extra={"client": address[1].hex()})
            self.forget_client(address)

    def _on_frames(self, index: int, frames: list[bytes]) -> None:
        address: Address = (index, frames[0])
        if len(frames) != 2:
            log.warning("dropped a message of %d frames", len(frames))
            self.send(address, Error(None, FailureCode.PROTOCOL, "expected one frame per message"))
            return
        try:
            message = decode(frames[1])
        except ProtocolError as exc:
            log.warning("bad frame: %s", exc, extra={"client": address[1].hex()})
            self.send(address, Error(exc.request_id, FailureCode.PROTOCOL, str(exc)))
            return
        if isinstance(message, Ack):
            self._acknowledged(address, message)
            return
        try:
            self.handle(address, message)
        except BadRequest as exc:
            self.send(address, Error(_request_id(message), exc.code, exc.message))
        except Exception as exc:
            log.exception("failed on a %s", message.type.value)
            self.send(address, Error(_request_id(message), FailureCode.INTERNAL, repr(exc)))

    def _acknowledged(self, address: Address, message: Ack) -> None:
        client = self.clients.get(address)
        if client is not None:
            client.outbox.ack(message.received)
            client.hold.set(client.outbox.held)

    async def _ping(self) -> None:
        """Find clients that went away without a Bye (a send to them fails), and let
        go of those stalled for longer than ``client_stall_seconds`` (L5)."""
        while True:
            await asyncio.sleep(self.ping_interval)
            now = time.monotonic()
            for address, client in list(self.clients.items()):
                stalled = client.outbox.stalled(now)
                if stalled > self.client_stall_seconds:
                    self._let_go(client, stalled)
                elif not client.outbox.held:  # a held client hears nothing new anyway
                    self.send(address, Ping())

    def _let_go(self, client: ClientState, stalled: float) -> None:
        """A client that has not read for too long: its turns are aborted, its
        sessions closed, what waits for it dropped; it is told, after what it has."""
        outbox = client.outbox
        log.warning(
            "client %s stalled: it read nothing for %.0f s with %d bytes unread and %d "
            "waiting on disk; its turns are aborted and it is disconnected",
            client.name,
            stalled,
            outbox.in_flight,
            outbox.spilled,
            extra={"client": client.address[1].hex()},
        )
        self._disconnect(
            client,
            f"it read nothing for {stalled:.0f} s (client_stall_seconds) with its buffer full",
        )

    def _disconnect(self, client: ClientState, why: str) -> None:
        """Forget the client (its turns aborted, its sessions closed) and tell it so,
        after what is already on its way."""
        self.forget_client(client.address)
        reason = f"the daemon disconnected this client: {why}; its turns were aborted"
        self._send_frame(client.address, encode(Error(None, FailureCode.DISCONNECTED, reason)))

    # -- requests --------------------------------------------------------------------------


def curve_keys(secret_key_file: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a key file made by ``zmq.auth.create_certificates``."""
    import zmq.auth

    public, secret = zmq.auth.load_certificate(secret_key_file)
    if secret is None:
        raise ValueError(f"{secret_key_file} holds no secret key")
    return public, secret


def is_loopback(tcp: str) -> bool:
    host = tcp.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1") or host.startswith("127.")
