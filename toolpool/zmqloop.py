"""A plain ZeroMQ socket driven by an asyncio loop, without a future per message.

zmq.asyncio wraps every send and receive in a future and an extra turn of the event
loop; on a path that moves several small messages per tool call, that is most of
the cost. Here the socket's file descriptor is watched by the loop, every waiting
message is read at once and handed to a plain callback, and sends go out at once
(they never block: callers use sockets whose send high-water mark cannot be hit, or
ROUTER_MANDATORY sockets that fail fast).

ZeroMQ's descriptor is edge-triggered and is also consumed by sends, so after a send
the socket is checked again for waiting input.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq

Frames = list[bytes]


class LoopSocket:
    def __init__(
        self,
        socket: zmq.Socket[bytes],
        on_message: Callable[[Frames], None],
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        self.socket = socket
        self._on_message = on_message
        self._loop = loop or asyncio.get_running_loop()
        fd = socket.getsockopt(zmq.FD)
        assert isinstance(fd, int)
        self._fd = fd
        self._scheduled = False
        self._loop.add_reader(self._fd, self._drain)
        self._loop.call_soon(self._drain)  # messages may already wait

    def send(self, frames: Frames) -> None:
        """Send now; raises zmq.ZMQError (EHOSTUNREACH for a ROUTER's lost peer)."""
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK)
        finally:
            self._recheck()

    def _recheck(self) -> None:
        events = self.socket.getsockopt(zmq.EVENTS)
        assert isinstance(events, int)
        if not self._scheduled and events & zmq.POLLIN:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._scheduled = False
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            except zmq.ZMQError:
                return  # closed under us
            self._on_message(frames)

    def close(self, linger: int = 0) -> None:
        self._loop.remove_reader(self._fd)
        self.socket.close(linger)
