"""The daemon's side of the client protocol: sessions, turns, events and approvals
over ZeroMQ ROUTER sockets (SPEC D1, D5).

Clients say ``Hello``, open sessions, submit turns and receive each turn's events as
they happen; they answer approval requests, interrupt and abort. A session belongs
to the connection that opened it: when that client says ``Bye`` or is found gone (a
send to it fails: ROUTER_MANDATORY), its turns are aborted and its sessions closed.
Bad input — garbage frames, unknown types, unknown sessions — gets an ``Error``, and
the server goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from pathlib import Path
from typing import Any

import zmq

from toolpool.daemon.records import Address, BadRequest, ClientState, SessionEntry
from toolpool.daemon.requests import Requests, _request_id
from toolpool.engine.coordinator import Coordinator
from toolpool.engine.gate import GateDecision
from toolpool.engine.turn import Turn
from toolpool.pool import WorkerPool
from toolpool.protocol import (
    MAX_FRAME_BYTES,
    Error,
    FailureCode,
    Message,
    Ping,
    ProtocolError,
    TurnEvent,
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
    ) -> None:
        self.coordinator = coordinator
        self.pool = pool
        self.approval_timeout = approval_timeout
        self.ping_interval = ping_interval
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

    # -- the wire ------------------------------------------------------------------------

    def send(self, address: Address, message: Message) -> None:
        """Send now, after the events still waiting for this client (so an approval
        request never overtakes the tool_start of its call)."""
        if self._pending.get(address):
            self._flush(address)
        self._send_frame(address, encode(message))

    def send_event(self, address: Address, turn_id: str, event: dict[str, Any]) -> None:
        """Queue a turn's event; the loop's turn ends with one frame per client."""
        self._pending.setdefault(address, []).append((turn_id, event))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self, only: Address | None = None) -> None:
        if only is None:
            self._flush_scheduled = False
        for address in [only] if only is not None else list(self._pending):
            events = self._pending.pop(address, [])
            batch: list[dict[str, Any]] = []
            for i, (turn_id, event) in enumerate(events):
                batch.append(event)
                if i + 1 == len(events) or events[i + 1][0] != turn_id:
                    self._send_events(address, turn_id, batch)
                    batch = []

    def _send_events(self, address: Address, turn_id: str, events: list[dict[str, Any]]) -> None:
        """One frame, or halves when the batch would pass the frame limit (many large
        results that ended in one turn of the loop)."""
        frame = encode(TurnEvent(turn_id, events))
        if len(frame) <= MAX_FRAME_BYTES or len(events) == 1:
            self._send_frame(address, frame)
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
        try:
            self.handle(address, message)
        except BadRequest as exc:
            self.send(address, Error(_request_id(message), exc.code, exc.message))
        except Exception as exc:
            log.exception("failed on a %s", message.type.value)
            self.send(address, Error(_request_id(message), FailureCode.INTERNAL, repr(exc)))

    async def _ping(self) -> None:
        """Find clients that went away without a Bye: a send to them fails."""
        while True:
            await asyncio.sleep(self.ping_interval)
            for address in list(self.clients):
                self.send(address, Ping())

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
