"""The proxy's control socket: one SOCK_SEQPACKET pair between the pool and the proxy
process, a msgpack map per packet, descriptors (a session's listeners) by
SCM_RIGHTS. Every message is a map with ``op``:

pool → proxy
    ``open``    {session, policy, key, approval_seconds} + two listeners (http, socks)
    ``close``   {session}
    ``answer``  {id, allow, remember, by, reason}: an ask's answer
proxy → pool
    ``ready``   {pid}: serving
    ``ask``     {id, session, call, host, port}: a connection waits for an answer
    ``record``  {session, call, host, port, via, decision, by, address?, error?,
                bytes_up, bytes_down, duration_ms}: a connection ended (or was refused)
    ``stats``   {sessions: {id: counters}}: now and then, when they changed

Nothing here parses a message beyond msgpack: the receiver checks what it uses.
"""

from __future__ import annotations

import array
import os
import socket
from collections import deque
from typing import Any

import msgpack

MAX_MESSAGE = 64 * 1024
MAX_FDS = 4
MAX_QUEUED = 10_000  # messages waiting for a full socket to drain; past it, records drop


class ControlError(Exception):
    """A message that cannot be read."""


def pair() -> tuple[socket.socket, socket.socket]:
    return socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)


def encode(message: dict[str, Any]) -> bytes:
    data = msgpack.packb(message, use_bin_type=True)
    if len(data) > MAX_MESSAGE:
        raise ControlError(f"a control message of {len(data)} bytes")
    return bytes(data)


def receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """The next message and its descriptors; None at the end. Raises BlockingIOError
    on a non-blocking socket with nothing to read, ControlError on a bad message (its
    descriptors closed)."""
    fds = array.array("i")
    data, ancillary, flags, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(MAX_FDS * fds.itemsize))
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if not data and not fds:
        return None
    try:
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            raise ControlError("a control message was cut")
        message = msgpack.unpackb(data, raw=False)
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            raise ControlError("a control message is not a map with an op")
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        _close(fds)
        raise ControlError(f"a bad control message: {exc}") from None
    except ControlError:
        _close(fds)
        raise
    return message, list(fds)


def _close(fds: array.array[int]) -> None:
    for fd in fds:
        os.close(fd)


class Sender:
    """Sends on a non-blocking control socket; what the socket cannot take now waits
    in order (``flush`` when it is writable again), records dropped past
    ``MAX_QUEUED`` (counted in ``dropped``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.queue: deque[tuple[bytes, list[int]]] = deque()
        self.dropped = 0

    def send(self, message: dict[str, Any], fds: list[int] | None = None) -> None:
        """Queue or send ``message``; raises ControlError when it is too large,
        BrokenPipeError when the other end is gone."""
        data = encode(message)
        if len(self.queue) >= MAX_QUEUED and message.get("op") == "record":
            self.dropped += 1
            return
        self.queue.append((data, list(fds or ())))
        self.flush()

    def flush(self) -> bool:
        """Send what waits; True when nothing does any more."""
        while self.queue:
            data, fds = self.queue[0]
            try:
                if fds:
                    socket.send_fds(self.sock, [data], fds)
                else:
                    self.sock.send(data)
            except BlockingIOError:
                return False
            self.queue.popleft()
        return True
