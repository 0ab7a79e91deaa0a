"""The blocking client: a driver of the connection (``toolpool.client.connection``).

    with toolpool.Client() as client:
        with client.session(workspace="/path/to/repo", gate="ask") as session:
            turn = session.submit([ToolCall("1", "read", {"path": "README.md"})])
            for event in turn:          # as they happen
                print(event)
            results = turn.results()    # in call order

The driver owns the socket and the waiting; the connection does the rest. Threads may
share a client: one of those that wait reads the socket (the reader) and the
connection files what arrives under its request or turn; the others wait on a
condition, woken whenever the reader filed something, each until its own operation is
done or its own timeout is over. When the reader's operation is done, a waiting thread
takes over the reading, so a thread that follows an open turn for hours never keeps
another's request from its answer. What the connection queues goes out at once, or,
while another thread reads, within ``POLL_SECONDS``.

The wait is a blocking ``recv`` with a receive timeout, one frame (or one part of a
message of several) at a time: the cheapest wait pyzmq has (a poll of the socket and
its monitor, then reads until EAGAIN, cost twice as much per frame, and each EAGAIN
is an exception). The monitor, which tells that the daemon hung up, is looked at
when a wait times out: a daemon that is gone sends nothing, so its end is seen
within ``POLL_SECONDS``. The loop is written out in ``_run``, not split in calls:
a turn is a few of its rounds, and a call per step costs more than the step.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import zmq

from toolpool.client import branching
from toolpool.client.base import CLOSE_ERRORS, ClientBase, SessionBase, TurnBase
from toolpool.client.branching import Change, Checkpoint, Checkpoints, Rewound
from toolpool.client.connection import ApprovalHandler
from toolpool.client.core import TurnItem, results_as
from toolpool.client.operation import Deferred, Operation
from toolpool.models import ToolResult
from toolpool.protocol import EventSelection, SteerAction

T = TypeVar("T")
POLL_SECONDS = 0.1  # the longest a waiting thread leaves another thread's frames queued,
# or a daemon's hang-up unnoticed
_POLL_MS = int(POLL_SECONDS * 1000)
_NOBLOCK = int(zmq.NOBLOCK)  # pyzmq's flags are enum.Flags: a plain int converts faster

__all__ = ["ApprovalHandler", "Client", "Session", "Turn"]


class Client(ClientBase[zmq.Socket[bytes]]):
    __doc__ = ClientBase.__doc__

    default_name = "toolpool.Client"
    _lock = threading.RLock()  # replaced per client at connect: the socket's, held by the reader
    _turn = threading.Condition()  # replaced per client at connect: who reads, who waits
    _reader: int | None = None  # the thread that reads the socket now
    _waiting = 0  # threads waiting for the reader to file their answer

    # -- connection --------------------------------------------------------------------

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def connect(self) -> None:
        self._lock = threading.RLock()
        self._turn = threading.Condition(threading.Lock())
        self._reader, self._waiting = None, 0
        self._conn.on_outgoing = self._flush
        self._dial(zmq.Context())
        self._receive_ms = 0  # the socket's receive timeout, as last set
        try:
            self._run(self._conn.hello(self._name, self.connect_timeout))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Say goodbye (the daemon closes this client's sessions) and disconnect. A
        thread reading meanwhile sees the connection closed within ``POLL_SECONDS``
        and leaves the socket first."""
        self._conn.close()
        self._reader_gone()
        with contextlib.suppress(zmq.ZMQError):
            self._flush()
        self._hang_up()

    def _reader_gone(self) -> None:
        """Wait (a second at most) until no other thread reads the socket."""
        if self._reader in (None, threading.get_ident()):
            return
        deadline = time.monotonic() + 1.0
        with self._turn:
            self._waiting += 1
            try:
                while self._reader is not None and time.monotonic() < deadline:
                    self._turn.wait(POLL_SECONDS)
            finally:
                self._waiting -= 1

    # -- the wire ------------------------------------------------------------------------

    def _flush(self) -> None:
        """Send what the connection queued, unless another thread waits (it will).

        Never blocks: with no connection to the daemon (it refused us, or is gone) a
        DEALER's send would wait forever; what cannot go now waits for the next
        round of the wait loop, whose deadline bounds it."""
        outgoing = self._conn.outgoing
        if not outgoing or self._socket is None or not self._lock.acquire(blocking=False):
            return
        try:
            send = self._socket.send
            while outgoing:
                send(outgoing[0], _NOBLOCK)
                outgoing.popleft()
        except zmq.Again:
            pass
        finally:
            self._lock.release()

    def _run(self, operation: Operation[T]) -> T:
        """Wait until ``operation`` is done; its outcome. The calling thread reads the
        socket when no other does (or when it is the reader already: an approval
        handler's request); else it waits for the reader to file its answer, and
        takes over the reading when the reader leaves first."""
        conn = self._conn
        if conn.outgoing:
            self._flush()
        if operation.done():
            return operation.outcome()
        timeout = operation.timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        me = threading.get_ident()
        if self._reader == me:
            return self._read(operation, deadline)
        turn = self._turn
        with turn:
            while self._reader is not None:
                if operation.done():
                    return operation.outcome()
                wait = POLL_SECONDS
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise operation.expired()
                    wait = min(wait, left)
                self._waiting += 1
                try:
                    turn.wait(wait)
                finally:
                    self._waiting -= 1
            self._reader = me
        try:
            return self._read(operation, deadline)
        finally:
            with turn:
                self._reader = None
                if self._waiting:
                    turn.notify_all()  # one of them reads now

    def _filed(self) -> None:
        """The reader filed what arrived: the waiting threads look at their answers."""
        with self._turn:
            self._turn.notify_all()

    def _read(self, operation: Operation[T], deadline: float | None) -> T:
        """Read and file what arrives until ``operation`` is done; its outcome."""
        with self._lock:
            conn = self._conn
            if conn.outgoing:
                self._flush()
            if operation.done():
                return operation.outcome()
            socket = self._socket
            assert socket is not None
            while True:
                milliseconds = _POLL_MS
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise operation.expired()
                    milliseconds = min(_POLL_MS, max(1, int(left * 1000)))
                if milliseconds != self._receive_ms:
                    socket.setsockopt(zmq.RCVTIMEO, milliseconds)
                    self._receive_ms = milliseconds
                try:
                    frame = socket.recv()
                except zmq.Again:
                    self._quiet()
                    if self._waiting:
                        self._filed()  # the daemon may have gone: they see it too
                else:
                    deferred = conn.receive(frame)
                    if deferred:
                        self._refuse(deferred)
                    if self._waiting:
                        self._filed()
                if conn.outgoing:
                    self._flush()
                if operation.done():
                    return operation.outcome()

    def _quiet(self) -> None:
        """Nothing came within a wait: see whether the daemon hung up."""
        assert self._monitor is not None
        if self._monitor.poll(0):
            self._monitor.recv_multipart()
            self._receive()  # what the daemon sent before it went still counts
            self._conn.lost()

    def _receive(self) -> None:
        """File every frame that has arrived, without waiting for more."""
        assert self._socket is not None
        while True:
            try:
                frame = self._socket.recv(_NOBLOCK)
            except zmq.Again:
                return
            self._refuse(self._conn.receive(frame))

    def _refuse(self, deferred: Sequence[Deferred]) -> None:
        for each in deferred:
            self._conn.approvals.refuse(each, "a Client's on_approval handler must not be async")

    # -- requests ------------------------------------------------------------------------

    def session(
        self,
        workspace: str | Path,
        *,
        on_approval: ApprovalHandler | None = None,
        tools: Sequence[Any] = (),
        **options: Any,
    ) -> Session:
        """Open a session on ``workspace``. ``options``: the session options, listed
        once in ``toolpool.session_options.SessionOptions`` (docs/sessions.md),
        checked before anything is sent: a bad one is a ``RequestFailed`` (code
        ``bad_request``) naming it, as the daemon would refuse it.
        ``on_approval(request)`` answers the gate's questions (True, False, or (False,
        "reason")). ``tools``: functions of this program (or ``@tool`` functions) that
        the session offers beside the daemon's, shipped by value and run in the
        daemon's workers under the session's limits (SPEC A5; a ``ShippingError``
        names one that cannot be shipped)."""
        opening = self._conn.open_session(workspace, options, on_approval, tools)
        return Session(self, self._run(opening))

    def status(self) -> dict[str, Any]:
        return self._run(self._conn.status())

    def tools(
        self, format: str = "toolpool", profile: str | None = "toolpool"
    ) -> list[dict[str, Any]]:
        """The tools a session of ``profile`` is offered, in ``format`` (None: all)."""
        return self._run(self._conn.tools(format, profile))


