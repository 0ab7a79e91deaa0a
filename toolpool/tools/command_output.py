"""A foreground command's output as it arrives (bash): the spill file up to the call's
``spill_bytes`` (then a truncation note; SPEC X8), the head and tail the model gets,
and what came since the last report streamed as progress now and then. Decoded here,
in the worker that runs the call (its CPU is the call's).
"""

from __future__ import annotations

import codecs
import os
import threading
import time
from pathlib import Path
from typing import BinaryIO

from toolpool.sandbox import linux
from toolpool.tool import ToolContext
from toolpool.tools.head_tail import HeadAndTail

MAX_OUTPUT_CHARS = 30_000  # characters of a command's output the model gets
STREAM_INTERVAL = 0.1  # seconds between progress reports
STREAM_LIMIT = 1_000_000  # characters streamed as progress; the rest only in the spill file
_CHUNK = 65536


class CommandOutput:
    """The command's output as it arrives: to the spill file up to ``spill_limit``
    bytes (then a truncation note), the head and tail kept for the model, fresh text
    streamed as progress now and then."""

    def __init__(self, spill: Path, ctx: ToolContext, spill_limit: int) -> None:
        self.spill_path = spill
        self._spill: BinaryIO | None = None  # made with the first output: none, no file
        self._spill_limit = spill_limit
        self.spilled = 0  # bytes in the spill file, the note aside
        self.spill_truncated = False
        self._ctx = ctx
        self._kept = HeadAndTail(MAX_OUTPUT_CHARS)
        self._unsent: list[str] = []
        self._unsent_chars = 0
        self._streamed = 0
        self._last_sent = time.monotonic()
        self._lock = threading.Lock()

    def add(self, text: str) -> None:
        if not text:
            return
        with self._lock:
            if self._streamed + self._unsent_chars <= STREAM_LIMIT:
                # Past the streaming limit nothing more is kept to stream: a fast
                # writer must not pile up in memory between two reports.
                self._unsent.append(text)
                self._unsent_chars += len(text)
            self._write_spill(text)
            self._kept.add(text)
        self.stream()

    def _write_spill(self, text: str) -> None:
        if self.spill_truncated:
            return
        data = text.encode("utf-8", errors="replace")
        if self._spill is None:
            # Only the daemon's user may read it: another user must not see what ran (X8).
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self._spill = os.fdopen(os.open(self.spill_path, flags, 0o600), "wb")
        room = self._spill_limit - self.spilled
        if len(data) > room:
            data = data[:room]
            self.spill_truncated = True
        self._spill.write(data)
        self.spilled += len(data)
        if self.spill_truncated:
            note = f"\n[output truncated at {self._spill_limit} bytes: spill_bytes]\n"
            self._spill.write(note.encode())

    def stream(self, final: bool = False) -> None:
        """Send what arrived since the last report, at most every STREAM_INTERVAL."""
        with self._lock:
            now = time.monotonic()
            if not self._unsent or (not final and now - self._last_sent < STREAM_INTERVAL):
                return
            chunk = "".join(self._unsent)
            self._unsent.clear()
            self._unsent_chars = 0
            self._last_sent = now
            if self._streamed >= STREAM_LIMIT:
                return
            if self._streamed + len(chunk) > STREAM_LIMIT:
                chunk = chunk[: STREAM_LIMIT - self._streamed] + "\n[output streaming stopped]\n"
            self._streamed += len(chunk)
        if chunk:
            self._ctx.report_progress(chunk)

    def close(self) -> None:
        self.stream(final=True)
        if self._spill is not None:
            self._spill.close()

    @property
    def total_chars(self) -> int:
        return self._kept.total

    def text(self) -> tuple[str, bool]:
        """What the model sees, and whether it was cut."""
        with self._lock:
            return self._kept.text()


def read_output(fd: int, output: CommandOutput, stop: threading.Event) -> None:
    """Read the pipe until EOF, or until ``stop`` is set (the drain ran out)."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while not stop.is_set():
        if not linux.readable(fd, 0.05):
            output.stream()
            continue
        try:
            data = os.read(fd, _CHUNK)
        except OSError:
            break
        if not data:
            break
        output.add(decoder.decode(data))
    output.add(decoder.decode(b"", final=True))
