"""Long command output as the model sees it: its head and its tail, each up to half
of a limit, and how much was left out between them (bash, bash_output)."""

from __future__ import annotations

from collections import deque


class HeadAndTail:
    """Text added piece by piece; ``text()`` is all of it when it fits ``limit``
    characters, else its first and last ``limit // 2`` around a marker."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0  # characters added
        self._head: list[str] = []
        self._head_chars = 0
        self._tail: deque[str] = deque()
        self._tail_chars = 0

    def add(self, text: str) -> None:
        self.total += len(text)
        half = self.limit // 2
        if self._head_chars < half:
            take = text[: half - self._head_chars]
            self._head.append(take)
            self._head_chars += len(take)
            text = text[len(take) :]
        if text:
            self._tail.append(text)
            self._tail_chars += len(text)
            while self._tail and self._tail_chars - len(self._tail[0]) >= half:
                self._tail_chars -= len(self._tail.popleft())

    def text(self) -> tuple[str, bool]:
        """What the model sees, and whether it was cut."""
        head = "".join(self._head)
        if self.total <= self.limit:
            return head + "".join(self._tail), False
        tail = "".join(self._tail)[-(self.limit // 2) :]
        left_out = self.total - len(head) - len(tail)
        return f"{head}\n\n... [{left_out} characters left out] ...\n\n{tail}", True
