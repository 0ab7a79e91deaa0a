"""A plain ZeroMQ socket driven by an asyncio loop, without a future per message.

zmq.asyncio wraps every send and receive in a future and an extra turn of the event
loop; on a path that moves several small messages per tool call, that is most of
the cost. Here the socket's file descriptor is watched by the loop, every waiting
message is read at once and handed to a plain callback, and sends go out at once
(they never block: callers use sockets whose send high-water mark cannot be hit, or
ROUTER_MANDATORY sockets that fail fast).

ZeroMQ's descriptor is edge-triggered and is also consumed by sends, so after a send
the socket is checked again for waiting input.

A drain reads ``DRAIN_BATCH`` messages at most, then lets the loop run what else is
ready before it goes on: a peer that floods its socket (a worker whose tool reports
progress in a tight loop) never keeps the loop from the daemon's other sockets.

On the path of every call, pyzmq's conveniences cost more than the I/O: its flags are
``enum.Flag``s whose ``|`` runs in Python (here they are plain ints), ``RCVMORE`` is
asked per part through an enum lookup (here a part's ``more`` says it), and a drain
that ends on an ``Again`` exception builds one (here ``EVENTS`` is asked first).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import zmq

Frames = list[bytes]

_POLLIN = int(zmq.POLLIN)
_EVENTS = int(zmq.EVENTS)  # a plain int: pyzmq turns an enum option into one per call
_NOBLOCK = int(zmq.NOBLOCK)
_MORE_NOBLOCK = int(zmq.SNDMORE) | _NOBLOCK
# Messages one drain reads before it yields to the loop (and goes on at its next turn).
DRAIN_BATCH = 64


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
        self._draining = False  # _drain is on the stack: it looks again itself
        self._loop.add_reader(self._fd, self._drain)
        self._loop.call_soon(self._drain)  # messages may already wait

    def send(self, frames: Frames) -> None:
        """Send now; raises zmq.ZMQError (EHOSTUNREACH for a ROUTER's lost peer)."""
        socket = self.socket
        try:
            last = len(frames) - 1
            for i, frame in enumerate(frames):
                socket.send(frame, _NOBLOCK if i == last else _MORE_NOBLOCK)
        finally:
            self._recheck()

    def _recheck(self) -> None:
        """After a send: input that came meanwhile is read in a drain of its own, one
        per turn of the loop however many sends it made — none when the send was made
        from this socket's drain, which looks again before it returns."""
        if not self._scheduled and not self._draining:
            self._scheduled = True
            self._loop.call_soon(self._drain)

    def _events(self) -> int:
        events: int = self.socket.getsockopt(_EVENTS)  # type: ignore[assignment]
        return events

    def _drain(self) -> None:
        self._scheduled = False
        self._draining = True
        socket = self.socket
        try:
            for _ in range(DRAIN_BATCH):
                try:
                    if not self._events() & _POLLIN:
                        return
                    part = socket.recv(_NOBLOCK, copy=False)
                    frames = [part.bytes]
                    while part.more:
                        part = socket.recv(_NOBLOCK, copy=False)
                        frames.append(part.bytes)
                except zmq.ZMQError:
                    return  # closed under us
                self._on_message(frames)
            # More may wait, and the descriptor will not say so again: go on at the
            # loop's next turn, after what else is ready.
            self._scheduled = True
            self._loop.call_soon(self._drain)
        finally:
            self._draining = False

    def close(self, linger: int = 0) -> None:
        self._loop.remove_reader(self._fd)
        self.socket.close(linger)
