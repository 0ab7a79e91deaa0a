"""A background shell's output: its pipe copied to ``shells/<id>.log`` as bytes, up to
the call's ``spill_bytes``, by one reader thread per shell (``pump``).

The daemon never decodes a shell's output: the file holds the bytes the command
wrote, and a reader (bash_output, in a worker) decodes the range it is given. Two
promises keep that range readable:

- ``OutputFile.written``, the end a read may get, never falls inside a UTF-8
  character: an incomplete last character waits for its rest (at most 3 bytes), and
  the cut at the cap falls before the character it would split;
- past the cap the file ends with a note, and nothing more is written.

Past the cap the reader keeps the pipe open but drains it slowly, dropping what it
reads (``DROP_BLOCK`` at a time, a pause between): the command is not killed (a
closed pipe would kill a dev server at its next log line with SIGPIPE, or break it
with EPIPE), but one that writes faster than that waits on its writes, so a flood
such as ``yes`` costs the daemon next to nothing and its own cgroup no CPU while it
waits.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from toolpool.sandbox import linux

READ_BLOCK = 65536  # bytes one read takes from the pipe, before the cap
DROP_BLOCK = 65536  # past the cap: bytes read and dropped at a time (the pipe's size)
DROP_PAUSE = 0.05  # seconds between two drops: at most ~1.3 MB/s drained per shell
POLL = 0.1  # seconds between looks at ``stop`` while the pipe is quiet


def utf8_boundary(data: bytes) -> int:
    """The length of the longest prefix of ``data`` that does not end inside a UTF-8
    character: ``len(data)`` unless its last character is incomplete (a lead byte
    whose continuation bytes have not all come). Bytes that are not UTF-8 at all end
    nothing: they are left for the reader to replace."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: the character started further back
        if 0xC0 <= byte < 0xE0:
            need = 2
        elif 0xE0 <= byte < 0xF0:
            need = 3
        elif 0xF0 <= byte < 0xF8:
            need = 4
        else:
            need = 1  # ASCII, or a byte no character starts with
        return n - back if need > back else n
    return n  # only continuation bytes: no character to wait for


class OutputFile:
    """A shell's output file: the command's bytes as they come, up to ``limit`` bytes
    and a note. ``written`` (what a reader may read) moves only once the bytes are in
    the file, and only to the end of a whole character."""

    def __init__(self, path: Path, limit: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.path = path
        self._fd = os.open(path, flags, 0o600)  # only the daemon's user reads it (X8)
        self._limit = limit
        self._kept = 0  # the command's bytes in the file, the note aside
        self._held = b""  # an incomplete last character, waiting for its rest
        self.written = 0
        self.truncated = False

    def add(self, data: bytes) -> None:
        """Append what the command wrote next."""
        if not self.truncated and data:
            self._append(self._held + data, final=False)

    def end(self) -> None:
        """The command's output is over: what was held back goes in as it is."""
        held, self._held = self._held, b""
        if held and not self.truncated:
            self._append(held, final=True)

    def _append(self, data: bytes, *, final: bool) -> None:
        room = self._limit - self._kept
        if len(data) > room:
            # Cut at a character's start: the file stays UTF-8 at every offset given.
            cut = utf8_boundary(data[:room])
            self._write(data[:cut])
            self._kept += cut
            self._held = b""
            self.truncated = True
            self._write(f"\n[output truncated at {self._limit} bytes: spill_bytes]\n".encode())
            return
        keep = len(data) if final else utf8_boundary(data)
        self._write(data[:keep])
        self._kept += keep
        self._held = data[keep:]

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]
        self.written += len(data)

    def head(self, size: int) -> str:
        """The first ``size`` bytes, decoded (what a failed sandbox said)."""
        with open(self.path, "rb") as f:
            return f.read(size).decode(errors="replace")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def pump(fd: int, output: OutputFile, stop: threading.Event) -> None:
    """(The shell's reader thread.) Copy the pipe ``fd`` to ``output`` until EOF or
    ``stop``; past the cap, drop what comes, slowly (see the module). Closes ``fd``."""
    try:
        while not stop.is_set():
            if not linux.readable(fd, POLL):
                continue
            try:
                data = os.read(fd, DROP_BLOCK if output.truncated else READ_BLOCK)
            except OSError:
                break
            if not data:
                break
            if output.truncated:
                # Dropped unread. The pause bounds what a flood costs the daemon: a
                # faster writer blocks on the full pipe instead.
                stop.wait(DROP_PAUSE)
                continue
            output.add(data)
        output.end()
    finally:
        os.close(fd)
