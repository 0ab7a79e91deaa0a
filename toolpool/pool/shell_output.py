"""A background shell's output: its pipe copied to ``shells/<id>.log`` by one reader
thread per shell (``pump``), up to the call's ``spill_bytes`` and a truncation note
(``OutputFile``)."""

from __future__ import annotations

import codecs
import os
import select
import threading
from pathlib import Path


class OutputFile:
    """A shell's output file: text as it comes, up to ``limit`` bytes and a note.
    ``written`` (what a reader may read) moves only after the bytes are in the file."""

    def __init__(self, path: Path, limit: int) -> None:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        self.path = path
        self._fd = os.open(path, flags, 0o600)  # only the daemon's user reads it (X8)
        self._limit = limit
        self._kept = 0
        self.written = 0
        self.truncated = False

    def add(self, text: str) -> None:
        if self.truncated or not text:
            return
        data = text.encode("utf-8", errors="replace")
        room = self._limit - self._kept
        if len(data) > room:
            # Cut at a character's start: the file stays UTF-8 at every offset given.
            data = data[:room].decode("utf-8", errors="ignore").encode()
            self.truncated = True
        self._write(data)
        self._kept += len(data)
        if self.truncated:
            self._write(f"\n[output truncated at {self._limit} bytes: spill_bytes]\n".encode())
        self.written = os.lseek(self._fd, 0, os.SEEK_CUR)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def head(self, size: int) -> str:
        with open(self.path, "rb") as f:
            return f.read(size).decode(errors="replace")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def pump(fd: int, output: OutputFile, stop: threading.Event) -> None:
    """Copy the command's output to its file until EOF or ``stop``; close the pipe."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    try:
        while not stop.is_set():
            if not select.select([fd], [], [], 0.1)[0]:
                continue
            try:
                data = os.read(fd, 65536)
            except OSError:
                break
            if not data:
                break
            output.add(decoder.decode(data))
        output.add(decoder.decode(b"", final=True))
    finally:
        os.close(fd)
