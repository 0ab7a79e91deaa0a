"""A foreground command's output as it arrives (bash): its bytes to a spill file up to
the call's ``spill_bytes`` (``toolpool.spill``: then a truncation note; SPEC X8), the
head and tail the model gets, and what came since the last report streamed as
progress now and then. Decoded here, in the worker that runs the call (its CPU is the
call's): the model's head and tail cover the whole output, the cap or not.
"""

from __future__ import annotations

import codecs
import threading
import time
from pathlib import Path

from toolpool.spill import SpillFile, pump
from toolpool.tool import ToolContext
from toolpool.tools.support.head_tail import HeadAndTail

MAX_OUTPUT_CHARS = 30_000  # characters of a command's output the model gets
STREAM_INTERVAL = 0.1  # seconds between progress reports
STREAM_LIMIT = 1_000_000  # characters streamed as progress; the rest only in the spill file
POLL = 0.05  # seconds between progress looks while the pipe is quiet


class CommandOutput:
    """The command's output as it arrives: to the spill file up to ``spill_limit``
    bytes (made with the first output: none, no file), the head and tail kept for
    the model, fresh text streamed as progress now and then. A ``spill.Sink``."""

    dropping = False  # the model's head and tail want every byte

    def __init__(self, spill: Path, ctx: ToolContext, spill_limit: int) -> None:
        self.spill = SpillFile(spill, spill_limit, lazy=True)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._ctx = ctx
        self._kept = HeadAndTail(MAX_OUTPUT_CHARS)
        self._unsent: list[str] = []
        self._unsent_chars = 0
        self._streamed = 0
        self._last_sent = time.monotonic()
        self._lock = threading.Lock()

    @property
    def spill_path(self) -> Path:
        return self.spill.path

    @property
    def spill_truncated(self) -> bool:
        return self.spill.truncated

    def add(self, data: bytes) -> None:
        """The pipe's next bytes."""
        self._add_text(self._decoder.decode(data), data)
        self.stream()

    def end(self) -> None:
        """The pipe is over: a character left incomplete is replaced."""
        self._add_text(self._decoder.decode(b"", final=True), b"")
        self.spill.end()
        self.stream()

    def _add_text(self, text: str, data: bytes) -> None:
        with self._lock:
            if data:
                self.spill.add(data)
            if not text:
                return
            if self._streamed + self._unsent_chars <= STREAM_LIMIT:
                # Past the streaming limit nothing more is kept to stream: a fast
                # writer must not pile up in memory between two reports.
                self._unsent.append(text)
                self._unsent_chars += len(text)
            self._kept.add(text)

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
        self.spill.close()

    @property
    def total_chars(self) -> int:
        return self._kept.total

    def text(self) -> tuple[str, bool]:
        """What the model sees, and whether it was cut."""
        with self._lock:
            return self._kept.text()


def read_output(fd: int, output: CommandOutput, stop: threading.Event) -> None:
    """Read the pipe until EOF, or until ``stop`` is set (the drain ran out)."""
    pump(fd, output, stop, poll=POLL, quiet=output.stream)
