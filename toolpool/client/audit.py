"""``toolpool audit``: the daemon's audit log (SPEC R1), printed, filtered, followed.

It reads the file the daemon writes (``audit_log``), and needs no daemon: the log is
what is left to read after one stopped. ``--follow`` waits for new lines as ``tail -F``
does, across a rotation (``PATH`` renamed ``PATH.1`` and made anew).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

FOLLOW_INTERVAL = 0.2  # seconds between looks at a followed log


def format_line(record: dict[str, Any]) -> str:
    """One record as a line for people: when, where, what, how it ended."""
    gate = record.get("gate") or {}
    decided = f"  {gate.get('decision')} by {gate.get('by')}" if gate else ""
    status = record.get("status", "?")
    if record.get("error_code"):
        status = f"{status} ({record['error_code']})"
    duration = record.get("duration_ms")
    took = "" if duration is None else f"  {duration:.1f} ms"
    return (
        f"{record.get('time', '')}  {record.get('session', '')}  {record.get('turn', '')}  "
        f"{record.get('call', '')}  {record.get('tool', '')}  {status}{took}{decided}"
    )


def _records(lines: Iterator[str], session: str | None) -> Iterator[dict[str, Any]]:
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut by a crash mid-write: the next one is whole
        if isinstance(record, dict) and (session is None or record.get("session") == session):
            yield record


def _follow(path: Path, stop: Callable[[], bool]) -> Iterator[str]:
    """Every whole line of ``path`` and what is appended later, across rotations."""
    handle: IO[str] | None = None
    inode = None
    partial = ""
    try:
        while True:
            if handle is None:
                try:
                    handle = path.open(encoding="utf-8")
                    inode = os.fstat(handle.fileno()).st_ino
                except FileNotFoundError:
                    handle = None
            if handle is not None:
                chunk = handle.read()
                if chunk:
                    partial += chunk
                    *whole, partial = partial.split("\n")
                    yield from whole
                    continue
                try:
                    rotated = path.stat().st_ino != inode
                except FileNotFoundError:
                    rotated = True
                if rotated:  # what the old file had is read: on to the new one
                    handle.close()
                    handle = None
                    continue
            if stop():
                return
            time.sleep(FOLLOW_INTERVAL)
    finally:
        if handle is not None:
            handle.close()


def print_audit(
    path: Path,
    *,
    session: str | None = None,
    follow: bool = False,
    raw: bool = False,
    out: Callable[[str], None] = print,
    stop: Callable[[], bool] = lambda: False,
) -> int:
    """Print the log's records (of one session); with ``follow``, go on until ``stop()``
    says so or the user interrupts. The number of records printed."""
    if not follow and not path.exists():
        raise FileNotFoundError(f"no audit log at {path}")
    if follow:
        lines: Iterator[str] = _follow(path, stop)
    else:
        lines = iter(path.read_text(encoding="utf-8").splitlines())
    printed = 0
    try:
        for record in _records(lines, session):
            out(json.dumps(record, ensure_ascii=False) if raw else format_line(record))
            printed += 1
    except KeyboardInterrupt:
        pass
    return printed
