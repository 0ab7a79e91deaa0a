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

``duration_ms`` is from the call's start to its end as the daemon saw them; CPU and
peak memory are the worker's for the call (absent for a call that never reached one).
``arguments`` holds the arguments themselves when ``audit_arguments`` is on. ``gate``
is null for a call that ended before the gate (a validation failure, a stop); ``by``
says who decided: ``"no gate"`` (the session's gate is "allow"), ``"read-only"``,
``"policy rule N"``, ``"client"``, ``"timeout"``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from toolpool.engine.gate import GateDecision
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


class AuditLog:
    """An append-only JSON-lines file, written by its own thread, rotated by size:
    ``PATH`` is renamed ``PATH.1`` (``PATH.1`` to ``PATH.2`` …, ``backups`` kept)
    once it holds ``max_bytes``."""

    def __init__(
        self, path: Path, *, max_bytes: int, backups: int, arguments: bool = False
    ) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self.arguments = arguments
        self._queue: queue.SimpleQueue[Record | None] = queue.SimpleQueue()
        self._file = self._open()  # here, so that a path it cannot write fails the start
        self._thread = threading.Thread(target=self._run, name="toolpool-audit", daemon=True)
        self._thread.start()

    def _open(self) -> IO[str]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # 0600: the arguments (or their hashes) are the user's business.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
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
            if self._file.tell() >= self.max_bytes:
                self._rotate()
        return False

    def _line(self, record: Record) -> str:
        arguments = record.pop("_arguments")
        line = {**record, "arguments_sha256": arguments_hash(arguments)}
        if self.arguments:
            line["arguments"] = arguments
        return json.dumps(line, ensure_ascii=False, default=str) + "\n"

    def _rotate(self) -> None:
        self._file.close()
        if self.backups == 0:
            self.path.unlink(missing_ok=True)
        else:
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
            self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = self._open()


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
            }
        )
