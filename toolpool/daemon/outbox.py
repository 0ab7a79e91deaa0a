"""What the daemon sends one client, within a window of unacknowledged bytes (SPEC L5).

The client acknowledges the bytes it has read (``Ack``, a running total of every
frame's length). At most ``window`` bytes are out unacknowledged — in ZeroMQ's
queues, the kernel's, or the client's; what would pass the window waits in a spill
file on disk, in order, and leaves as acknowledgements come in. While anything waits
there the client is *held* (its turns start no new calls), and the time since its
acknowledgements last moved is how long it has *stalled*.

A frame goes out whole: when nothing is out, one frame may be larger than the
window (frames are at most about ``CHUNK_BYTES``, and the window is bigger).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path


class Outbox:
    def __init__(self, send: Callable[[bytes], None], window: int, spill_path: Path) -> None:
        self.window = window
        self.sent = 0  # bytes handed to the socket
        self.acked = 0  # of which the client says it has read
        self.peak = 0  # the most ever out unacknowledged
        self.spills = 0  # frames that ever waited on disk
        self._send = send
        self._spill_path = spill_path
        self._fd: int | None = None
        self._lengths: deque[int] = deque()  # the spilled frames, in order
        self._read_at = 0
        self._write_at = 0
        self._since: float | None = None  # when acknowledgements last moved, while held
        self._closed = False

    @property
    def in_flight(self) -> int:
        return self.sent - self.acked

    @property
    def spilled(self) -> int:
        """Bytes waiting on disk."""
        return self._write_at - self._read_at

    @property
    def held(self) -> bool:
        return bool(self._lengths)

    def stalled(self, now: float | None = None) -> float:
        """Seconds the client has been held without acknowledging anything; 0 when
        it is not held."""
        if self._since is None:
            return 0.0
        return (time.monotonic() if now is None else now) - self._since

    def push(self, frame: bytes) -> None:
        """Send ``frame`` now when the window has room and nothing waits, else spill it."""
        if self._closed:
            return
        if not self._lengths:  # the usual case, inline: it runs for every frame
            in_flight = self.sent - self.acked
            if in_flight == 0 or in_flight + len(frame) <= self.window:
                self._out(frame)
                return
        if self._fd is None:
            self._fd = os.open(
                self._spill_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600
            )
        os.pwrite(self._fd, frame, self._write_at)
        self._write_at += len(frame)
        self._lengths.append(len(frame))
        self.spills += 1
        if self._since is None:
            self._since = time.monotonic()

    def push_together(self, frames: list[bytes], send: Callable[[list[bytes]], None]) -> None:
        """``frames`` out as one message of several parts through ``send`` when the
        window has room for them all and nothing waits (one wake-up of the client for
        all of them), else each ``push``ed on its own, in order."""
        if not self._closed and not self._lengths:
            size = sum(map(len, frames))
            in_flight = self.sent - self.acked
            if in_flight + size <= self.window:
                self.sent += size
                if in_flight + size > self.peak:
                    self.peak = in_flight + size
                send(frames)
                return
        for frame in frames:
            self.push(frame)

    def ack(self, received: int) -> None:
        """The client has read ``received`` bytes in all (more than was sent counts as
        all of it); send what now fits."""
        received = min(received, self.sent)
        if received <= self.acked:
            return
        self.acked = received
        if self._lengths:
            self._since = time.monotonic()
        while self._lengths and self._fits(self._lengths[0]) and not self._closed:
            assert self._fd is not None
            length = self._lengths.popleft()
            frame = os.pread(self._fd, length, self._read_at)
            self._read_at += length
            self._out(frame)
        if not self._lengths and self._fd is not None and not self._closed:
            os.ftruncate(self._fd, 0)
            self._read_at = self._write_at = 0
            self._since = None

    def close(self) -> None:
        """Drop what waits and remove the spill file."""
        self._closed = True
        self._lengths.clear()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            with contextlib.suppress(FileNotFoundError):
                self._spill_path.unlink()
        self._since = None

    def _fits(self, length: int) -> bool:
        return self.in_flight == 0 or self.in_flight + length <= self.window

    def _out(self, frame: bytes) -> None:
        self.sent += len(frame)
        in_flight = self.sent - self.acked
        if in_flight > self.peak:
            self.peak = in_flight
        self._send(frame)

    def statistics(self) -> dict[str, int | float | bool]:
        return {
            "in_flight_bytes": self.in_flight,
            "peak_in_flight_bytes": self.peak,
            "spilled_bytes": self.spilled,
            "frames_spilled": self.spills,
            "held": self.held,
            "stalled_seconds": round(self.stalled(), 1),
        }
