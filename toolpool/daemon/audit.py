"""The audit log: one JSON line per call, for knowing afterwards what every call did
(SPEC R1, R2).

The daemon tells an ``Auditor`` what it sees of a call — its ``tool_start``, its gate
decision, its ``tool_end`` — and the auditor puts one finished record on a queue. A
writer thread turns records into lines, hashes the arguments, writes and rotates the
file: the event loop only appends to a queue. ``close()`` writes what is queued before
it returns, and the daemon calls it after its last turn has ended, so a SIGTERM loses
no line.

A line::

    {"time": "2026-12-01T17:20:01.123456Z", "session": "…", "turn": "…", "call": "1",
     "tool": "edit", "arguments_sha256": "…", "gate": {"decision": "allow", "by": "client"},
     "status": "ok", "error_code": null, "duration_ms": 4.2, "cpu_seconds": 0.003,
     "peak_rss_bytes": 31457280, "worker": "w3", "worker_pid": 4242}

A call of a forked session (B3) has ``"forked_from"``: the session it was forked from.
``duration_ms`` is from the call's start to its end as the daemon saw them; CPU and
peak memory are the worker's for the call (absent for a call that never reached one).
``arguments`` holds the arguments themselves when ``audit_arguments`` is on. ``gate``
is null for a call that ended before the gate (a validation failure, a stop); ``by``
says who decided: ``"no gate"`` (the session's gate is "allow"), ``"read-only"``,
``"policy rule N"``, ``"client"``, ``"timeout"``.

The file is the daemon's own (SPEC R6): its directory is opened once, and the file,
each rotation's renames and each new file go through that directory's fd, the file
``O_NOFOLLOW`` and used only once ``fstat`` of the open fd shows a regular file of the
daemon's user with one link, made 0600. A path that fails this at start stops the start
(``AuditLogRefused``); at a rotation, the lines go on into the file already open.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import queue
import stat
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from toolpool.engine.gate import GateDecision
from toolpool.errors import ToolpoolError
from toolpool.models import ToolEnd, ToolStart

log = logging.getLogger(__name__)

Record = dict[str, Any]
_STOP = None  # on the queue: write what came before, then end
# Records are written at most this long after they end: a wake-up of the writer per
# half second, not per call, costs the daemon ~2-10 % of its CPU per call instead of
# ~20 % (measured with a one-call read turn, interleaved runs).
BATCH_SECONDS = 0.5
MAX_BATCH = 1000


def arguments_hash(arguments: Any) -> str:
    """The SHA-256 of the arguments' canonical JSON (sorted keys, no spaces)."""
    text = json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


class AuditLogRefused(ToolpoolError):
    """The audit log's path holds what the daemon must not write to (SPEC R6): a
    symbolic link, something that is not a regular file, another user's file, a file
    with a second name. The message says which ("it is a symbolic link, …"), to
    follow the path."""


# O_NOFOLLOW: a symlink at the path, dangling or not, is ELOOP, never followed nor
# created through. O_NONBLOCK: a FIFO there fails the open (ENXIO) instead of holding
# the daemon until someone reads it. O_NOCTTY: a terminal there never becomes ours.
# O_RDWR, not O_WRONLY: the last byte is read once, to end a line a crash cut.
_OPEN_FLAGS = (
    os.O_RDWR
    | os.O_APPEND
    | os.O_CREAT
    | os.O_NOFOLLOW
    | os.O_NONBLOCK
    | os.O_NOCTTY
    | os.O_CLOEXEC
)
# O_PATH: the directory's fd names it for openat/renameat/unlinkat and needs no read
# permission on it.
_DIRECTORY_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
_MODE = 0o600  # the arguments (or their hashes) are the user's business


