"""What a tool prints while it runs in a worker, and the limit it may meet doing so."""

from __future__ import annotations

import io
from typing import Any


class LimitExceeded(BaseException):
    """Raised in a tool that spent its CPU allowance or printed past its output limit."""


class PrintedOutput(io.TextIOBase):
    """What a tool prints: forwarded as progress, line by line, and counted against
    the call's output limit."""

    def __init__(self, forward: Any, limit: int) -> None:
        self._forward = forward
        self._limit = limit
        self._size = 0
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self._size += len(text)
        if self._size > self._limit:
            raise LimitExceeded(f"printed more than the output limit of {self._limit} bytes")
        self._pending += text
        if "\n" in self._pending:
            complete, _, self._pending = self._pending.rpartition("\n")
            self._forward(complete + "\n")
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._forward(self._pending)
            self._pending = ""
