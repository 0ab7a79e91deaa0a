"""What the two drivers are made of, written once: the client's arguments and
socket, a session's and a turn's identity. Each driver adds its waiting."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import zmq

from toolpool.client.connection import Connection
from toolpool.client.core import TurnItem, TurnLog, resolve_endpoint
from toolpool.client.errors import ClientTimeout, DaemonUnavailable, RequestFailed
from toolpool.client.operation import TurnCursor
from toolpool.protocol import ShippedTool

S = TypeVar("S", bound="zmq.Socket[Any]")
C = TypeVar("C", bound="ClientBase[Any]")
SessionT = TypeVar("SessionT", bound="SessionBase[Any]")

# What a session's close lets pass: the daemon that is gone or stopping ended it.
CLOSE_ERRORS = (ClientTimeout, RequestFailed, DaemonUnavailable)


class ClientBase(Generic[S]):
    """A connection to the toolpool daemon.

    ``endpoint`` defaults to the running daemon's socket (runtime directory);
    ``timeout`` bounds each request's wait for its reply; ``curve`` is
    (server public key, client public key, client secret key) for a CURVE endpoint.
    """

    default_name: ClassVar[str]

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        runtime_dir: str | Path | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        curve: tuple[bytes, bytes, bytes] | None = None,
        name: str | None = None,
    ) -> None:
        self.endpoint = resolve_endpoint(endpoint, runtime_dir).address
        self.connect_timeout = connect_timeout
        self._curve = curve
        self._name = name or self.default_name
        self._conn = Connection(self.endpoint, timeout)
        self._context: zmq.Context[S] | None = None
        self._socket: S | None = None
        self._monitor: S | None = None

    @property
    def timeout(self) -> float:
        return self._conn.timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._conn.timeout = value

    @property
    def daemon_pid(self) -> int | None:
        return self._conn.daemon_pid

    @property
    def tool_names(self) -> list[str]:
        return self._conn.tool_names

    def _dial(self, context: zmq.Context[S]) -> None:
        """A DEALER socket to the endpoint (CURVE when asked), watched by a monitor
        that tells when the daemon closes the connection (it stopped or died), so
        that nobody waits out a timeout for an answer that cannot come."""
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 500)
        if self._curve is not None:
            server, public, secret = self._curve
            socket.curve_serverkey = server
            socket.curve_publickey = public
            socket.curve_secretkey = secret
        self._monitor = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(self.endpoint)
        self._context, self._socket = context, socket
        self._conn.start()

    def _hang_up(self) -> None:
        """Close the socket, its monitor and the context (what was sent is sent)."""
        if self._socket is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._socket.disable_monitor()
            self._socket.close()
        if self._monitor is not None:
            self._monitor.close()
        if self._context is not None:
            self._context.term()
        self._context = self._socket = self._monitor = None


class SessionBase(Generic[C]):
    """A session in the daemon; its turns run one after another. A context manager."""

    def __init__(self, client: C, session_id: str) -> None:
        self.client = client
        self.id = session_id
        self._conn: Connection = client._conn

    @property
    def shipped_tools(self) -> tuple[ShippedTool, ...]:
        """The tools this session's client shipped with it (SPEC A5), as the daemon
        was told of them: name, description, schema and fixed answers."""
        return self._conn.shipped.get(self.id, ())


class TurnBase(Generic[SessionT]):
    """A submitted turn: its events as they happen, its results once it ended."""

    def __init__(self, session: SessionT, log: TurnLog) -> None:
        self.session = session
        self._log = log
        self.id = log.turn_id
        self.call_ids = log.call_ids
        self._conn: Connection = session._conn

    @property
    def events(self) -> list[TurnItem]:
        """What arrived so far (but what ``follow()`` let go of)."""
        return list(self._log.items)

    def _cursor(self, follow: bool) -> TurnCursor:
        return self._conn.cursor(self._log, follow)
