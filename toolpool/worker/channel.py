"""A worker's line to the coordinator: one ZeroMQ DEALER socket, owned by one thread.

The I/O thread receives messages into ``inbox`` for the main thread (which runs
tools), sends what any thread queued with ``send``, and sends a heartbeat every
interval whether a tool is running or not — a worker whose heartbeats stop is hung.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

import zmq

from toolpool.protocol import Heartbeat, Message, ProtocolError, Ready, decode, encode

log = logging.getLogger(__name__)


def _rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Channel:
    def __init__(self, endpoint: str, worker_id: str, heartbeat_interval: float) -> None:
        self.worker_id = worker_id
        self.inbox: queue.SimpleQueue[Message | None] = queue.SimpleQueue()
        self._outbox: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe()
        self._interval = heartbeat_interval
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, worker_id.encode())
        self._socket.setsockopt(zmq.LINGER, 2000)  # let a last result leave on exit
        self._socket.connect(endpoint)
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="toolpool-channel", daemon=True)

    def start(self) -> None:
        self.send(Ready(self.worker_id, os.getpid()))
        self._thread.start()

    def send(self, message: Message) -> None:
        """Queue ``message`` for the coordinator; safe from any thread."""
        self._outbox.put(encode(message))
        os.write(self._wake_w, b"\0")

    def close(self) -> None:
        self._closing = True
        os.write(self._wake_w, b"\0")
        self._thread.join(timeout=5)
        self._socket.close()
        self._context.term()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        next_beat = time.monotonic()
        try:
            while True:
                self._flush()
                if self._closing:
                    return
                now = time.monotonic()
                if now >= next_beat:
                    self._socket.send(encode(Heartbeat(self.worker_id, _rss())))
                    next_beat = now + self._interval
                events = dict(poller.poll(int(max(0.0, next_beat - now) * 1000) + 1))
                if self._wake_r in events:
                    os.read(self._wake_r, 4096)
                if self._socket in events:
                    self._receive()
        except zmq.ZMQError as exc:
            log.error("worker channel failed: %s", exc)
        finally:
            self.inbox.put(None)  # the main thread sees the line is gone

    def _flush(self) -> None:
        while True:
            try:
                frame = self._outbox.get_nowait()
            except queue.Empty:
                return
            self._socket.send(frame)

    def _receive(self) -> None:
        while True:
            try:
                frame = self._socket.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.inbox.put(decode(frame))
            except ProtocolError as exc:
                log.error("dropped a bad frame from the coordinator: %s", exc)
