"""Cancellation as a value: a token that says whether, and why, a call must stop."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where a token is awaited: a worker never loads asyncio for it
    import asyncio


class CancelSource(StrEnum):
    """Who asked a call to stop."""

    ABORT = "abort"  # S5: the whole run was cancelled
    INTERRUPT = "interrupt"  # S4: the user sent a new message (steering)
    SHUTDOWN = "shutdown"  # the daemon is stopping
    SIBLING = "sibling_failed"  # another call of the turn failed (on_error = cancel_siblings)


class Cancelled(BaseException):
    """Raised inside a running tool when its call is cancelled.

    A BaseException, like ``asyncio.CancelledError``, so that a tool's
    ``except Exception`` does not swallow it. It carries its source.
    """

    def __init__(self, source: CancelSource) -> None:
        super().__init__(f"cancelled by {source.value}")
        self.source = source


class CancelToken:
    """Set once, read from any thread, awaited from the event loop.

    The first ``cancel`` wins: its source is the one reported. Reading the source from
    another thread needs no lock (one attribute, set once), and a turn makes a token
    per call, so it holds no ``threading.Event`` (whose Condition and lock cost more
    than the rest of the token).
    """

    __slots__ = ("_callbacks", "_cause", "_event", "_source")

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None
        self._source: CancelSource | None = None
        self._cause: str | None = None
        self._callbacks: list[Callable[[CancelSource], None]] = []

    def cancel(self, source: CancelSource, cause: str | None = None) -> None:
        """Ask the call to stop. Call from the event loop's thread. ``cause``: the id
        of the call whose failure stopped this one (``SIBLING``)."""
        if self._source is not None:
            return
        self._source = source
        self._cause = cause
        if self._event is not None:
            self._event.set()
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(source)

    def on_cancel(self, callback: Callable[[CancelSource], None]) -> Callable[[], None]:
        """Call ``callback(source)`` when cancelled (at once if it already is); returns
        a function that takes the callback back. Cheaper than a task awaiting
        ``wait()`` where many calls are in flight."""
        if self._source is not None:
            callback(self._source)
            return lambda: None
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    @property
    def requested(self) -> bool:
        return self._source is not None

    @property
    def source(self) -> CancelSource | None:
        return self._source

    @property
    def cause(self) -> str | None:
        return self._cause

    async def wait(self) -> CancelSource:
        """Wait on the event loop until the token is cancelled; return its source."""
        if self._event is None:
            import asyncio

            self._event = asyncio.Event()
            if self._source is not None:
                self._event.set()
        await self._event.wait()
        assert self._source is not None
        return self._source

    def __repr__(self) -> str:
        state = f"cancelled by {self._source.value}" if self._source else "active"
        return f"<CancelToken {state}>"
