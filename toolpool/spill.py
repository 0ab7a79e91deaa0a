"""Spill files: output kept whole on disk, up to a cap (SPEC X8, L4, L9), and the pipe
pump that fills them. One truncation rule for every spill file toolpool writes — a
foreground command's (``tools/support/command_output.py``), a background shell's
(``pool/shells.py``) and a cut result's (``engine/budget.py``):

- the file holds bytes as they came, at most ``limit`` of them, then the note
  ``[output truncated at N bytes: spill_bytes]``, and nothing after;
- the cut at the cap falls before a UTF-8 character it would split, and ``written``
  (the end a reader may be offered) only ever moves to a whole character's end: an
  incomplete last character waits for its rest (at most 3 bytes). Bytes that are not
  UTF-8 at all end nothing: they are left for the reader to replace;
- bytes past the cap are not decoded, not kept, not written (``pump`` drains them
  slowly where nothing else wants them: see there).

Only the owner reads a spill file (mode 0600, opened ``O_EXCL | O_NOFOLLOW``).
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

READ_BLOCK = 65536  # bytes one read takes from a pipe
DROP_PAUSE = 0.05  # past the cap: seconds between two drops (at most ~1.3 MB/s a pipe)
POLL = 0.1  # seconds between looks at ``stop`` while the pipe is quiet


def truncation_note(limit: int) -> bytes:
    """What a spill file ends with once ``limit`` bytes of output were kept."""
    return f"\n[output truncated at {limit} bytes: spill_bytes]\n".encode()


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


class SpillFile:
    """A spill file: output bytes as they come (``add``), up to ``limit`` bytes and
    the truncation note. ``written`` moves only once bytes are in the file, and only
    to the end of a whole character; ``kept`` counts the output's bytes in it (the
    note aside). ``lazy``: the file is made with the first bytes (no output, no
    file); ``dir_fd``: ``path``'s name is opened in that directory."""

    def __init__(
        self, path: Path, limit: int, *, lazy: bool = False, dir_fd: int | None = None
    ) -> None:
        self.path = path
        self._limit = limit
        self._dir_fd = dir_fd
        self._fd = -1
        self.kept = 0
        self.written = 0
        self.truncated = False
        self._held = b""  # an incomplete last character, waiting for its rest
        if not lazy:
            self._open()

    def _open(self) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        name = self.path if self._dir_fd is None else self.path.name
        self._fd = os.open(name, flags, 0o600, dir_fd=self._dir_fd)

    @property
    def dropping(self) -> bool:
        """Past the cap: what comes next is dropped unread (``pump``)."""
        return self.truncated

    def add(self, data: bytes) -> None:
        """Append what the output gave next."""
        if not self.truncated and data:
            self._append(self._held + data, final=False)

    def end(self) -> None:
        """The output is over: what was held back goes in as it is."""
        held, self._held = self._held, b""
        if held and not self.truncated:
            self._append(held, final=True)

    def _append(self, data: bytes, *, final: bool) -> None:
        room = self._limit - self.kept
        if len(data) > room:
            # Cut at a character's start: the file stays UTF-8 at every offset given.
            cut = utf8_boundary(data[:room])
            self._write(data[:cut])
            self.kept += cut
            self._held = b""
            self.truncated = True
            self._write(truncation_note(self._limit))
            return
        keep = len(data) if final else utf8_boundary(data)
        self._write(data[:keep])
        self.kept += keep
        self._held = data[keep:]

    def _write(self, data: bytes) -> None:
        if self._fd < 0:
            self._open()
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

    def __repr__(self) -> str:
        state = "truncated" if self.truncated else f"{self.kept}/{self._limit} bytes"
        return f"<SpillFile {self.path.name} {state}>"


def spill_text(path: Path, text: str, limit: int, *, dir_fd: int | None = None) -> None:
    """A spill file at ``path`` holding ``text`` (UTF-8; a lone surrogate replaced),
    cut by the rule above. Raises OSError as ``open`` and ``write`` do."""
    spill = SpillFile(path, limit, dir_fd=dir_fd)
    try:
        spill.add(text.encode("utf-8", errors="replace"))
        spill.end()
    finally:
        spill.close()


class Sink(Protocol):
    """What a pipe is pumped into: a ``SpillFile``, or what reads the output as it
    comes and spills it (bash's ``CommandOutput``)."""

    @property
    def dropping(self) -> bool:
        """Nothing wants the bytes any more (past a spill file's cap)."""
        ...

    def add(self, data: bytes) -> None: ...

    def end(self) -> None: ...


def pump(
    fd: int,
    sink: Sink,
    stop: threading.Event,
    *,
    poll: float = POLL,
    quiet: Callable[[], None] | None = None,
) -> None:
    """Copy the pipe ``fd`` into ``sink`` until EOF or ``stop``, calling ``quiet``
    (when given) each ``poll`` seconds without output. Once the sink is
    ``dropping``, the pipe stays open but is drained slowly, its bytes dropped
    unread: the writer is not killed (a closed pipe would end a dev server at its
    next log line with SIGPIPE, or break it with EPIPE), but one that writes faster
    waits on its writes, so a flood such as ``yes`` costs the reader next to
    nothing. Leaves ``fd`` open."""
    poller = select.poll()  # poll, not select: any descriptor number works
    poller.register(fd, select.POLLIN)  # POLLHUP and POLLERR come unasked
    wait = max(0, int(poll * 1000 + 0.999))
    while not stop.is_set():
        if not poller.poll(wait):
            if quiet is not None:
                quiet()
            continue
        try:
            data = os.read(fd, READ_BLOCK)
        except OSError:
            break
        if not data:
            break
        if sink.dropping:
            # Dropped unread. The pause bounds what a flood costs: a faster writer
            # blocks on the full pipe instead.
            stop.wait(DROP_PAUSE)
            continue
        sink.add(data)
    sink.end()
