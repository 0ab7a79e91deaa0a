"""``toolpool audit``: the daemon's audit log (SPEC R1), printed, filtered, followed.

It reads the file the daemon writes (``audit_log``), and needs no daemon: the log is
what is left to read after one stopped. ``--follow`` waits for new lines as ``tail -F``
does, across a rotation (``PATH`` renamed ``PATH.1`` and made anew).

What a record holds was chosen, much of it, by a model or a client: a session, turn or
call id, a tool name. Nothing of it reaches the terminal raw (SPEC R7): records are
split on ``\\n`` alone (``str.splitlines`` also splits on U+2028, U+0085 … and would
cut a record in two, both halves then dropped), and every character a terminal could
act on is escaped, in the human form by ``terminal_safe`` and in ``--json`` by
``json_line``.
"""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

FOLLOW_INTERVAL = 0.2  # seconds between looks at a followed log

# What never goes to the terminal raw: C0 controls, DEL and C1 controls (ESC and CSI
# 0x9b move the cursor and clear the screen; CR and LF forge lines), U+2028/U+2029 (a
# line break to some terminals and readers), the bidi controls U+202A-U+202E and
# U+2066-U+2069 and the marks U+061C, U+200E, U+200F (text shown in another order than
# it is), and lone surrogates (not text: printing one fails the command).
_UNSAFE = r"\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_FOR_PEOPLE = re.compile(rf"[\\{_UNSAFE}]")  # and the backslash, escaped as \\
_UNSAFE_IN_JSON = re.compile(rf"[{_UNSAFE}]")  # json.dumps escaped C0 and backslash


def terminal_safe(value: object) -> str:
    """``value`` as text that a terminal shows as it is, on one line: every control,
    line or paragraph separator, bidi control and lone surrogate as ``\\xNN`` (below
    U+0100) or ``\\uNNNN``, and a backslash as ``\\\\`` so that an escape shown is never
    one the text spelled out."""
    return _UNSAFE_FOR_PEOPLE.sub(_escape_for_people, str(value))


def _escape_for_people(match: re.Match[str]) -> str:
    char = match[0]
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def json_line(record: dict[str, Any]) -> str:
    """``record`` as one line of valid JSON that parses back to it and holds none of
    the characters ``terminal_safe`` escapes (they are ``\\u`` escapes: ``json.dumps``
    with ``ensure_ascii=False`` leaves DEL, C1, U+2028 and the rest raw)."""
    text = json.dumps(record, ensure_ascii=False)
    # Outside its strings JSON is ASCII: every match is inside a string, where a \u
    # escape means the same character.
    return _UNSAFE_IN_JSON.sub(lambda match: f"\\u{ord(match[0]):04x}", text)


def format_line(record: dict[str, Any]) -> str:
    """One record as one line for people: when, where, what, how it ended; each field
    through ``terminal_safe``, whatever the model named its call."""
    if record.get("kind") == "connection":
        return _connection_line(record)
    gate = record.get("gate")
    decided = ""
    if isinstance(gate, dict) and gate:
        decided = f"  {terminal_safe(gate.get('decision'))} by {terminal_safe(gate.get('by'))}"
    status = terminal_safe(record.get("status", "?"))
    if record.get("error_code"):
        status = f"{status} ({terminal_safe(record['error_code'])})"
    duration = record.get("duration_ms")
    if duration is None:
        took = ""
    elif isinstance(duration, int | float):
        took = f"  {duration:.1f} ms"
    else:  # not the daemon's: shown, not a reason to stop printing
        took = f"  {terminal_safe(duration)} ms"
    where = (record.get(key, "") for key in ("time", "session", "turn", "call", "tool"))
    return "  ".join(terminal_safe(field) for field in where) + f"  {status}{took}{decided}"


def _connection_line(record: dict[str, Any]) -> str:
    """A policy session's connection (SPEC N8): when, where, to what, the decision and
    what made it, the bytes each way."""
    where = (record.get(key, "") for key in ("time", "session", "call"))
    host, port = record.get("host", ""), record.get("port", "")
    line = "  ".join(terminal_safe(field) for field in where)
    line += f"  connect {terminal_safe(host)}:{terminal_safe(port)}"
    line += f"  {terminal_safe(record.get('decision', '?'))} by {terminal_safe(record.get('by'))}"
    if record.get("error"):
        line += f" ({terminal_safe(record['error'])})"
    up, down = record.get("bytes_up"), record.get("bytes_down")
    if isinstance(up, int) and isinstance(down, int):
        line += f"  {up} B up, {down} B down"
    duration = record.get("duration_ms")
    if isinstance(duration, int | float):
        line += f"  {duration:.1f} ms"
    return line


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


def _decoded(lines: list[bytes]) -> Iterator[str]:
    """The lines as text; a byte that is not UTF-8 (a line cut mid-character) becomes
    U+FFFD and costs that line at most, not the command."""
    return (line.decode("utf-8", errors="replace") for line in lines)


def _open_log(path: Path) -> IO[bytes]:
    """``path`` open for reading, once its fd shows a regular file: a FIFO planted at
    the path (where a rotation left the daemon's log alone, SPEC R6) would otherwise
    hold the command until someone wrote to it."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise OSError(f"{path} is not a regular file, so not an audit log")
    os.set_blocking(fd, True)
    return handle


def _follow(path: Path, stop: Callable[[], bool]) -> Iterator[str]:
    """Every whole line of ``path`` and what is appended later, across rotations."""
    handle: IO[bytes] | None = None
    inode = None
    partial = b""
    try:
        while True:
            if handle is None:
                try:
                    handle = _open_log(path)
                    inode = os.fstat(handle.fileno()).st_ino
                except FileNotFoundError:
                    handle = None
            if handle is not None:
                chunk = handle.read()
                if chunk:
                    partial += chunk
                    *whole, partial = partial.split(b"\n")
                    yield from _decoded(whole)
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
    """Print the log's records (of one session), one line each and nothing a terminal
    acts on (SPEC R7); with ``follow``, go on until ``stop()`` says so or the user
    interrupts. The number of records printed."""
    if follow:
        lines: Iterator[str] = _follow(path, stop)
    else:
        try:
            handle = _open_log(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"no audit log at {path}") from None
        with handle:
            lines = _decoded(handle.read().split(b"\n"))
    printed = 0
    try:
        for record in _records(lines, session):
            out(json_line(record) if raw else format_line(record))
            printed += 1
    except KeyboardInterrupt:
        pass
    return printed