class Session(SessionBase[Client]):
    __doc__ = SessionBase.__doc__

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def submit(
        self,
        calls: Any,
        *,
        format: str | None = None,
        open: bool = False,
        events: EventSelection | str = EventSelection.ALL,
    ) -> Turn:
        """Start a turn: ToolCalls (or their dicts), or model output in ``format``.
        An ``open`` turn takes more calls (``Turn.add``) until ``Turn.close``. With
        ``events="results"`` the turn's stream holds only its ``tool_end`` and
        ``turn_end`` events (and approval requests), which the daemon sends in fewer
        frames: for callers that only want ``results()`` or ``result()``."""
        submitting = self._conn.submit(self.id, calls, format, open, events)
        return Turn(self, self.client._run(submitting))

    def interrupt(self) -> None:
        """S4: the user sent a new message. "cancel" calls stop, the queued are skipped."""
        self.client._run(self._conn.steer(self.id, SteerAction.INTERRUPT))

    def abort(self) -> None:
        """S5: cancel everything the session is running or has queued."""
        self.client._run(self._conn.steer(self.id, SteerAction.ABORT))

    def close(self) -> None:
        """End the session in the daemon. Best effort: a daemon that is gone or
        stopping has ended it already, so waiting long or raising would help no one."""
        with contextlib.suppress(*CLOSE_ERRORS):
            self.client._run(self._conn.close_session(self.id))

    # -- branches (SPEC B1–B10): a session with workspace_mode = "overlay", between turns

    def checkpoint(self, label: str | None = None, *, timeout: float | None = None) -> Checkpoint:
        """Make a checkpoint now (each turn's end is one already): refused while a
        turn runs or waits, or a background shell of the session runs."""
        return self.client._run(branching.checkpoint(self._conn, self.id, label, timeout))

    def checkpoints(self, *, timeout: float | None = None) -> Checkpoints:
        """The session's checkpoints, oldest first (its start first), and the turns'
        ends that made none (``skipped``: background shells ran)."""
        return self.client._run(branching.checkpoints(self._conn, self.id, timeout))

    def rewind(self, checkpoint_id: str, *, timeout: float | None = None) -> Rewound:
        """Workspace and root back to the checkpoint, byte for byte; later checkpoints
        are forgotten, running background shells stopped, reads judged again."""
        return self.client._run(branching.rewind(self._conn, self.id, checkpoint_id, timeout))

    def fork(
        self, n: int = 1, at: str | None = None, *, timeout: float | None = None, **options: Any
    ) -> list[Session]:
        """``n`` new sessions whose workspace and root are this one's at ``at`` (a
        checkpoint id; now by default), each with a copy of its read register and its
        options — ``options`` (``client.session``'s) over them — each diverging on its
        own."""
        made = branching.fork(self._conn, self.id, n, at, options, timeout)
        return [Session(self.client, session_id) for session_id in self.client._run(made)]

    def changes(self, since: str | None = None, *, timeout: float | None = None) -> list[Change]:
        """The workspace's paths that differ from where it started (or ``since`` a
        checkpoint)."""
        return self.client._run(branching.changes(self._conn, self.id, since, timeout))

    def diff(self, since: str | None = None, *, timeout: float | None = None) -> str:
        """The same as a git-format patch (binary files included) ``git apply`` takes."""
        return self.client._run(branching.diff(self._conn, self.id, since, timeout))

    def export(self, path: str | Path, *, timeout: float | None = None) -> int:
        """The workspace as the session sees it, written to a new directory or a
        tarball (``.tar``, ``.tar.gz``, ``.tgz``); how many entries."""
        return self.client._run(branching.export(self._conn, self.id, path, timeout))

    def commit(self, *, timeout: float | None = None) -> list[str]:
        """The workspace's changes applied to the host directory it came from, each
        file atomically; ``CommitConflict`` (nothing written) lists the paths the
        host changed since. The paths written."""
        return self.client._run(branching.commit(self._conn, self.id, timeout))


