"""A worker's lines to the coordinator: two ZeroMQ DEALER sockets (its calls' line and
its control line), two threads, a lock.

The calls' line is used by one thread at a time (ZeroMQ allows a socket to move
between threads behind a full memory barrier; the lock is that barrier):

- idle, the main thread owns it: it waits for the next call on it, heartbeating
  meanwhile, and sends the call's result itself — no thread hop on the call's path;
- while a tool runs, the I/O thread takes it up: it sends the progress any thread
  queued, and a heartbeat every interval. A worker whose heartbeats stop is hung (a
  tool holding the GIL in C code, a stopped process) and gets replaced;
- a tool that asks the coordinator something (``ask``: a background shell to start,
  read or end) holds the socket until the answer comes, heartbeating and sending
  progress meanwhile itself. Whatever else arrives then waits for ``receive``.

Beside that line, a second DEALER socket, the control line, is the I/O thread's
alone, idle or busy: it waits on it, so a ``Cancel`` is seen at once, whatever the
main thread does. The pool may send a worker its next call while the current one
runs (it waits in the socket: the worker never waits for the pool between calls),
so a cancel names its call by ``ticket``, and the worker decides, under one lock
with the main thread's start and end of a call, what it means: the call running —
the I/O thread raises SIGTERM in the main thread, for that call only (the runner's
handler checks ``cancel_target``); a call not started — it never will be
(``Withdrawn``); a call that has ended — nothing.

A message on the calls' line may carry several parts, each one encoded message (the
calls of a frame, SPEC H4): they are read in order as if each had come alone, a part
that does not decode dropped. Results go out the same way: a result waits for the
next one, ``result_hold`` seconds (1 ms) at most, only while another call waits at
the worker, and the results held leave as one message of several parts, in the
order the calls ran — before anything a later call sends, so the pool sees every
call's messages in order.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import signal
import threading
import time
from collections import deque

import zmq

from toolpool.protocol import (
    Cancel,
    Execute,
    Heartbeat,
    Message,
    Progress,
    Ready,
    ShellReply,
    ShellRequest,
    Withdrawn,
    encode,
)
from toolpool.worker.lines import coalesced, decoded, receive_timeout_ms
from toolpool.worker.timer import OneShotTimer

log = logging.getLogger(__name__)

# The control line's identity: the worker's id and this.
CONTROL_SUFFIX = "+control"
# How many ended calls the worker remembers, so that a late Cancel of one is known for
# what it is: the pool gives a worker up to worker_calls_per_frame calls (8 by
# default) at a time and may cancel one of them until its result reaches it, which
# now includes the results held here; 256 covers frames of far more than that.
_ENDED_KEPT = 256
# How long a finished call's result may wait for the next call's, while one waits.
RESULT_HOLD = 0.001

# pyzmq's flags and options as plain ints: as enum members, each ``|`` and each option
# lookup runs in Python, on the path of every call (toolpool.zmqloop says the same).
_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)
_RCVTIMEO = int(zmq.RCVTIMEO)


def _rss() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class Channel:
    def __init__(
        self,
        endpoint: str,
        worker_id: str,
        heartbeat_interval: float,
        result_hold: float = RESULT_HOLD,
    ) -> None:
        self.worker_id = worker_id
        self._interval = heartbeat_interval
        self._hold = result_hold
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IDENTITY, worker_id.encode())
        self._socket.setsockopt(zmq.LINGER, 2000)  # let a last result leave on exit
        self._socket.connect(endpoint)
        self._lock = threading.Lock()
        # Text progress waits as a message (``coalesced`` joins it at the flush);
        # anything else encoded, in the sender's thread.
        self._outbox: queue.SimpleQueue[Message | bytes] = queue.SimpleQueue()
        # A wake-up hint: never blocks the writer (a full pipe already means "wake up").
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # A tool runs: the I/O thread serves the socket. A flag, not an Event: nobody
        # waits on it (the I/O thread waits on its pipe), and an Event's set and clear
        # each take its condition's lock, twice a call.
        self._busy = False
        self._closing = False
        self._next_beat = 0.0
        self._timeout = -1  # the calls line's receive timeout, as last set (ms)
        # Arrived and not yet run: the other parts of a message (a frame of calls), and
        # what came while a tool waited for an answer.
        self._held: deque[Message] = deque()
        # Results of ended calls not sent yet (encoded); the timer runs while there are.
        self._unsent: list[bytes] = []
        self._hold_timer = OneShotTimer(result_hold)
        self._hold_armed = False
        self._hold_ends = 0.0
        self._requests = itertools.count(1)
        self._control = self._context.socket(zmq.DEALER)
        self._control.setsockopt(zmq.IDENTITY, (worker_id + CONTROL_SUFFIX).encode())
        self._control.setsockopt(zmq.LINGER, 0)
        self._control.connect(endpoint)
        # The calls as a Cancel is decided on (I/O thread) and a call starts and ends
        # (main thread), by ticket, under one lock.
        self._calls = threading.Lock()
        self._running: int | None = None
        self._ended: deque[int] = deque(maxlen=_ENDED_KEPT)
        # Taken back before they started: how many of each ticket's Executes still to
        # come are to be skipped. A count, not a set: a call the pool got back may be
        # given this worker again, with its ticket, before the first Execute of it is
        # read — a cancel of it then is for the second one.
        self._withdrawn: dict[int, int] = {}
        # The call the last cancel signal the I/O thread raised is for; the runner's
        # handler takes it (``take_cancel_target``).
        self._cancel_target: int | None = None
        self._main_thread = threading.get_ident()
        self._thread = threading.Thread(target=self._serve, name="toolpool-io", daemon=True)

    def start(self, failure: str = "") -> None:
        """Say ``Ready`` on both lines (with ``failure``: what kept this worker from
        loading its session's tools, SPEC A5), then serve the socket."""
        ready = encode(Ready(self.worker_id, os.getpid(), failure=failure))
        self._control.send(ready)  # the pool takes calls to a worker once both are in
        with self._lock:
            self._socket.send(ready)
        self._thread.start()

    # -- the main thread -----------------------------------------------------------------

    def receive(self) -> Message:
        """Wait for the next message from the coordinator (idle: heartbeat meanwhile)."""
        while True:
            if self._held:
                return self._held.popleft()
            with self._lock:
                self._flush()  # held results, late progress of the last call
                self._heartbeat_if_due()
                parts = self._recv_within(self._next_beat - time.monotonic())
            for message in decoded(parts):
                if isinstance(message, ShellReply):
                    # The answer to a question its call gave up on (cancelled meanwhile).
                    log.debug("dropped a late answer to request %s", message.request_id)
                    continue
                self._held.append(message)

    def request_id(self) -> str:
        """A fresh id for ``ask``."""
        return f"{self.worker_id}-{next(self._requests)}"

    def ask(self, request: ShellRequest, timeout: float) -> ShellReply:
        """Send ``request`` and wait for its answer, from the thread of a running
        tool; TimeoutError after ``timeout`` seconds. Heartbeats and progress go on
        meanwhile; other messages are kept for ``receive``. The cancel signal
        interrupts the wait (its exception propagates; a late answer is dropped)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._flush()
            self._socket.send(encode(request))
            while True:
                self._flush()
                self._heartbeat_if_due()
                now = time.monotonic()
                if now >= deadline:
                    raise TimeoutError(f"no answer to {request.action.value} in {timeout:g} s")
                parts = self._recv_within(min(self._next_beat, deadline) - now)
                answer = None
                for message in decoded(parts):
                    if isinstance(message, ShellReply):
                        if message.request_id == request.request_id:
                            answer = message
                        continue  # else an earlier question's, given up on
                    self._held.append(message)
                if answer is not None:
                    return answer

    def begin_call(self, ticket: int) -> bool:
        """The call ``ticket`` is to start: False when a Cancel took it back first (it
        must not start; ``Withdrawn`` was sent). Else the I/O thread serves the socket
        until ``end_call``. It is not woken for that: it wakes for progress, a Cancel
        or the next heartbeat, so a short call never has it competing for the GIL."""
        with self._calls:
            skips = self._withdrawn.get(ticket)
            if skips is not None:
                if skips > 1:
                    self._withdrawn[ticket] = skips - 1
                else:
                    del self._withdrawn[ticket]
                return False
            self._running = ticket
        self._busy = True
        return True

    def end_call(self, ticket: int, result: bytes) -> None:
        """The tool is done: send what it reported, then its result (encoded) — at
        once, or, while the next call waits here already, with the next results in
        one message, ``result_hold`` seconds after the first at the latest."""
        with self._calls:
            self._running = None
            self._ended.append(ticket)
        self._busy = False
        with self._lock:
            self._flush(results_due=False)  # its progress: after the results before it
            self._unsent.append(result)
            held = self._held
            if held and type(held[0]) is Execute:
                now = time.monotonic()
                if len(self._unsent) == 1:
                    # If the next call outlasts the hold, the timer wakes the I/O
                    # thread, which sends it (module timer: not woken otherwise).
                    self._hold_ends = now + self._hold
                    self._hold_timer.arm()
                    self._hold_armed = True
                    return
                if now < self._hold_ends:
                    return
            self._send_results()

    def withdraw(self, ticket: int) -> None:
        """Give back a call without starting it (the call before left the worker
        unfit for another: the pool retires it and runs the call elsewhere)."""
        with self._calls:
            self._ended.append(ticket)
        with self._lock:
            self._flush()  # the results before it, in order
            self._socket.send(encode(Withdrawn(ticket)))

    def take_cancel_target(self) -> int | None:
        """The ticket of the call the last cancel signal this worker raised itself is
        for, once (None: the signal came from outside, such as a pool closing)."""
        target, self._cancel_target = self._cancel_target, None
        return target

    # -- any thread ----------------------------------------------------------------------

    def send(self, message: Message) -> None:
        """Queue ``message`` (progress, a preview) for the coordinator; safe from any
        thread. What cannot be encoded raises here, in the sender's thread (a tool's
        ``report_progress``), never later in the thread that flushes."""
        if type(message) is Progress and type(message.data) is str:
            text = message.data
            if not text.isascii():
                text.encode()  # a lone surrogate cannot go: UnicodeEncodeError
            self._outbox.put(message)
        else:
            self._outbox.put(encode(message))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full: wake-ups are waiting already
            os.write(self._wake_w, b"\0")

    def close(self) -> None:
        self._closing = True
        self._busy = True
        self._wake()
        self._thread.join(timeout=5)
        with self._lock:
            self._flush()
            self._socket.close()
        self._control.close()
        self._context.term()
        self._hold_timer.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    # -- the I/O thread ------------------------------------------------------------------

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._control, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        hold_fd = self._hold_timer.fileno()
        poller.register(hold_fd, zmq.POLLIN)
        while not self._closing:
            # Idle, it looks now and then whether a call began (the main thread
            # heartbeats meanwhile); busy, it wakes for the next heartbeat or progress;
            # results held past their hold, for the hold's timer. Either way a Cancel
            # on the control line wakes it at once.
            due = max(0.0, self._next_beat - time.monotonic())
            wait = due if self._busy else self._interval
            ready = dict(poller.poll(int(wait * 1000) + 1))
            if self._wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 65536)
            if self._control in ready:
                self._read_control()
            hold_over = hold_fd in ready
            if hold_over:
                self._hold_timer.clear()
            if self._busy and not self._closing:
                with self._lock:
                    self._flush(results_due=hold_over)
                    self._heartbeat_if_due()
            elif hold_over and not self._closing:
                # Between two calls. Never a blocking wait: the main thread may hold
                # the lock while it waits for a message (it sends held results itself
                # before it waits); held by it now, the timer asks again.
                if self._lock.acquire(blocking=False):
                    try:
                        self._flush()
                    finally:
                        self._lock.release()
                else:
                    self._hold_timer.arm()
                    self._hold_armed = True

    def _read_control(self) -> None:
        while True:
            try:
                frame = self._control.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            for message in decoded([frame]):
                if isinstance(message, Cancel):
                    self._cancel(message)
                else:
                    log.error("ignored a %s on the control line", message.type.value)

    def _cancel(self, message: Cancel) -> None:
        """Decide what ``message`` means now, and do it (module docstring)."""
        ticket = message.ticket
        with self._calls:
            if ticket == self._running:
                if message.running:
                    self._cancel_target = ticket
                    signal.pthread_kill(self._main_thread, signal.SIGTERM)
                return
            if ticket in self._ended:
                return
            # Held, or still on its way: it never starts. Counted once a Cancel: the
            # pool cancels only a call it has given this worker, so a second Cancel of
            # a ticket still to be skipped is for a second Execute of it.
            self._withdrawn[ticket] = self._withdrawn.get(ticket, 0) + 1
        self._control.send(encode(Withdrawn(ticket)))

    # -- with the lock held ------------------------------------------------------------------

    def _flush(self, *, results_due: bool = True) -> None:
        """Send the results held (when ``results_due``, or ahead of any progress: a
        later call's messages never overtake an earlier call's result), then the
        progress queued."""
        # Whoever takes from the queue holds the lock: empty() is the answer, without
        # the exception that get_nowait raises at the end of every flush.
        outbox = self._outbox
        if self._unsent and (results_due or not outbox.empty()):
            self._send_results()
        if not outbox.empty():
            waiting = []
            while not outbox.empty():
                waiting.append(outbox.get_nowait())
            for message in coalesced(waiting):
                self._socket.send(message if isinstance(message, bytes) else encode(message))

    def _send_results(self) -> None:
        unsent = self._unsent
        if len(unsent) == 1:
            self._socket.send(unsent[0])
        else:
            send = self._socket.send
            for part in itertools.islice(unsent, len(unsent) - 1):
                send(part, _SNDMORE)
            send(unsent[-1])
        self._unsent = []
        if self._hold_armed:  # a hold ran: its timer is no longer wanted
            self._hold_timer.disarm()
            self._hold_armed = False

    def _heartbeat_if_due(self) -> None:
        now = time.monotonic()
        if now >= self._next_beat:
            self._socket.send(encode(Heartbeat(self.worker_id, _rss())))
            self._next_beat = now + self._interval

    def _recv_within(self, wait: float) -> list[bytes]:
        """The parts of the next message, or none after ``wait`` seconds at most;
        with the lock held.

        A receive that gives up by the next heartbeat, rather than a poll then a
        receive: pyzmq's poll builds a Poller for every call, and the two cost the
        worker ~14 µs more per call (measured). Its timeout is set only when it
        changes (``receive_timeout_ms``): most calls make no socket call but the receive."""
        socket = self._socket
        timeout = receive_timeout_ms(wait)
        if timeout != self._timeout:
            socket.setsockopt(_RCVTIMEO, timeout)
            self._timeout = timeout
        try:
            part = socket.recv(0, copy=False)
            parts = [part.bytes]
            while part.more:  # a part's flag, not an RCVMORE option asked each time
                part = socket.recv(_NOBLOCK, copy=False)
                parts.append(part.bytes)
        except zmq.Again:
            return []
        return parts