def _open_log_file(dir_fd: int, name: str) -> int:
    """An fd appending to ``name`` in the directory ``dir_fd`` (made if absent), once
    it is known to be a regular file of this process's user with one link; its mode is
    then 0600, whatever it was. Raises AuditLogRefused, or OSError when it cannot be
    opened at all (a directory, no permission)."""
    try:
        fd = os.open(name, _OPEN_FLAGS, _MODE, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise AuditLogRefused(
                "it is a symbolic link, and an audit log is never written through one"
            ) from None
        if exc.errno == errno.ENXIO:
            raise AuditLogRefused("it is not a regular file (a FIFO or a socket)") from None
        raise
    try:
        # The fd's own stat, not the path's: what is checked is what is written to.
        problem = _not_ours(os.fstat(fd))
        if problem:
            raise AuditLogRefused(problem)
        os.set_blocking(fd, True)
        os.fchmod(fd, _MODE)
        _end_cut_line(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _end_cut_line(fd: int) -> None:
    """A log whose last line a crash cut (SIGKILL mid-write) gets its newline now:
    the next record then starts a line of its own, rather than being glued to the
    cut one and skipped with it by every reader."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


def _not_ours(st: os.stat_result) -> str | None:
    """Why a file opened as the log may not be it, or None."""
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.geteuid():
        return f"it belongs to uid {st.st_uid}, not to the daemon's user (uid {os.geteuid()})"
    if st.st_nlink != 1:
        # A second name (a hard link planted here) may be any file of ours elsewhere.
        return f"it has {st.st_nlink} links, not one: it may be another file under a second name"
    return None


class AuditLog:
    """An append-only JSON-lines file, written by its own thread, rotated by size:
    ``PATH`` is renamed ``PATH.1`` (``PATH.1`` to ``PATH.2`` …, ``backups`` kept)
    once it holds ``max_bytes``. Raises AuditLogRefused (or OSError) when ``path``
    cannot be the log (SPEC R6)."""

    def __init__(
        self, path: Path, *, max_bytes: int, backups: int, arguments: bool = False
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.arguments = arguments
        self._queue: queue.SimpleQueue[Record | None] = queue.SimpleQueue()
        self._rotation_stopped: str | None = None  # why, once a rotation failed
        # Here, so that a path it cannot write fails the start. The directory's fd is
        # kept: every rotation renames and creates in the directory checked now.
        path.parent.mkdir(parents=True, exist_ok=True)
        self._dir_fd = os.open(path.parent, _DIRECTORY_FLAGS)
        try:
            self._file = self._open()
        except BaseException:
            os.close(self._dir_fd)
            raise
        self._thread = threading.Thread(target=self._run, name="toolpool-audit", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        rotation = self._rotation_stopped or f"rotated at {self.max_bytes} bytes"
        return f"<AuditLog {self.path}: {rotation}, {self.backups} backups>"

    def _open(self) -> IO[str]:
        fd = _open_log_file(self._dir_fd, self.path.name)
        return os.fdopen(fd, "a", encoding="utf-8")

    def write(self, record: Record) -> None:
        """Queue one finished record; from any thread, never blocks."""
        self._queue.put(record)

    def close(self) -> None:
        """Write every queued record, then close the file."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                stop = self._write(self._batch())
                self._file.flush()
                if stop:
                    return
        except Exception:  # a full disk: say so, and keep the daemon serving
            log.exception("the audit log %s failed; no more lines are written", self.path)
        finally:
            self._file.close()
            os.close(self._dir_fd)

    def _batch(self) -> list[Record | None]:
        """The next record, and those that come within ``BATCH_SECONDS`` of it: one
        wake-up and one flush per batch, not per call (each wake-up of this thread
        takes the GIL from the event loop)."""
        batch = [self._queue.get()]
        deadline = time.monotonic() + BATCH_SECONDS
        with contextlib.suppress(queue.Empty):
            while batch[-1] is not _STOP and len(batch) < MAX_BATCH:
                batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
        return batch

    def _write(self, batch: list[Record | None]) -> bool:
        """Write the batch's records, rotating as the file fills; True at the end."""
        for record in batch:
            if record is _STOP:
                return True
            self._file.write(self._line(record))
            if self._rotation_stopped is None and self._file.tell() >= self.max_bytes:
                self._rotate()
        return False

    def _line(self, record: Record) -> str:
        if "_arguments" not in record:  # a connection's record (N8): as it came
            return json.dumps(record, ensure_ascii=False, default=str) + "\n"
        arguments = record.pop("_arguments")
        line = {**record, "arguments_sha256": arguments_hash(arguments)}
        if self.arguments:
            line["arguments"] = arguments
        return json.dumps(line, ensure_ascii=False, default=str) + "\n"

    def _rotate(self) -> None:
        """``PATH`` becomes ``PATH.1`` and a new ``PATH`` begins, all through the
        directory's fd; with no backups, ``PATH.1`` goes once the new file is open."""
        try:
            self._shift()
            new = self._open()
        except (OSError, AuditLogRefused) as exc:
            # Between the rename and the new file, whoever may write in the directory
            # can plant a link or a FIFO at PATH. Two ways on: stop writing, or keep
            # writing to the file open, ours and checked when it was opened (now PATH.1,
            # or PATH if the renames failed). Stopping would hand the planter an off
            # switch for the record; going on loses no line and writes none through the
            # link, at the cost of a file past max_bytes until the daemon starts again.
            why = str(exc) if isinstance(exc, OSError) else f"the new {self.path.name}: {exc}"
            self._rotation_stopped = f"rotation stopped ({why})"
            log.error(
                "the audit log %s was not rotated (%s): its lines go on into the file "
                "already open, no longer rotated, until the daemon starts again",
                self.path,
                why,
            )
            return
        self._file.close()
        self._file = new
        if self.backups == 0:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path.name}.1", dir_fd=self._dir_fd)

    def _shift(self) -> None:
        """``PATH.n`` to ``PATH.n+1`` (the last backup replaced), ``PATH`` to ``PATH.1``.
        A rename moves a symlink, never what it points to."""
        name = self.path.name
        fds = {"src_dir_fd": self._dir_fd, "dst_dir_fd": self._dir_fd}
        for n in range(self.backups - 1, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.rename(f"{name}.{n}", f"{name}.{n + 1}", **fds)
        # PATH gone (removed under us): its lines went with it; a new one begins.
        with contextlib.suppress(FileNotFoundError):
            os.rename(name, f"{name}.1", **fds)


def _gate(decision: GateDecision | None) -> dict[str, str]:
    if decision is None:  # the gate let it through without a word
        return {"decision": "allow", "by": "gate"}
    return {"decision": "allow" if decision.allowed else "deny", "by": decision.by or "gate"}


class Auditor:
    """What the daemon saw of each call, until its end makes a record of it.

    Calls are keyed by turn and call id (call ids are unique within a turn). Every call
    has a ``tool_start`` and a ``tool_end`` (P12), so every entry is taken out again.
    """

    def __init__(self, log: AuditLog) -> None:
        self.log = log
        self._open: dict[tuple[str, str], Record] = {}
        self._forks: dict[str, str] = {}  # a forked session → the session it came from

    def connection(self, record: Record) -> None:
        """A policy session's connection ended or was refused (N8): a record of its
        own, ``"kind": "connection"``, with the session, the call, the host and port,
        the decision and what made it, the bytes each way and the duration."""
        self.log.write(
            {
                "time": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "kind": "connection",
                **record,
                **(
                    {"forked_from": self._forks[s]}
                    if (s := record.get("session")) in self._forks
                    else {}
                ),
            }
        )

    def forked(self, session_id: str, parent_id: str) -> None:
        """``session_id`` is a fork of ``parent_id`` (B3): its records say so."""
        self._forks[session_id] = parent_id

    def closed(self, session_id: str) -> None:
        self._forks.pop(session_id, None)

    def started(self, turn_id: str, event: ToolStart, *, gate: bool) -> None:
        self._open[(turn_id, event.call_id)] = {
            "time": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            "_began": time.monotonic(),
            "gate": None if gate else {"decision": "allow", "by": "no gate"},
            "_arguments": event.arguments,
        }

    def decided(self, turn_id: str, call_id: str, decision: GateDecision | None) -> None:
        entry = self._open.get((turn_id, call_id))
        if entry is not None:
            entry["gate"] = _gate(decision)

    def ended(self, session_id: str, turn_id: str, event: ToolEnd) -> None:
        entry = self._open.pop((turn_id, event.call_id), None)
        if entry is None:
            return
        result = event.result
        details = result.details
        usage = details.get("usage") or {}
        duration = time.monotonic() - entry["_began"]
        self.log.write(
            {
                "time": entry["time"],
                "session": session_id,
                "turn": turn_id,
                "call": event.call_id,
                "tool": event.tool_name,
                "_arguments": entry["_arguments"],
                "gate": entry["gate"],
                "status": "error" if result.is_error else "ok",
                "error_code": result.error_code.value if result.error_code else None,
                "duration_ms": round(duration * 1000, 3),
                "cpu_seconds": usage.get("cpu_seconds"),
                "peak_rss_bytes": usage.get("peak_rss_bytes"),
                "worker": details.get("worker"),
                "worker_pid": details.get("worker_pid"),
                **({"forked_from": self._forks[session_id]} if session_id in self._forks else {}),
            }
        )