class Turn(TurnBase[Session]):
    __doc__ = TurnBase.__doc__

    def __iter__(self) -> Iterator[TurnItem]:
        """Every event (and unanswered approval request), ending with turn_end."""
        return self._iterate(follow=False)

    def follow(self) -> Iterator[TurnItem]:
        """Like iterating, but the turn lets go of what has been yielded (``events``
        then holds only what is not read yet): for open turns that live long."""
        return self._iterate(follow=True)

    def _iterate(self, follow: bool) -> Iterator[TurnItem]:
        cursor = self._cursor(follow)
        while not cursor.finished:
            yield self.session.client._run(cursor.next())

    def results(self, timeout: float | None = None) -> tuple[ToolResult, ...]:
        """Wait for the turn's end; its results, in call order (S6)."""
        return self.session.client._run(self._conn.turn_end(self._log, timeout))

    def results_as(self, format: str, timeout: float | None = None) -> Any:
        """The results in a provider's shape ("openai", "anthropic", …)."""
        return results_as(self.results(timeout), format, self._log.custom_calls)

    def result(self, call_id: str, timeout: float | None = None) -> ToolResult:
        """Wait for one call's end; its result."""
        return self.session.client._run(self._conn.call_end(self._log, call_id, timeout))

    def add(self, calls: Any, *, format: str | None = None) -> list[str]:
        """Queue more calls in an open turn; their ids."""
        return self.session.client._run(self._conn.append(self._log, calls, format))

    def cancel(self, call_id: str) -> None:
        """Stop one call (running: cancelled; queued: never started)."""
        self.session.client._run(self._conn.cancel_call(self.id, call_id))

    def close(self) -> None:
        """An open turn takes no more calls; it ends after its last one."""
        self.session.client._run(self._conn.end_turn(self.id))

    def interrupt(self) -> None:
        self.session.interrupt()

    def abort(self) -> None:
        self.session.abort()
