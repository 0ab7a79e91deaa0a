"""The daemon's transport (SPEC D1, D5): bound ZeroMQ ROUTER sockets driven by the
event loop, their frames handed to the sans-IO ``DaemonCore`` (core.py), the core's
frames sent out; the timer that pings clients; the drain and the close.

A session belongs to the connection that opened it: when that client says ``Bye`` or
is found gone (a send to it fails: ROUTER_MANDATORY), its turns are aborted and its
sessions closed. What goes to a client leaves through its ``Outbox`` (at most
``client_buffer_bytes`` unacknowledged, the rest waiting on disk while the client's
turns are held); a client stalled for ``client_stall_seconds`` is let go (SPEC L5).
Messages larger than a chunk leave as chunks (L3).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import zmq

from toolpool.daemon.audit import AuditLog
from toolpool.daemon.clients import ClientGone
from toolpool.daemon.core import DaemonCore
from toolpool.daemon.records import Address
from toolpool.daemon.shipped import SessionTools
from toolpool.engine.coordinator import Coordinator
from toolpool.engine.turn import Turn
from toolpool.pool import WorkerPool
from toolpool.protocol import MAX_FRAME_BYTES
from toolpool.zmqloop import LoopSocket

log = logging.getLogger("toolpool.daemon")
# How long a turn's Accepted, tool_start and tool_update wait for what follows them
# (DaemonCore's ``hold``): about what a worker holds a result for the next (1 ms), so
# that a call that ends within it reaches the client in one frame, not three.
EVENT_HOLD_SECONDS = 0.001
# How long a stopping daemon waits for the turns it aborted (their calls are
# cancelled: a worker that does not stop is killed after cancel_grace, 2 s), and then
# for its sessions to close.
ABORTED_TURNS_SECONDS = 30.0


class Server:
    """The sockets of a ``DaemonCore``: frames in, frames out, the ping timer."""

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
        network: str = "open",
        session_tools: SessionTools = SessionTools.LOCAL,
        mcp_left_out: Sequence[Mapping[str, str]] = (),
    ) -> None:
        self.ping_interval = ping_interval
        self.client_stall_seconds = client_stall_seconds
        # Where frames wait for clients that do not read (L5); made here when not given.
        self._own_spill_dir = spill_dir is None
        self.spill_dir = spill_dir or Path(tempfile.mkdtemp(prefix="toolpool-spill-"))
        self.core = DaemonCore(
            coordinator,
            pool,
            self,
            defer=_call_soon,
            hold=_call_held,
            spill_dir=self.spill_dir,
            approval_timeout=approval_timeout,
            client_buffer_bytes=client_buffer_bytes,
            max_sessions_per_client=max_sessions_per_client,
            max_sessions=max_sessions,
            audit=audit,
            network=network,
            session_tools=session_tools,
            is_local=self.is_local,
            mcp_left_out=mcp_left_out,
        )
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._raw: list[zmq.Socket[bytes]] = []  # bound, not yet driven by the loop
        self._sockets: list[LoopSocket] = []
        self._tasks: list[asyncio.Task[None]] = []
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

    async def drain(self, grace: float, aborted_wait: float = ABORTED_TURNS_SECONDS) -> None:
        """Accept no new turns; give running ones ``grace`` seconds, then abort them,
        and wait ``aborted_wait`` seconds at most for the aborted ones to end: the
        daemon stops even if one never does (a defect, logged), not never."""
        self.core.sessions.draining = True
        pending = self.unfinished_turns()
        if pending:
            log.info("draining: %d turns running", len(pending))
            await asyncio.wait([asyncio.ensure_future(t.results()) for t in pending], timeout=grace)
        self.abort_everything()
        remaining = self.unfinished_turns()
        if remaining:
            waits = [asyncio.ensure_future(t.results()) for t in remaining]
            _, stuck = await asyncio.wait(waits, timeout=aborted_wait)
            for wait in stuck:
                wait.cancel()
            if stuck:
                log.error(
                    "stopping with %d turns that did not end %g s after they were aborted",
                    len(stuck),
                    aborted_wait,
                )

    def abort_everything(self) -> None:
        self.core.abort_everything()

    def unfinished_turns(self) -> list[Turn]:
        return self.core.unfinished_turns()

    async def close(self, wait: float = ABORTED_TURNS_SECONDS) -> None:
        """End every session (their turns aborted, then their shells), ``wait``
        seconds at most for them to close, and stop serving."""
        self.core.end_sessions()
        closing = self.core.sessions.closing
        if closing:
            _, stuck = await asyncio.wait(set(closing), timeout=wait)
            for task in stuck:
                task.cancel()
            if stuck:
                log.error("stopping with %d sessions that did not close in %g s", len(stuck), wait)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self.core.clients.close()  # the last events out
        for socket in self._sockets:
            socket.close(linger=1000)  # the last events still reach their clients
        self._context.term()
        if self._own_spill_dir:
            shutil.rmtree(self.spill_dir, ignore_errors=True)

    # -- the wire (the core's Transport) -----------------------------------------------------

    def send(self, address: Address, frames: list[bytes]) -> None:
        if address[0] >= len(self._sockets):
            return
        try:
            self._sockets[address[0]].send([address[1], *frames])
        except zmq.ZMQError as exc:
            # EHOSTUNREACH: the client's connection is gone.
            raise ClientGone(exc.strerror) from None

    def is_local(self, address: Address) -> bool:
        """Whether a client came over a Unix socket (made 0600: the daemon's own user)."""
        index = address[0]
        return index < len(self.endpoints) and self.endpoints[index].startswith("ipc://")

    def _on_frames(self, index: int, frames: list[bytes]) -> None:
        self.core.receive((index, frames[0]), frames[1:])

    async def _ping(self) -> None:
        """Find clients that went away without a Bye, and let go of stalled ones."""
        while True:
            await asyncio.sleep(self.ping_interval)
            self.core.clients.ping(self.client_stall_seconds)

    # -- what tests and the daemon's own tools look at ----------------------------------------

    def status(self) -> dict[str, Any]:
        return self.core.status()

    def send_event(self, address: Address, turn_id: str, event: dict[str, Any]) -> None:
        self.core.clients.send_event(address, turn_id, event)


def _call_soon(callback: Any) -> object:
    return asyncio.get_running_loop().call_soon(callback)


def _call_held(callback: Any) -> asyncio.TimerHandle:
    return asyncio.get_running_loop().call_later(EVENT_HOLD_SECONDS, callback)


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
